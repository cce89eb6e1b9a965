"""awm as a verl agent loop: verl's real ``AgentLoopBase`` (0.9.1, in its own virtualenv:
tests/verl_env.py) runs :class:`awm.integrations.verl_agent.AwmAgentLoop` episodes with a scripted
rollout server (tests/verl_episodes.py) on live instances of a real local fleet, found through
an ``awm serve --json`` instances file."""

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from awm import catalog as catalog_mod
from awm.fleet import Database, LocalFleet

from tests import verl_env
from tests.conftest import FIXTURES, require

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def verl_python():
    if not verl_env.installed():
        require(os.environ.get("CI") == "true" or os.environ.get("AWM_VERL_INSTALL") == "1",
                f"no verl environment at {verl_env.env_dir()} (python3 tests/verl_env.py makes it, "
                "or AWM_VERL_INSTALL=1 lets this test make it)")
        verl_env.install()
    return verl_env.python()


def source_layout(target: Path) -> Path:
    """The checkout's packages as the wheel installs them (``awm``, ``awm.envserver``, ...,
    ``awm_operator``), made of symlinks into the checkout: for an interpreter that has its own
    packages and must import awm's from this checkout without installing it (never stale)."""
    pkg = target / "awm"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "awm").iterdir():
        (pkg / entry.name).symlink_to(entry)
    for component in ("envserver", "trainer", "integrations", "ui"):
        (pkg / component).symlink_to(ROOT / component)
    (target / "awm_operator").symlink_to(ROOT / "operator" / "awm_operator")
    return target


@pytest.mark.slow
async def test_verl_agent_loop_runs_awm_episodes(verl_python, admin_dsn, tmp_path):
    bundles = catalog_mod.load(str(FIXTURES / "notes"))
    async with LocalFleet(bundles, replicas=2, database=Database(admin_dsn), allow_ungated=True) as fleet:
        instances = tmp_path / "instances.jsonl"
        instances.write_text("".join(json.dumps({"env": h.env, "instance": h.name, "mcp_url": h.mcp_url,
                                                 "control_url": h.control_url}) + "\n" for h in fleet.instances))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PYTHONPATH"] = str(source_layout(tmp_path / "src"))
        log = tmp_path / "verl-run" / "trajectories.jsonl"
        run = await asyncio.to_thread(subprocess.run, [str(verl_python), str(ROOT / "tests" / "verl_episodes.py"),
                                                       str(instances), str(log)], capture_output=True, text=True,
                                      env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    complete, wrong, turns, masked = got["complete"], got["wrong"], got["turns"], got["masked"]
    print(f"\nverl AwmAgentLoop: {json.dumps({k: (v['reward'], v['extra']) for k, v in got.items()})}")
    # a tool call, its result, the answer: reward 1.0; generated tokens 1, tool output 0
    assert complete["reward"] == 1.0 and complete["extra"]["awm_verdict"] == "complete"
    assert complete["generate_calls"] == 2 and complete["prompt_grows"]
    mask = complete["response_mask"]
    assert len(mask) == complete["response_len"] and mask[0] == 1 and mask[-1] == 1 and 0 in mask
    assert len(complete["logprobs"]) == len(mask)
    assert wrong["reward"] == 0.0 and wrong["extra"]["awm_verdict"] == "incomplete" and not wrong["extra"]["awm_masked"]
    assert turns["generate_calls"] == 3 and turns["extra"]["awm_ended_by"] == "3 turns" and turns["reward"] == 0.0
    # a verifier that crashes: masked - no gradient from the sample
    assert masked["extra"]["awm_masked"] and masked["extra"]["awm_verdict"] == "error"
    assert masked["reward"] == 0.0 and set(masked["response_mask"]) == {0}
    # every episode in awm's trajectory log, which `awm ui` reads as a verl run
    assert_logged_for_the_ui(log, "verl", {"complete": 1, "incomplete": 2, "error": 1})


def assert_logged_for_the_ui(log, framework: str, verdicts: dict[str, int]) -> None:
    """The adapter's episodes as `awm ui` reads them: one start, a turn per reply and an end per
    episode, the run recognised as the framework's, every episode in the UI's episode list."""
    from collections import Counter

    from awm.ui.runs import Runs

    events = [json.loads(line) for line in log.read_text().splitlines()]
    ends = [e for e in events if e["event"] == "end"]
    assert Counter(e["verdict"]["verdict"] for e in ends) == verdicts
    starts = {e["episode_id"]: e for e in events if e["event"] == "start"}
    assert len(starts) == len(ends) and {e["policy"] for e in starts.values()} == {f"{framework}-policy"}
    for end in ends:
        turns = [e for e in events if e["event"] == "turn" and e["episode_id"] == end["episode_id"]]
        assert [t["index"] for t in turns] == list(range(len(end["turns"]))) and end["episode_id"] in starts
        for turn in turns:
            assert len(turn["results"]) == len(turn["tool_calls"]) and turn["source"] in ("text", "none")
    complete = next(e for e in ends if e["verdict"]["verdict"] == "complete")
    assert complete["reward"] == 1.0 and complete["final_answer"] and complete["turns"][0]["tool_calls"][0]["name"]
    assert complete["turns"][0]["results"][0]["is_error"] is False
    (info,) = Runs([log.parent]).list()
    assert (info.kind, info.framework) == ("train", framework)
    index = Runs([log.parent]).index(info.id)
    assert index is not None and index.count() == len(ends)
