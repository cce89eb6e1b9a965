"""awm as a SkyRL environment: ``skyrl_gym.make("awm", ...)`` builds :class:`AwmTextEnv`, and a
scripted policy's text replies run whole episodes on live instances (a real local fleet on the
session's PostgreSQL, found through an ``awm serve --json`` instances file, as a SkyRL run finds
a fleet it did not start)."""

import importlib.util
import json

import pytest

from awm import catalog as catalog_mod
from awm.fleet import Database, LocalFleet

from tests.conftest import FIXTURES, require

require(importlib.util.find_spec("skyrl_gym") is not None, "skyrl-gym is not installed (the skyrl extra)")
import skyrl_gym  # noqa: E402

from awm.episode.sources import source_from_config  # noqa: E402
from awm.integrations.loop import shared_loop  # noqa: E402
from awm.integrations.skyrl_env import AwmTextEnv, register  # noqa: E402

ADD = '<tool_call>{"name": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs"}}</tool_call>'


@pytest.fixture(scope="module")
def env_config(admin_dsn, tmp_path_factory):
    """Two notes instances (hostile verifiers served ungated) on the integrations' loop, written
    out as ``awm serve --json`` prints them."""
    loop = shared_loop()
    fleet = LocalFleet(catalog_mod.load(str(FIXTURES / "notes")), replicas=2, database=Database(admin_dsn),
                       allow_ungated=True)
    loop.run(fleet.start())
    path = tmp_path_factory.mktemp("skyrl") / "instances.jsonl"
    path.write_text("".join(json.dumps({"env": h.env, "instance": h.name, "mcp_url": h.mcp_url,
                                        "control_url": h.control_url, "pid": h.pid}) + "\n" for h in fleet.instances))
    yield {"instances_file": str(path), "max_steps": 3, "reward": {"format_penalty": 0.1}}
    loop.run(fleet.stop())


def free(config) -> int:
    return source_from_config(config).free()


def test_a_scripted_episode_through_skyrl_gym_make(env_config):
    register()
    env = skyrl_gym.make("awm", env_config=env_config, extras={"env": "notes", "task_id": "add_note", "max_turns": 4})
    assert isinstance(env, AwmTextEnv)
    prompt, info = env.init([{"role": "user", "content": "ignored: the task's own instruction is the prompt"}])
    assert info["task_id"] == "add_note" and prompt[-1]["content"].startswith("Add a note titled")
    assert "add_note" in prompt[0]["content"] and "<tool_call>" in prompt[0]["content"]
    assert free(env_config) == 1  # the episode holds one instance
    first = env.step("I will add it. " + ADD)
    assert not first["done"] and first["reward"] == 0.0
    assert '"title": "groceries"' in first["observations"][0]["content"].replace("'", '"') or \
        "groceries" in first["observations"][0]["content"]
    last = env.step("Added the note.")
    assert last["done"] and last["reward"] == 1.0 and not last["metadata"]["masked"]
    assert last["metadata"]["verdict"]["verdict"] == "complete"
    assert env.get_metrics() == {"reward": 1.0, "masked": 0.0, "complete": 1.0, "turns": 2}
    assert free(env_config) == 2  # and gave it back


def test_episodes_are_logged_for_the_ui(env_config, tmp_path):
    """With ``trajectories`` in env_config every episode goes to awm's trajectory log, which
    `awm ui` lists as a SkyRL run: each reply, its calls and results, the verdict and reward."""
    from tests.test_verl import assert_logged_for_the_ui

    log = tmp_path / "skyrl-run" / "trajectories.jsonl"
    config = {**env_config, "trajectories": str(log)}
    done = AwmTextEnv(config, {"env": "notes", "task_id": "add_note", "max_turns": 4})
    done.init()
    done.step("I will add it. " + ADD)
    assert done.step("Added the note.")["reward"] == 1.0
    limited = AwmTextEnv(config, {"env": "notes", "task_id": "add_note", "max_turns": 2})
    limited.init()
    limited.step('<tool_call>{"name": "add_note", "arguments": </tool_call>')  # malformed
    limited.step("<tool_call>" + ADD.split("<tool_call>")[1])
    # (the second added the note in its last turn: the verifier finds it done without an answer)
    assert_logged_for_the_ui(log, "skyrl", {"complete": 2})
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["stop_reason"] for e in events if e["event"] == "end"] == ["answer", "2 turns"]
    malformed = next(e for e in events if e["event"] == "turn" and e["tool_calls"] and e["tool_calls"][0].get("malformed"))
    assert malformed["results"][0]["error_kind"] == "malformed" and malformed["results"][0]["is_error"]
    assert free(env_config) == 2


def test_wrong_work_scores_zero_and_malformed_calls_are_penalised(env_config):
    env = AwmTextEnv(env_config, {"extra_info": {"env": "notes", "task_id": "add_note"}})
    env.init()
    bad = env.step('<tool_call>{"name": "add_note", "arguments": </tool_call>')  # not JSON
    assert "malformed tool call" in bad["observations"][0]["content"]
    wrong = env.step('<tool_call>{"name": "add_note", "arguments": {"title": 5}}</tool_call>')
    assert "invalid_arguments" in wrong["observations"][0]["content"]
    assert env.episode.error_kinds == ["malformed", "invalid_arguments"]  # as the trainer's agent loop records them
    end = env.step("Done.")
    assert end["done"] and end["reward"] == pytest.approx(-0.1)  # incomplete, one malformed call
    assert end["metadata"]["reward_components"]["format_penalty"] == pytest.approx(-0.1)


def test_turn_and_tool_call_limits_end_the_episode(env_config):
    env = AwmTextEnv(env_config, {"env": "notes", "task_id": "add_note", "max_turns": 2})
    env.init()
    env.step('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>')
    out = env.step('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>')
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["ended_by"] == "2 turns"
    env = AwmTextEnv(env_config, {"env": "notes", "task_id": "add_note", "max_turns": 10})
    env.init()
    calls = "".join(['<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>'] * 3)
    out = env.step(calls)  # max_steps is 3 tool calls
    assert out["done"] and out["metadata"]["ended_by"] == "3 tool calls without an answer"
    assert free(env_config) == 2


def test_an_environment_failure_is_masked_not_charged(env_config):
    """The ``kills_itself`` task's verifier dies: the verdict is an error of the environment's."""
    env = AwmTextEnv(env_config, {"env": "notes", "task_id": "kills_itself"})
    env.init()
    out = env.step("Done.")
    assert out["done"] and out["reward"] == 0.0
    assert out["metadata"]["masked"] and "verifier error" in out["metadata"]["mask_reason"]
    assert env.get_metrics()["masked"] == 1.0


def test_closing_mid_episode_returns_the_instance(env_config):
    env = AwmTextEnv(env_config, {"env": "notes", "task_id": "add_note"})
    env.init()
    assert free(env_config) == 1
    env.close()
    assert free(env_config) == 2
    with pytest.raises(ValueError, match="names its environment"):
        AwmTextEnv(env_config, {"task_id": "add_note"})
