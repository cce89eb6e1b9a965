"""The console script end to end, as a user runs it (a subprocess, the embedded default)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

FIXTURES = Path(__file__).with_name("fixtures")


def awm(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AWM_HOME=str(home))
    env.pop("AWM_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "awm.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def home(pg) -> Path:
    return pg.root.parent  # the session's embedded cluster: already initialised and running


def test_catalog_list_and_show(home):
    listing = awm("catalog", "list", home=home)
    assert listing.returncode == 0, listing.stderr
    for name in ("bike_shop", "crm", "project_tracker"):
        assert name in listing.stdout
    show = awm("catalog", "show", "bike_shop", "--json", home=home)
    assert json.loads(show.stdout)["scenario"]["name"] == "bike_shop"
    missing = awm("catalog", "show", "no_such_env", home=home)
    assert missing.returncode == 2 and "not in the catalog" in missing.stderr


def test_catalog_select_keeps_believable_tasks_in_environments_with_enough_of_them(home, tmp_path):
    """`awm catalog select` (issue 44: the paper's training subset): tasks whose verifier says
    complete on the untouched snapshot or whose gates did not pass are left out, environments
    with too few tasks left too, then a seeded choice of environments and tasks; selection.json
    records the filters, the reasons and every choice, and the same seed chooses the same."""
    from awm import catalog
    from awm.selection import Filters, select

    starter = catalog.load("starter")
    # a task whose verifier says complete on the untouched snapshot (its negative gate failed)
    bike = starter[0]
    broken = bike.tasks[0]
    record = broken.gates[-1].model_copy(update={"negative": broken.gates[-1].negative.model_copy(update={"passed": False, "verdict": "complete"})})
    bike = bike.model_copy(update={"tasks": [broken.model_copy(update={"gates": [record]}), *bike.tasks[1:]]})
    # an environment whose tasks never ran their gates
    crm = starter[1].model_copy(update={"tasks": [t.model_copy(update={"gates": []}) for t in starter[1].tasks]})
    bundles = [bike, crm, starter[2]]
    chosen = select(bundles, Filters(min_tasks=2))
    assert [b.name for b in chosen.bundles] == [bike.name, starter[2].name]
    assert broken.id not in {t.id for t in chosen.bundles[0].tasks} and len(chosen.bundles[0].tasks) == len(bike.tasks) - 1
    assert chosen.dropped_tasks["verifier says complete on the untouched snapshot"] == 1
    assert chosen.dropped_tasks["gates: no gate record for its code verifier"] == len(crm.tasks)
    assert chosen.dropped_envs == {"fewer than 2 tasks left": 1}
    capped = select(bundles, Filters(max_tasks=3, envs=1, seed=5))
    assert len(capped.bundles) == 1 and len(capped.bundles[0].tasks) == 3
    assert [t.id for t in select(bundles, Filters(max_tasks=3, envs=1, seed=5)).bundles[0].tasks] == \
        [t.id for t in capped.bundles[0].tasks]  # seeded
    assert select(bundles, Filters(gates=False, min_tasks=2)).bundles[1].name == crm.name  # gates not required

    out = tmp_path / "selected"
    r = awm("catalog", "select", "starter", "--out", str(out), "--max-tasks", "4", "--envs", "2", "--seed", "1", home=home)
    assert r.returncode == 0, r.stderr
    record = json.loads((out / "selection.json").read_text())
    assert record["environments"] == 2 and record["tasks"] == 8 and record["filters"]["seed"] == 1
    loaded = catalog.load(out)
    assert {b.name: [t.id for t in b.tasks] for b in loaded} == record["chosen"]
    assert record["dropped_environments"] == {"over envs": 1}
    from examples.paper.campaign import environments  # the kit's Campaign reads the selection's environments

    assert environments(out / "selection.json") == sorted(record["chosen"])
    none = awm("catalog", "select", "starter", "--out", str(tmp_path / "none"), "--min-tasks", "100", home=home)
    assert none.returncode == 2 and "no environment left" in none.stderr


def test_catalog_split_holds_out_whole_environments_reproducibly(home, tmp_path):
    """`awm catalog split`: train/ and test/ are catalogs of whole environments (disjoint, all of
    them), the same seed gives the same split, split.json records it; bad fractions are refused."""
    from awm import catalog

    names = [f"env_{i:03d}" for i in range(100)]
    train, test = catalog.split(names, 0.1, seed=7)
    assert len(test) == 10 and len(train) == 90 and not set(train) & set(test) and set(train) | set(test) == set(names)
    assert catalog.split(list(reversed(names)), 0.1, seed=7) == (train, test)  # order of listing does not matter
    assert catalog.split(names, 0.1, seed=8)[1] != test
    assert catalog.split(names, 0.0)[1] == [] and len(catalog.split(names, 0.001)[1]) == 1
    assert len(catalog.split(names, test_count=3)[1]) == 3
    for bad in ({"test_fraction": 1.0}, {"test_fraction": -0.1}, {"test_count": 100}):
        with pytest.raises(catalog.CatalogError):
            catalog.split(names, **bad)

    out = tmp_path / "split"
    r = awm("catalog", "split", "starter", "--out", str(out), "--test-count", "1", "--seed", "3", home=home)
    assert r.returncode == 0, r.stderr
    record = json.loads((out / "split.json").read_text())
    starter = {b.name for b in catalog.load("starter")}
    assert set(record["train"]) | set(record["test"]) == starter and len(record["test"]) == 1
    assert {b.name for b in catalog.load(out / "test")} == set(record["test"])
    assert {b.name for b in catalog.load(out / "train")} == set(record["train"])
    assert json.loads((out / "test" / "index.json").read_text())["environments"][0]["name"] == record["test"][0]
    again = awm("catalog", "split", "starter", "--out", str(tmp_path / "again"), "--test-count", "1", "--seed", "3",
                home=home)
    assert again.returncode == 0 and json.loads((tmp_path / "again" / "split.json").read_text()) == record
    bad = awm("catalog", "split", "starter", "--out", str(tmp_path / "bad"), "--test", "1.5", home=home)
    assert bad.returncode == 2 and "test fraction" in bad.stderr


@pytest.mark.slow
def test_demo_json_on_a_fixture_catalog(home, tmp_path):
    result = awm("demo", "--json", "--catalog", str(FIXTURES / "notes"), home=home)
    data = json.loads(result.stdout)
    env = data["environments"][0]
    assert set(env) >= {"name", "tools", "tasks", "passed", "reset_p50_ms", "tool_call_p50_ms"}
    # Only the tasks that passed both gates (gates.json) are run; the hostile ones are skipped.
    assert env["name"] == "notes" and env["tasks"] == 3 and env["passed"] == 3
    assert data["totals"]["ungated_skipped"] == 6 and result.returncode == 0
    ungated = awm("demo", "--json", "--allow-ungated", "--catalog", str(FIXTURES / "notes"), home=home)
    env = json.loads(ungated.stdout)["environments"][0]
    assert env["tasks"] == 9 and env["passed"] == 3
    assert ungated.returncode == 1  # the fixture's deliberately broken verifiers fail


def test_env_check_against_a_dead_url_is_a_clear_error(home):
    result = awm("env", "check", "http://127.0.0.1:9/mcp", "--timeout", "2", home=home)
    assert result.returncode == 1 and "error" in result.stderr.lower()


def test_serve_prints_urls_serves_and_cleans_up(home, admin_dsn):
    import signal

    from awm.postgres import provision

    env = dict(os.environ, AWM_HOME=str(home))
    env.pop("AWM_DATABASE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "serve", "--json", "-n", "2",
                             "--catalog", str(FIXTURES / "notes")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        lines = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert {line["env"] for line in lines} == {"notes"} and len({line["mcp_url"] for line in lines}) == 2
        check = awm("env", "check", lines[0]["mcp_url"], home=home)
        assert check.returncode == 0 and "add_note" in check.stdout and "9 tools" in check.stdout
        added = awm("env", "call", lines[0]["mcp_url"], "add_note", '{"title": "from the CLI"}', home=home)
        assert added.returncode == 0 and "from the CLI" in added.stdout, added.stderr
        found = awm("env", "call", lines[0]["mcp_url"], "find_note", '{"title": "no such note"}', home=home)
        assert found.returncode == 1  # the tool's own error, reported as such
        bad = awm("env", "call", lines[0]["mcp_url"], "add_note", "{title:", home=home)
        assert bad.returncode == 2 and "not JSON" in bad.stderr
        # Late binding (the default): each instance's database comes from the fleet's provisioner.
        databases = {httpx.get(line["control_url"] + "/info").json()["database"] for line in lines}
        assert len(databases) == 2 and databases <= set(provision.list_instances(admin_dsn))
        assert all(line["late_binding"] and line["catalog"] == ["notes"] for line in lines)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()
    assert not databases & set(provision.list_instances(admin_dsn))


def test_external_database_url_is_used_instead_of_the_embedded_server(admin_dsn, tmp_path):
    """With AWM_DATABASE_URL set, nothing is started under AWM_HOME."""
    empty_home = tmp_path / "home"
    env = dict(os.environ, AWM_HOME=str(empty_home), AWM_DATABASE_URL=admin_dsn)
    result = subprocess.run([sys.executable, "-m", "awm.cli", "demo", "--json", "--catalog", str(FIXTURES / "notes")],
                            capture_output=True, text=True, env=env, timeout=300)
    assert json.loads(result.stdout)["totals"]["passed"] == 3
    assert not (empty_home / "postgres").exists()
