"""The generated catalog for scale tests (awm/synth/varied.py): environments that differ, are
deterministic, are cached by content, and whose tasks pass both gates when served for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from awm import catalog
from awm.demo import run_catalog
from awm.fleet import Database
from awm.synth import varied


def test_the_generator_is_deterministic_and_the_seed_matters():
    assert varied.environment(7, seed=3).model_dump_json() == varied.environment(7, seed=3).model_dump_json()
    assert varied.environment(7, seed=3).database_hash() != varied.environment(7, seed=4).database_hash()


def test_environments_differ_in_schema_tools_and_tasks():
    bundles = [varied.environment(i) for i in range(60)]
    described = [varied.describe(b) for b in bundles]
    assert len({b.name for b in bundles}) == 60
    assert len({b.database_hash() for b in bundles}) == 60
    assert len({b.database.ddl for b in bundles}) == 60
    assert len({tuple(sorted(t.name for t in b.tools)) for b in bundles}) == 60
    assert len({d["tables"] for d in described}) >= 5
    assert len({k for d in described for k in d["column_types"]}) >= 10
    assert len({d["tools"] for d in described}) >= 15
    assert {d["size"] for d in described} >= {"small", "medium"}
    kinds = {t.id.split("_")[0] for b in bundles for t in b.tasks}
    assert kinds >= {"update", "create", "delete", "count", "total", "lookup", "link"}
    assert "REFERENCES" in "".join(b.database.ddl for b in bundles)
    assert any("PRIMARY KEY (" in b.database.ddl for b in bundles)  # a link table with a composite key


def test_every_tool_and_verifier_compiles():
    for bundle in (varied.environment(i) for i in range(60)):
        for tool in bundle.tools:
            compile(bundle.tool_prelude + "\n\n" + tool.code, f"{bundle.name}.{tool.name}", "exec")
        for task in bundle.tasks:
            compile(bundle.verifier_prelude + "\n\n" + task.verifier.code, f"{bundle.name}.{task.id}", "exec")


def test_the_catalog_is_cached_by_content(tmp_path, monkeypatch):
    monkeypatch.setenv("AWM_CATALOG_CACHE", str(tmp_path))
    first = varied.cached_catalog(count=5, seed=1)
    record = first / varied.BUILD_RECORD
    stamp = record.stat().st_mtime_ns
    assert varied.cached_catalog(count=5, seed=1) == first and record.stat().st_mtime_ns == stamp  # not rebuilt
    assert varied.cached_catalog(count=5, seed=2) != first
    assert first.name.endswith(varied.catalog_key(5, 1))
    bundles = catalog.load(first)  # the project's loader: every file is a valid bundle
    assert sorted(b.name for b in bundles) == sorted(varied.environment(i, 1).name for i in range(5))
    index = json.loads((first / catalog.INDEX).read_text())
    assert len(index["environments"]) == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".build-")]  # no half-built leftovers


def test_a_bad_count_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="count"):
        varied.write_catalog(tmp_path, 0)


def test_the_command_line_writes_a_catalog(tmp_path: Path, capsys):
    assert varied.main(["--count", "3", "--out", str(tmp_path / "c"), "--path-only"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "c")
    assert len(catalog.load(tmp_path / "c")) == 3
    with pytest.raises(SystemExit):
        varied.main(["--count", "0"])


def _covering(bundles, n: int):
    """``n`` environments that together have as many task kinds as possible (and a medium one)."""
    chosen, covered = [], set()
    pool = list(bundles)
    medium = [b for b in pool if varied.describe(b)["size"] != "small"]
    if medium:
        chosen.append(medium[0])
        covered |= {t.id.split("_")[0] for t in medium[0].tasks}
        pool.remove(medium[0])
    while len(chosen) < n:
        best = max(pool, key=lambda b: len({t.id.split("_")[0] for t in b.tasks} - covered))
        chosen.append(best)
        covered |= {t.id.split("_")[0] for t in best.tasks}
        pool.remove(best)
    return chosen, covered


@pytest.mark.slow
async def test_served_environments_pass_both_gates(admin_dsn, tmp_path, monkeypatch):
    """A 20-environment catalog from the cache; three of its environments served for real (env
    server, confined workers, MCP over HTTP): every task's verifier says not complete on the
    snapshot and complete after the reference solution."""
    monkeypatch.setenv("AWM_CATALOG_CACHE", str(tmp_path))
    bundles = catalog.load(varied.cached_catalog(count=20, seed=0))
    served, kinds = _covering(bundles, 3)
    assert len(kinds) >= 5, kinds
    monkeypatch.setattr(Database, "open", classmethod(lambda cls, url=None: Database(admin_dsn)))
    results, totals = await run_catalog(served, show_progress=False, negative_gate=True, allow_ungated=True)
    problems = []
    for r, b in zip(results, served):
        assert r.served_tools == sorted(t.name for t in b.tools)
        problems += [f"{r.name}/{e.task_id} untouched: {e.verdict}: {e.reason}" for e in r.negatives if not e.ok]
        problems += [f"{r.name}/{e.task_id} solution: {e.verdict}: {e.reason}" for e in r.episodes if not e.ok]
    assert not problems, "\n".join(problems)
    assert totals["passed"] == totals["tasks"] == sum(len(b.tasks) for b in served) >= 6


@pytest.mark.slow
def test_awm_serve_two_instances_serve_the_whole_1000_environment_catalog(admin_dsn, tmp_path):
    """Late binding end to end over the 1,000 distinct environments (the cached build): `awm serve
    --instances 2` starts two env servers (templates only of the two they start on), and claims of
    six environments spread over the catalog switch them; every episode replays its reference
    solution to `complete` on the switched instance."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    from awm.episode.sources import PoolSource
    from awm.gates import replay

    root = varied.cached_catalog(count=1000, seed=0)
    env = dict(os.environ, AWM_DATABASE_URL=admin_dsn, AWM_HOME=str(tmp_path))
    errors = (tmp_path / "serve.err").open("w")  # a line per ungated environment: more than a pipe holds
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "serve", "--instances", "2", "--catalog", str(root),
                             "--allow-ungated", "--json"], stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    lines = tmp_path / "serve.jsonl"
    try:
        lines.write_text("".join(proc.stdout.readline() for _ in range(2)))
        source = PoolSource.from_json_lines(lines)
        assert source.late and len(source.envs()) == 1000 and source.size == 2

        async def episodes() -> list[str]:
            verdicts = []
            for name in source.envs()[::167]:  # six, from the whole catalog
                bundle = catalog.find(root, name)
                lease = await source.claim(name)
                report = await replay(name, bundle.tasks[0], lease.handle.mcp, lease.handle.control)
                verdicts.append(f"{name}: {report.verdict} {report.reason or ''}".strip())
                await source.release(lease)
            await source.close()
            return verdicts

        verdicts = asyncio.run(episodes())
        assert all(": complete" in v for v in verdicts) and len(verdicts) == 6, verdicts
        assert source.switches >= 4
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    errors.close()
    assert proc.returncode == 0, (tmp_path / "serve.err").read_text()[-2000:]
