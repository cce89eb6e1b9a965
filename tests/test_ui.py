"""`awm ui`'s server side: the episode index (paging, filters, incremental refresh, rebuild), the
JSON API over a run, the catalog, and the fleet view and playground against a real instance (the
notes fixture on the session's Postgres). The browser tests are in test_ui_browser.py."""

import json

import httpx
import pytest
from starlette.testclient import TestClient

from awm.trainer.trajectory import Trajectory, TrajectoryLog, Turn
from awm.ui.app import UiState, build_app
from awm.ui.fleet import FleetView, Instance, quantile
from awm.ui.index import EpisodeFilter, EpisodeIndex, scan_page
from awm.ui.runs import Runs, run_id


def trajectory(n: int) -> Trajectory:
    """A varied but deterministic episode: env, task, verdict, reward, an error class now and then."""
    env = ["crm", "lamps"][n % 2]
    errored = n % 5 == 0
    result = {"tool_call_id": "c0", "name": "t", "is_error": errored,
              "error_kind": ("tool_crashed" if n % 10 == 0 else "tool_error") if errored else None, "text": "x", "ms": 1.0}
    turn = Turn(0, {"role": "assistant", "content": ""}, [{"id": "c0", "name": "t", "arguments": {}}], [result],
                "native", 1.0, 1.0, 0)
    complete = n % 3 == 0
    return Trajectory(f"ep{n:06d}", env, f"task{n % 4}", "do it", "p", group_id=f"g{n // 4}", turns=[turn],
                      verdict={"verdict": "complete" if complete else "incomplete"}, reward=1.0 if complete else 0.0,
                      masked=n % 10 == 0, mask_reason="tool_crashed" if n % 10 == 0 else None)


def write_run(path, episodes: int, start: int = 0, steps: bool = True) -> None:
    log = TrajectoryLog(path / "trajectories.jsonl")
    for n in range(start, start + episodes):
        t = trajectory(n)
        log.start(t)
        log.turn(t, t.turns[0])
        log.end(t)
        if steps and n % 8 == 7:  # a step trains on two groups of four
            log.write("step", {"step": n // 8 + 1, "version": n // 8 + 1, "groups": [f"g{n // 4 - 1}", f"g{n // 4}"]})
    log.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))  # where index files go
    return tmp_path / "home"


def test_index_pages_and_filters_like_a_full_scan(tmp_path, home):
    write_run(tmp_path, 200)
    log = tmp_path / "trajectories.jsonl"
    index = EpisodeIndex(log)
    assert index.refresh() == 200 and index.refresh() == 0
    assert index.path.is_relative_to(home)  # not in the run directory
    filters = [EpisodeFilter(), EpisodeFilter(env="crm"), EpisodeFilter(verdict="complete", env="lamps"),
               EpisodeFilter(error_kind="tool_crashed"), EpisodeFilter(step=3), EpisodeFilter(masked=True),
               EpisodeFilter(min_reward=0.5), EpisodeFilter(search="task3"), EpisodeFilter(error_kind="tool_error", step=2)]
    for where in filters:
        for offset, limit in ((0, 7), (5, 50), (190, 50)):
            assert index.page(where, offset, limit) == scan_page(log, where, offset, limit), where
    total, rows = index.page(EpisodeFilter(step=3), 0, 100)
    assert total == 8 and {r["step"] for r in rows} == {3} and {r["group_id"] for r in rows} == {"g4", "g5"}
    assert index.page(EpisodeFilter(error_kind="tool_crashed"), 0, 1)[1][0]["error_kinds"] == ["tool_crashed"]
    facets = index.facets()
    assert facets["env"] == ["crm", "lamps"] and facets["error_kind"] == ["tool_crashed", "tool_error"]
    assert facets["step"] == list(range(1, 26))
    record = index.episode("ep000042")
    assert record["episode_id"] == "ep000042" and record["turns"][0]["tool_calls"][0]["name"] == "t"
    assert record["step"] == 6 and index.episode("nope") is None
    index.close()


def test_index_follows_a_growing_log_and_rebuilds_a_replaced_one(tmp_path, home):
    log = tmp_path / "trajectories.jsonl"
    write_run(tmp_path, 10, steps=False)
    index = EpisodeIndex(log)
    assert index.refresh() == 10
    with log.open("a") as f:  # a line still being written is left for the next refresh
        f.write('{"event": "end", "episode_id": "half')
    assert index.refresh() == 0
    with log.open("a") as f:
        f.write('", "env": "crm", "task_id": "x", "turns": []}\n')
    assert index.refresh() == 1 and index.episode("half")["env"] == "crm"
    write_run(tmp_path, 5, start=100, steps=False)  # appended: only the new episodes are scanned
    assert index.refresh() == 5 and index.page(EpisodeFilter(), 0, 1)[0] == 16
    log.unlink()  # replaced by a shorter log: indexed again from the start
    write_run(tmp_path, 3, start=500, steps=False)
    assert index.refresh() == 3
    assert [r["episode_id"] for r in index.page(EpisodeFilter(), 0, 10)[1]] == ["ep000500", "ep000501", "ep000502"]
    index.close()
    # another process's index file of an older layout is rebuilt, not misread
    import sqlite3
    with sqlite3.connect(index.path) as db:
        db.execute("UPDATE meta SET value = '0' WHERE key = 'schema'")
    again = EpisodeIndex(log)
    assert again.page(EpisodeFilter(), 0, 1)[0] == 0 and again.refresh() == 3
    again.close()


def test_run_api(tmp_path, home):
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    write_run(run, 40)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": s / 10, "success_rate": s / 10,
                                                            "staleness": [0, 1], "rollouts_per_s": 3.0}) + "\n"
                                               for s in (1, 2, 3)) + '{"step": 4, "rew')  # cut by a crash
    evaluated = tmp_path / "runs" / "eval"
    evaluated.mkdir()
    (evaluated / "eval.json").write_text(json.dumps({"k": 2, "environments": [], "overall": {"pass@1": 0.5}}))
    state = UiState(Runs([tmp_path / "runs"]))
    with TestClient(build_app(state)) as client:
        runs = {r["name"]: r for r in client.get("/api/runs").json()}
        assert runs["tiny"]["kind"] == "train" and runs["tiny"]["steps"] == 3 and runs["tiny"]["last_reward"] == 0.3
        assert runs["eval"]["kind"] == "eval" and runs["tiny"]["id"] == run_id(run)
        # a run without trajectories (yet) has no episodes; an unknown run is not found
        assert client.get(f"/api/runs/{run_id(evaluated)}/episodes").json()["total"] == 0
        assert client.get("/api/runs/000000000000/episodes").status_code == 404
        summary = client.get(f"/api/runs/{run_id(run)}").json()
        assert [m["step"] for m in summary["metrics"]] == [1, 2, 3] and summary["episodes"] == 40
        assert {e["env"]: e["episodes"] for e in summary["per_env"]} == {"crm": 20, "lamps": 20}
        page = client.get(f"/api/runs/{run_id(run)}/episodes", params={"env": "lamps", "limit": 5, "offset": 5}).json()
        assert page["total"] == 20 and len(page["episodes"]) == 5 and page["episodes"][0]["episode_id"] == "ep000011"
        assert client.get(f"/api/runs/{run_id(run)}/episodes", params={"step": "x"}).status_code == 400
        assert client.get(f"/api/runs/{run_id(run)}/episodes/ep000003").json()["task_id"] == "task3"
        # Python's json writes NaN and -Infinity, which a browser's JSON.parse refuses: null instead
        with (run / "trajectories.jsonl").open("a") as f:
            f.write(json.dumps({"event": "end", "episode_id": "nan", "env": "crm", "task_id": "t", "reward": float("nan"),
                                "turns": [{"logprobs": [-0.5, float("-inf")]}]}) + "\n")
        odd = client.get(f"/api/runs/{run_id(run)}/episodes/nan")
        assert odd.status_code == 200 and '"reward":null' in odd.text and odd.json()["turns"][0]["logprobs"] == [-0.5, None]
        assert client.get(f"/api/runs/{run_id(run)}/episodes/nope").status_code == 404
        assert client.get("/api/runs/000000000000").status_code == 404
        assert client.get("/").headers["content-type"].startswith("text/html")
        assert client.get("/static/app.js").headers["content-type"] in ("text/javascript; charset=utf-8",
                                                                         "application/javascript")


def test_catalog_api_shows_tables_tools_and_gates(home):
    with TestClient(build_app(UiState(Runs([]), catalog="starter"))) as client:
        data = client.get("/api/catalog").json()
    crm = next(e for e in data["environments"] if e["name"] == "crm")
    assert {e["name"] for e in data["environments"]} == {"bike_shop", "crm", "project_tracker"} and not data["broken"]
    contacts = next(t for t in crm["tables"] if t["name"] == "contacts")
    assert contacts["rows"] > 0 and "id" in [c["name"] for c in contacts["columns"]]
    assert all(t["input_schema"]["type"] == "object" and t["description"] for t in crm["tools"])
    task = crm["tasks"][0]
    assert task["gated"] is True and task["verifier_kind"] == "code" and task["gate_reason"] == "passed"
    assert task["gates"][0]["negative"]["passed"] and task["gates"][0]["positive"]["passed"]


def test_quantile_interpolates_like_prometheus():
    buckets = {0.001: 0.0, 0.01: 50.0, 0.1: 100.0, float("inf"): 100.0}
    assert quantile(buckets, 0.5) == pytest.approx(0.01)
    assert quantile(buckets, 0.25) == pytest.approx(0.001 + 0.009 * 0.5)
    assert quantile(buckets, 0.99) == pytest.approx(0.01 + 0.09 * 0.98)
    assert quantile({float("inf"): 0.0}, 0.5) is None


async def test_fleet_view_and_playground_on_a_real_instance(notes, home):
    # given by URL only (awm ui --instance): the instance names itself and its environment
    view = FleetView([Instance(env="?", name="by-url", mcp_url=notes.mcp_url, control_url=notes.control_url),
                      Instance(env="notes", name="gone", mcp_url="http://127.0.0.1:9/mcp",
                               control_url="http://127.0.0.1:9")])
    state = UiState(Runs([]), fleet=view)
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://ui") as client:
        first = (await client.get("/api/fleet")).json()
        states = {i["name"]: i["state"] for i in first["instances"]}
        assert states == {notes.name: "ready", "gone": "down"}
        opened = (await client.post(f"/api/playground/{notes.name}/open")).json()
        add = next(t for t in opened["tools"] if t["name"] == "add_note")
        assert add["inputSchema"]["required"] == ["title"] and "add_note" in [t["id"] for t in opened["tasks"]]
        reset = (await client.post(f"/api/playground/{notes.name}/reset", json={"task_id": "add_note"})).json()
        assert reset["instruction"].startswith("Add a note")
        call = (await client.post(f"/api/playground/{notes.name}/call",
                                  json={"tool": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs",
                                                                      "tags": ["a"]}})).json()
        assert not call["is_error"] and [r["title"] for r in call["diff"]["notes"]["inserted"]] == ["groceries"]
        assert call["diff"]["tags"]["inserted"] == [{"note_id": 5, "tag": "a"}]
        bad = (await client.post(f"/api/playground/{notes.name}/call", json={"tool": "add_note", "arguments": {}})).json()
        assert bad["is_error"] and bad["error_kind"] == "invalid_arguments" and bad["diff"] == {}
        assert (await client.post(f"/api/playground/{notes.name}/call", json={"arguments": {}})).status_code == 400
        assert (await client.post("/api/playground/nobody/open")).status_code == 404
        verdict = (await client.post(f"/api/playground/{notes.name}/verify", json={})).json()
        assert verdict["verdict"]["verdict"] == "complete"
        assert verdict["diff"]["notes"] == {"inserted": 1, "updated": 0, "deleted": 0}
        second = (await client.get("/api/fleet")).json()
        mine = next(i for i in second["instances"] if i["name"] == notes.name)
        assert mine["holder"] == "playground" and mine["tool_calls"] >= first["instances"][0]["tool_calls"] + 2
        assert mine["tool_calls_per_s"] > 0 and mine["tool_p50_ms"] is not None
        (env,) = second["environments"]
        assert env["instances"] == 2 and env["states"] == {"ready": 1, "down": 1} and env["held"] == 1
        await client.post(f"/api/playground/{notes.name}/release")
        assert next(i for i in (await client.get("/api/fleet")).json()["instances"] if i["name"] == notes.name)["holder"] is None
    await state.close()


async def test_fleet_view_reads_the_operators_instances_and_claims(home):
    from awm_operator.api import bound_port, build_api, serve
    from awm_operator.config import OperatorConfig
    from awm_operator.reconcile import Context
    from tests.operator_fakes import operator_fleet

    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    runner = await serve(build_api(ctx, operator_fleet()), "127.0.0.1", 0)
    view = FleetView(operator_url=f"http://127.0.0.1:{bound_port(runner)}", fleets=["ns/f", "ns/missing"])
    try:
        (fleet, missing) = (await view.snapshot())["operator"]
    finally:
        await view.close()
        await runner.cleanup()
    assert (fleet["replicas"], fleet["ready"], fleet["allocated"], fleet["starting"]) == (3, 1, 1, 1)
    assert fleet["environments"] == {"bike_shop": {"starting": 1}, "crm": {"ready": 1, "allocated": 1}}
    assert [c["holder"] for c in fleet["claims"]] == ["campaign/c"]
    assert missing == {"fleet": "ns/missing", "error": "no such fleet"}


def test_the_cli_loads_no_ui_server_until_awm_ui_runs():
    """awm/cli.py registers `awm ui` the way it does the other upper layers: by name, imported
    when the command runs (awm.cli.LAZY_COMMANDS); the server stack loads only then."""
    import subprocess
    import sys

    code = ("import sys, awm.cli; print(sorted(m for m in sys.modules "
            "if m.startswith(('awm.ui.', 'starlette', 'uvicorn', 'selenium'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_a_big_runs_first_open_indexes_in_the_background(tmp_path, home, monkeypatch):
    """More log to index than a request should wait for: the summary answers at once with the
    metrics and the indexing progress, the list says it is indexing, and both are complete once
    the background refresh is done (here every run counts as big)."""
    import time

    import awm.ui.runs

    monkeypatch.setattr(awm.ui.runs, "SYNC_BYTES", 0)
    run = tmp_path / "runs" / "big"
    run.mkdir(parents=True)
    write_run(run, 300)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    with TestClient(build_app(UiState(Runs([tmp_path / "runs"])))) as client:
        first = client.get(f"/api/runs/{run_id(run)}").json()
        assert first["indexing"]["size"] == (run / "trajectories.jsonl").stat().st_size
        assert first["episodes"] is None and first["metrics"] == [{"step": 1, "reward_mean": 0.5}]
        deadline = time.monotonic() + 60
        while (summary := client.get(f"/api/runs/{run_id(run)}").json())["indexing"] is not None:
            assert time.monotonic() < deadline, "the background index never finished"
            time.sleep(0.05)
        assert summary["episodes"] == 300 and {e["env"] for e in summary["per_env"]} == {"crm", "lamps"}
        page = client.get(f"/api/runs/{run_id(run)}/episodes", params={"limit": 3}).json()
        assert page["total"] == 300 and "indexing" not in page


def test_per_task_failure_classes_versions_and_neighbours(tmp_path, home):
    """What the evaluation page's per-task table and a TRL run's curve are made of, against the
    episodes themselves."""
    write_run(tmp_path, 40)
    index = EpisodeIndex(tmp_path / "trajectories.jsonl")
    index.refresh()
    episodes = [trajectory(n) for n in range(40)]
    tasks = {(t["env"], t["task_id"]): t for t in index.per_task()}
    for (env, task_id), row in tasks.items():
        mine = [e for e in episodes if (e.env, e.task_id) == (env, task_id)]
        scored = [e for e in mine if not e.masked]
        failed = [e for e in scored if e.verdict["verdict"] != "complete"]
        assert row["episodes"] == len(mine) and row["masked"] == len(mine) - len(scored)
        assert row["success_rate"] == pytest.approx((len(scored) - len(failed)) / len(scored))
        assert row["verdicts"] == ({"incomplete": len(failed)} if failed else {})
        kinds = [r["error_kind"] for e in mine for r in e.turns[0].results if r["is_error"]]
        assert row["error_kinds"] == {k: kinds.count(k) for k in set(kinds)}
        assert row["first_failed"] == (failed[0].episode_id if failed else None)
    (version,) = index.by_version()  # every test episode was made by version 0
    assert version["version"] == 0 and version["episodes"] == 40
    assert index.page(EpisodeFilter(version=0), 0, 1)[0] == 40 and index.page(EpisodeFilter(version=1), 0, 1)[0] == 0
    assert index.neighbours("ep000000") == {"previous": None, "next": "ep000001"}
    assert index.neighbours("ep000007") == {"previous": "ep000006", "next": "ep000008"}
    assert index.neighbours("nope") == {"previous": None, "next": None}
    index.close()


def test_runs_say_who_trained_them_and_evaluations_their_pass_at_1(tmp_path, home):
    """A TRL run (trajectories only, its policy named trl-policy) is a training run of TRL with a
    curve from its policy versions; an evaluation lists its model and pass@1."""
    trl = tmp_path / "runs" / "trl"
    trl.mkdir(parents=True)
    log = TrajectoryLog(trl / "trajectories.jsonl")
    for n in range(12):
        t = trajectory(n)
        t.policy, t.policy_version = "trl-policy", n // 4
        log.start(t)
        log.end(t)
    log.close()
    evaluated = tmp_path / "runs" / "eval"
    evaluated.mkdir()
    (evaluated / "eval.json").write_text(json.dumps({"model": "ckpt-3", "k": 2, "environments": [],
                                                     "overall": {"pass@1": 0.25, "pass@2": 0.5}, "tasks": []}))
    with TestClient(build_app(UiState(Runs([tmp_path / "runs"])))) as client:
        runs = {r["name"]: r for r in client.get("/api/runs").json()}
        assert (runs["trl"]["kind"], runs["trl"]["framework"], runs["trl"]["model"]) == ("train", "trl", "trl-policy")
        assert (runs["eval"]["kind"], runs["eval"]["model"], runs["eval"]["pass_at_1"], runs["eval"]["pass_at_k"]) == \
            ("eval", "ckpt-3", 0.25, 0.5)
        summary = client.get(f"/api/runs/{run_id(trl)}").json()
        assert [v["version"] for v in summary["by_version"]] == [0, 1, 2]
        assert [v["episodes"] for v in summary["by_version"]] == [4, 4, 4]
        page = client.get(f"/api/runs/{run_id(trl)}/episodes", params={"version": 2}).json()
        assert page["total"] == 4 and {e["policy_version"] for e in page["episodes"]} == {2}
        episode = client.get(f"/api/runs/{run_id(trl)}/episodes/ep000004").json()
        assert episode["neighbours"] == {"previous": "ep000003", "next": "ep000005"}


async def test_an_idle_playground_session_is_released_after_its_ttl(notes, home):
    """A browser that never said goodbye (crashed, offline) does not hold an instance for ever:
    the server's sweep releases a session idle longer than the TTL, and a session in use is kept."""
    import asyncio

    view = FleetView([Instance(env="notes", name="n", mcp_url=notes.mcp_url, control_url=notes.control_url)])
    state = UiState(Runs([]), fleet=view, playground_ttl_s=0.5)
    transport = httpx.ASGITransport(app=build_app(state))
    async with httpx.AsyncClient(transport=transport, base_url="http://ui") as client:
        opened = (await client.post("/api/playground/n/open")).json()
        assert opened["ttl_s"] == 0.5 and view.holders == {"n": "playground"}
        for _ in range(4):  # used every 0.2 s: kept
            await asyncio.sleep(0.2)
            assert await state.playground.expire() == []
            await client.post("/api/playground/n/reset", json={})
        await asyncio.sleep(0.6)
        assert await state.playground.expire() == ["n"]
        assert view.holders == {} and state.playground.sessions == {}
    await state.close()


def test_awm_ui_refuses_a_runs_directory_that_does_not_exist(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "awm.cli", "ui", "--runs", str(tmp_path / "typo"), "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no such directory" in done.stderr and "typo" in done.stderr


def test_awm_ui_refuses_fleets_or_campaigns_without_the_operator(tmp_path, monkeypatch):
    """--fleet and --namespace are read from the operator's API: without --operator-url (or
    AWM_OPERATOR_URL) the UI would start and show nothing, so it refuses to start."""
    import subprocess
    import sys

    monkeypatch.delenv("AWM_OPERATOR_URL", raising=False)
    for option in (["--namespace", "team-a"], ["--fleet", "team-a/f"]):
        done = subprocess.run([sys.executable, "-m", "awm.cli", "ui", *option, "--port", "0"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "--operator-url" in done.stderr, done.stderr


def test_a_campaign_links_to_its_run_by_namespace_and_name(tmp_path):
    from awm.ui.app import campaign_run

    root = tmp_path / "runs"
    runs = {"a": root / "team-a" / "grpo", "b": root / "team-b" / "grpo", "c": root / "eval-1",
            "d": root / "team-d" / "eval-2"}
    assert campaign_run(runs, [root], "team-b", "grpo") == "b"   # /runs/NAMESPACE/NAME first
    assert campaign_run(runs, [root], "team-c", "eval-1") == "c"  # else /runs/NAME, directly under a root
    assert campaign_run(runs, [root], "team-c", "other") is None
    assert campaign_run(runs, [root], "team-c", "eval-2") is None  # another namespace's run of that name


async def test_a_claimed_playground_session_is_its_claimers_and_ends_with_its_claim(monkeypatch):
    """Unit level (the operator's answer faked; tests/test_campaign_e2e.py has the real one): a
    claimed session answers only its claimer's token, and when the operator has let the claim go
    (404 on renewal: its TTL passed) the UI drops the session instead of failing every request."""
    import time

    from awm.episode.allocation import AllocationClient, AllocationError
    from awm.ui.playground import Claimed, Forbidden, Playground, Session, digest

    view = FleetView(operator_url="http://127.0.0.1:9", namespaces=["ns"])
    playground = Playground(view, ttl_s=30.0, claims=True)
    inst = Instance(env="crm", name="ns.pod-0", mcp_url="http://127.0.0.1:9/mcp", control_url="http://127.0.0.1:9")
    playground.sessions[inst.name] = Session(inst, Claimed("ns", "f", "api_1", digest("mine"), time.monotonic() - 60))

    async def gone(self, claim_id, ttl_seconds=None):  # noqa: ANN001
        raise AllocationError(404, f"no claim {claim_id} in fleet f")

    monkeypatch.setattr(AllocationClient, "renew", gone)
    for token in (None, "theirs"):
        with pytest.raises(Forbidden):
            await playground.session(inst.name, token)
    with pytest.raises(KeyError):
        await playground.session(inst.name, "mine")
    assert inst.name not in playground.sessions

    # A release the operator answers 404 (the claim is gone already) is a release done; any other
    # refusal is the caller's to see, and the session is dropped either way.
    async def release(self, claim_id):  # noqa: ANN001
        raise AllocationError(status, f"no claim {claim_id} in fleet f")

    monkeypatch.setattr(AllocationClient, "release", release)
    for status in (404, 503):
        playground.sessions[inst.name] = Session(inst, Claimed("ns", "f", "api_2", digest("mine"), time.monotonic()))
        if status == 404:
            await playground.release(inst.name, "mine")
        else:
            with pytest.raises(AllocationError):
                await playground.release(inst.name, "mine")
        assert inst.name not in playground.sessions
    await view.close()


def test_an_episode_comes_with_its_grpo_group_rewards_and_advantages(tmp_path, home):
    """The GRPO group as a unit (issue 48): an episode's API answer lists its group's episodes
    with their rewards, verdicts and the advantages the step line recorded (none where masked or
    not trained on), and the step that trained on it."""
    from awm.trainer.grpo import group_advantages
    from awm.trainer.samples import build_batch

    run = tmp_path / "runs" / "grouped"
    run.mkdir(parents=True)
    log = TrajectoryLog(run / "trajectories.jsonl")
    members = [trajectory(n) for n in range(8)]  # groups g0 (ep0-3) and g1 (ep4-7); ep0 is masked
    for t in members:
        log.start(t)
        log.end(t)
    batch = build_batch([members[:4]])  # g0 trained at step 1, g1 not yet
    log.write("step", {"step": 1, "version": 1, "groups": ["g0"], "advantages": batch.advantages})
    log.close()
    valid = [not t.masked for t in members[:4]]
    import torch
    expected = group_advantages(torch.tensor([t.reward for t in members[:4]]), torch.tensor(valid)).tolist()
    assert batch.advantages == {t.episode_id: round(a, 6) for t, a, ok in zip(members[:4], expected, valid) if ok}
    with TestClient(build_app(UiState(Runs([tmp_path / "runs"])))) as client:
        episode = client.get(f"/api/runs/{run_id(run)}/episodes/ep000002").json()
        group = episode["group"]
        assert group["group_id"] == "g0" and group["step"] == 1 and group["size"] == 4
        assert [m["episode_id"] for m in group["episodes"]] == [f"ep00000{i}" for i in range(4)]
        by_id = {m["episode_id"]: m for m in group["episodes"]}
        assert by_id["ep000000"]["masked"] and by_id["ep000000"]["advantage"] is None
        for t in members[1:4]:
            assert by_id[t.episode_id]["advantage"] == batch.advantages[t.episode_id]
            assert by_id[t.episode_id]["reward"] == t.reward
        assert group["reward_mean"] == sum(t.reward for t in members[1:4]) / 3
        later = client.get(f"/api/runs/{run_id(run)}/episodes/ep000005").json()["group"]
        assert later["step"] is None and all(m["advantage"] is None for m in later["episodes"])
        # a step's groups as units: step 1 trained on g0 only
        step = client.get(f"/api/runs/{run_id(run)}/steps/1/groups").json()
        (g0,) = step["groups"]
        assert g0["group_id"] == "g0" and g0["size"] == 4 and g0["reward_mean"] == group["reward_mean"]
        assert [e["advantage"] for e in g0["episodes"]] == [m["advantage"] for m in group["episodes"]]
        assert client.get(f"/api/runs/{run_id(run)}/steps/2/groups").json()["groups"] == []
        assert client.get(f"/api/runs/{run_id(run)}/steps/x/groups").status_code == 400
        assert client.get("/api/runs/000000000000/steps/1/groups").status_code == 404


def test_an_evaluation_names_its_checkpoint_and_a_run_lists_the_evaluations_of_its_checkpoints(tmp_path, home):
    """eval.json records what produced it (settings, date) and the checkpoint it evaluated; pass@1
    has a 95 % interval over tasks; the training run's page data lists the evaluations of its
    checkpoints by step, the evaluation's names the run and step (issue 48)."""
    from awm.trainer import eval as ev

    run = tmp_path / "runs" / "trained"
    run.mkdir(parents=True)
    write_run(run, 8)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    scores = [ev.EnvScore("lamps", [ev.TaskScore("lamps", f"t{i}", 4, c, 0, c / 4, c / 4, 1.0 if c else 0.0)
                                    for i, c in enumerate([4, 3, 0, 1, 2, 4, 0, 2])])]
    for step in (2, 4):
        checkpoint = run / "checkpoints" / f"step-{step:06d}"
        checkpoint.mkdir(parents=True)
        assert ev.checkpoint_of(checkpoint) == {"path": str(checkpoint.resolve()), "run_dir": str(run.resolve()),
                                                "step": step}
        data = ev.report(scores, 4, str(checkpoint), {"temperature": 0.6, "max_turns": 20}, ev.checkpoint_of(checkpoint))
        out = tmp_path / "runs" / f"eval-{step}"
        out.mkdir()
        (out / "eval.json").write_text(json.dumps(data))
    lo, hi = data["overall"]["pass@1_ci95"]
    assert lo < data["overall"]["pass@1"] < hi and 0 <= lo and hi <= 1
    assert ev.interval95([0.5]) is None and ev.interval95([1.0, 1.0]) == [1.0, 1.0]
    assert ev.interval95([0.0, 1.0] * 10) == ev.interval95([0.0, 1.0] * 10)  # seeded: the same report twice
    assert ev.checkpoint_of(tmp_path / "model") == {"path": str((tmp_path / "model").resolve())}
    with TestClient(build_app(UiState(Runs([tmp_path / "runs"])))) as client:
        trained = client.get(f"/api/runs/{run_id(run)}").json()
        assert [(e["step"], e["name"]) for e in trained["evaluations"]] == [(2, "eval-2"), (4, "eval-4")]
        assert trained["evaluations"][0]["pass@1_ci95"] == [lo, hi]
        assert trained["evaluations"][0]["settings"] == {"temperature": 0.6, "max_turns": 20}
        evaluation = client.get(f"/api/runs/{run_id(tmp_path / 'runs' / 'eval-4')}").json()
        assert evaluation["evaluated_run"] == {"id": run_id(run), "name": "trained", "step": 4}
        assert evaluation["evaluations"] == []
