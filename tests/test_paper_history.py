"""The paper's history window (w = 3) keeps the first ``list_tools`` exchange in every sample.

In the AWM format the tools are shown only once, in the answer to the agent's first
``list_tools`` call; a window that keeps only the system prompt and the instruction hides them
from turn w + 2 on, in rollouts and in the learner's re-encoded contexts alike (both call
:func:`awm.trainer.history.window`). These tests fail on the window that kept only that head.
"""

from __future__ import annotations

from typing import Any

import pytest

from awm.trainer import awm_format, tiny
from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
from awm.trainer.policy import OpenAIPolicy
from awm.trainer.chatformat import ChatFormat
from awm.trainer.history import window
from awm.trainer.samples import episode_sequences, turn_tokens
from awm.trainer.trajectory import Trajectory, Turn
from tests.llm_server import Reply, ScriptedLLM

Message = dict[str, Any]
HEAD: list[Message] = [{"role": "system", "content": awm_format.system_prompt()}, {"role": "user", "content": "task"}]
TOOLS_TEXT = awm_format.list_tools_text([{"name": "switch_on", "description": "Switch a lamp on.",
                                          "inputSchema": {"type": "object"}}])


def listing(thinking: str = "") -> list[Message]:
    """The AWM format's list_tools exchange: a text call, its <tool_response> block."""
    call = '<tool_call>{"name": "list_tools", "arguments": {}}</tool_call>'
    return [{"role": "assistant", "content": thinking + call},
            {"role": "user", "content": f"<tool_response>\n{TOOLS_TEXT}\n</tool_response>"}]


def call(i: int) -> list[Message]:
    """One call_tool exchange (text format), numbered to tell the turns apart."""
    return [{"role": "assistant", "content": awm_format.render_call("switch_on", {"color": f"c{i}"})},
            {"role": "user", "content": f"<tool_response>\nresult {i}\n</tool_response>"}]


def test_the_window_keeps_the_first_list_tools_exchange_and_the_last_w_turns() -> None:
    messages = HEAD + listing() + call(1) + call(2) + call(3) + call(4)
    assert window(messages, 3) == HEAD + listing() + call(2) + call(3) + call(4)
    assert window(messages, 1) == HEAD + listing() + call(4)
    # within the window it is not repeated; with the whole history nothing is cut
    assert window(messages, 4) == messages and window(messages, None) == messages


def test_only_the_first_listing_is_pinned_and_thinking_does_not_hide_it() -> None:
    thought = "<think>I should list the tools first.</think>"
    messages = HEAD + call(0) + listing(thought) + call(1) + listing() + call(2) + call(3)
    assert window(messages, 2) == HEAD + listing(thought) + call(2) + call(3)
    # a list_tools named only inside thinking is not a call: nothing is pinned
    mentioned = [{"role": "assistant", "content": '<think><tool_call>{"name": "list_tools"}</tool_call></think>ok'},
                 {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}]
    assert window(HEAD + mentioned + call(1) + call(2), 2) == HEAD + call(1) + call(2)


def test_a_listing_that_was_not_the_executed_call_is_not_pinned() -> None:
    """The AWM format executes the first call of a reply only: a list_tools written second was
    answered "not executed", and its turn holds no tool list."""
    second = [{"role": "assistant", "content": awm_format.render_call("switch_on", {}) +
               '<tool_call>{"name": "list_tools", "arguments": {}}</tool_call>'},
              {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}]
    assert window(HEAD + second + call(1) + call(2), 2) == HEAD + call(1) + call(2)


def test_the_learner_rebuilds_each_context_with_the_tool_list() -> None:
    """A trajectory without token ids (a server that returned none) is re-encoded by the learner
    through the same window: every turn's context after the cut still holds the tools."""
    messages = HEAD + listing() + call(1) + call(2) + call(3) + call(4) + [{"role": "assistant", "content": "Done."}]
    turns = [Turn(i, m, [], [], "text", 0.0, 0.0, 0) for i, m in enumerate(m for m in messages if m["role"] == "assistant")]
    traj = Trajectory("e", "lamps", "t", "task", "p", messages=messages, turns=turns, history_window=3)
    fmt = ChatFormat(tiny.build_tokenizer([m["content"] for m in messages], [], max_words=100_000))
    tools_ids = fmt.encode_text(TOOLS_TEXT)
    assert fmt.tokenizer.unk_token_id not in tools_ids
    for turn in turns[1:]:  # turn 0 is the list_tools call itself
        prompt, _, _ = turn_tokens(traj, turn, fmt)
        assert _contains(prompt, tools_ids), f"turn {turn.index} was scored without the tool list"
    # the cut starts a new packed sequence, which again begins with the head and the listing
    sequences = episode_sequences(traj, fmt)
    assert len(sequences) > 1 and all(_contains(s.input_ids, tools_ids) for s in sequences)


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_the_pinned_prefix_is_stable_so_packing_extends_it(turns: int) -> None:
    """Once the window cuts, every later context starts with the same head + listing."""
    messages = HEAD + listing() + [m for i in range(1, 8) for m in call(i)]
    starts = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    contexts = [window(messages[:p], turns) for p in starts[turns + 2:]]
    assert all(c[:4] == HEAD + listing() for c in contexts)


async def test_a_rollout_in_the_awm_format_keeps_showing_the_tools(notes) -> None:
    """Through the agent loop on a real instance: with w = 1, the prompt of the fourth turn still
    holds the list_tools result of the first (the policy is a scripted server)."""
    def answer(stage: str, body: dict[str, Any], index: int) -> Reply:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turn == 0:
            return Reply('<tool_call>{"name": "list_tools", "arguments": {}}</tool_call>')
        return Reply(awm_format.render_call("list_notes", {}))

    env = await EnvHandle.connect(notes.mcp_url, notes.control_url)
    try:
        with ScriptedLLM(answer) as llm:
            policy = OpenAIPolicy(llm.base_url, "scripted", retries=1)
            try:
                traj = await run_episode(policy, env, "count_notes",
                                         AgentConfig(max_turns=4, history_window=1, tool_format="awm"))
            finally:
                await policy.close()
            requests = [body for _, body in llm.requests]
    finally:
        await env.close()
    assert len(traj.turns) == 4 and traj.turns[0].results[0]["name"] == awm_format.LIST_TOOLS
    listed = traj.turns[0].results[0]["text"]
    assert '"list_notes"' in listed
    last = requests[3]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert listed in last[3]["content"]
    assert traj.turns[3].context_messages == 6


def _contains(ids: list[int], part: list[int]) -> bool:
    return any(ids[i:i + len(part)] == part for i in range(len(ids) - len(part) + 1))
