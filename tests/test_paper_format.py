"""Format errors as the paper's kit scores them: which error classes are format errors is a
typed setting (``reward.format_errors``), the agent's early termination (``agent.stop_on_format_error``)
ends an episode at the first of them, scored ``reward.format_error``. The kit's configs make
invented tool names (``unknown_tool``) and schema-invalid arguments (``invalid_arguments``) format
errors beside malformed calls, as OpenEnv's AWM environment scores them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from awm.episode.reward import RewardConfig, score
from awm.errorclass import AGENT_FAULTS, ENVIRONMENT_FAULTS, ErrorClass
from awm.trainer import awm_format
from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
from awm.trainer.config import TrainConfig
from awm.trainer.policy import OpenAIPolicy
from tests.llm_server import Reply, ScriptedLLM

PAPER = (ErrorClass.MALFORMED, ErrorClass.UNKNOWN_TOOL, ErrorClass.INVALID_ARGUMENTS)


def test_the_default_charges_malformed_calls_only_and_keeps_the_old_reward() -> None:
    kinds = [ErrorClass.INVALID_ARGUMENTS, ErrorClass.UNKNOWN_TOOL, ErrorClass.MALFORMED]
    cfg = RewardConfig(format_penalty=0.1, tool_error_penalty=0.05)
    assert cfg.format_errors == (ErrorClass.MALFORMED,)
    assert score({"verdict": "complete"}, kinds, 1, cfg=cfg).reward == pytest.approx(1.0 - 0.1 - 2 * 0.05)


def test_a_format_error_class_costs_the_format_penalty_once_not_also_the_tool_penalty() -> None:
    kinds = [ErrorClass.INVALID_ARGUMENTS, ErrorClass.UNKNOWN_TOOL, ErrorClass.TOOL_ERROR, ErrorClass.MALFORMED]
    cfg = RewardConfig.from_dict({"format_errors": [c.value for c in PAPER], "format_penalty": 0.1,
                                  "tool_error_penalty": 0.05, "max_penalty": 1.0})
    assert cfg.format_errors == PAPER
    result = score({"verdict": "complete"}, kinds, 1, cfg=cfg)
    assert result.components["format_penalty"] == pytest.approx(-0.3)  # malformed, unknown tool, invalid arguments
    assert result.components["tool_error_penalty"] == pytest.approx(-0.05)  # tool_error only
    # without malformed among them, a malformed call is no format error
    cfg = RewardConfig(format_errors=(ErrorClass.UNKNOWN_TOOL,), format_penalty=0.1)
    assert score({"verdict": "complete"}, [ErrorClass.MALFORMED], 1, cfg=cfg).reward == 1.0


@pytest.mark.parametrize("bad, message", [
    ([ErrorClass.TIMEOUT.value], "environment's fault"), (["unknwon_tool"], "not an error class"),
    (ErrorClass.MALFORMED.value, "must be a list")])
def test_only_agent_fault_classes_may_be_format_errors(bad: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict({"reward": {"format_errors": bad}})
    assert all(RewardConfig(format_errors=(c,)).format_errors == (c,) for c in AGENT_FAULTS)
    for kind in ENVIRONMENT_FAULTS:
        with pytest.raises(ValueError):
            RewardConfig(format_errors=(kind,))


def test_early_termination_scores_format_error_whatever_the_class() -> None:
    result = score({"verdict": "format_error", "reason": "format error: unknown_tool tool call"},
                   [ErrorClass.UNKNOWN_TOOL], 0, cfg=RewardConfig(format_errors=PAPER))
    assert (result.reward, result.masked) == (-1.0, False)


def native(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


async def run(notes: Any, first: Reply, cfg: AgentConfig, reward: RewardConfig) -> Any:
    """An episode of add_note whose first reply is ``first``, the second a final answer."""
    def answer(stage: str, body: dict[str, Any], index: int) -> Reply:
        return first if not any(m["role"] == "assistant" for m in body["messages"]) else Reply("Done.")

    env = await EnvHandle.connect(notes.mcp_url, notes.control_url)
    try:
        with ScriptedLLM(answer) as llm:
            policy = OpenAIPolicy(llm.base_url, "scripted", retries=1)
            try:
                return await run_episode(policy, env, "add_note", cfg, reward)
            finally:
                await policy.close()
    finally:
        await env.close()


async def test_the_agent_stops_at_the_configured_classes_only(notes: Any) -> None:
    invalid = Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "colour": "red"})])
    stop = AgentConfig(max_turns=4, stop_on_format_error=True)
    # default classes: schema-invalid arguments are the agent's tool error, the episode goes on
    traj = await run(notes, invalid, stop, RewardConfig())
    assert traj.turns[0].results[0]["error_kind"] == ErrorClass.INVALID_ARGUMENTS
    assert traj.stop_reason == "answer" and len(traj.turns) == 2 and traj.reward == 0.0
    # the paper's classes: the same call ends the episode unverified, scored -1
    traj = await run(notes, invalid, stop, RewardConfig(format_errors=PAPER))
    assert traj.stop_reason == "format_error" and len(traj.turns) == 1 and traj.reward == -1.0
    assert ErrorClass.INVALID_ARGUMENTS.value in traj.verdict["reason"]


async def test_an_invented_tool_in_the_awm_format_ends_the_episode(notes: Any) -> None:
    invented = Reply(awm_format.render_call("delete_everything", {}))
    traj = await run(notes, invented, AgentConfig(max_turns=4, tool_format="awm", stop_on_format_error=True),
                     RewardConfig(format_errors=PAPER))
    assert traj.turns[0].results[0]["error_kind"] == ErrorClass.UNKNOWN_TOOL
    assert traj.stop_reason == "format_error" and traj.reward == -1.0 and not traj.masked


async def test_a_reply_without_its_think_block_is_a_format_error_where_thinking_is_on(notes: Any) -> None:
    """Issue 44: with the policy thinking (Qwen3 as the paper trains it), a reply without its
    <think>...</think> block is a format error, recorded as ``malformed``: it costs the format
    penalty, and with early termination it ends the episode scored ``format_error``. A reply that
    thinks goes on as usual; without ``require_thinking`` nothing is checked."""
    call = native("add_note", {"title": "groceries", "body": "milk"})
    thoughtless = Reply(content="", tool_calls=[call])
    thoughtful = Reply(content="<think>add the note</think>", tool_calls=[call])
    # early termination: the first reply without a block ends the episode, unverified, -1
    stop = AgentConfig(max_turns=4, stop_on_format_error=True, require_thinking=True)
    traj = await run(notes, thoughtless, stop, RewardConfig())
    assert traj.stop_reason == "format_error" and traj.reward == -1.0 and len(traj.turns) == 1
    assert [r["error_kind"] for r in traj.turns[0].results] == [ErrorClass.MALFORMED.value]
    assert "think" in traj.verdict["reason"]
    # a penalty instead of a stop: the call still runs, the block's absence costs the format penalty
    # (the final answer "Done." has none either: two format errors)
    going = AgentConfig(max_turns=4, require_thinking=True)
    traj = await run(notes, thoughtless, going, RewardConfig(format_penalty=0.1))
    assert traj.stop_reason == "answer" and len(traj.turns) == 2
    kinds = [r["error_kind"] for t in traj.turns for r in t.results if r["is_error"]]
    assert kinds == [ErrorClass.MALFORMED.value] * 2
    assert traj.reward_components["format_penalty"] == pytest.approx(-0.2)
    # a reply that thinks: no format error from the first turn
    traj = await run(notes, thoughtful, going, RewardConfig(format_penalty=0.1))
    assert [r["error_kind"] for r in traj.turns[0].results if r["is_error"]] == []
    # off by default
    traj = await run(notes, thoughtless, AgentConfig(max_turns=4), RewardConfig(format_penalty=0.1))
    assert all(not r["is_error"] for t in traj.turns for r in t.results)
    # the kit's configs turn it on
    from pathlib import Path

    for name in ("qwen3-4b", "qwen3-8b", "qwen3-14b"):
        path = Path(__file__).resolve().parents[1] / "examples" / "paper" / f"{name}.yaml"
        assert TrainConfig.load(path).agent.require_thinking is True
