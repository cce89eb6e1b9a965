"""The agent loop against a real served instance (LocalFleet on the real Postgres fixture) and a
scripted OpenAI-compatible policy server: native and text tool calls, malformed calls, an
unreachable policy, and failures of ours that must never be charged to the agent."""

import json
import os
import subprocess
import sys

import pytest

from awm.client import ControlClient, McpSession
from tests.llm_server import Reply, ScriptedLLM
from awm.trainer import tiny
from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
from awm.trainer.chatformat import ChatFormat
from awm.trainer.policy import OpenAIPolicy, PolicyUnavailable
from awm.episode.reward import RewardConfig
from awm.trainer.samples import episode_sequences
from awm.trainer.trajectory import TrajectoryLog, read_events, read_trajectories


def native(name, arguments, call_id="c1"):
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def by_turn(*replies):
    """Answer the n-th request of an episode (n = assistant messages already in the history)."""
    def answer(stage, body, index):
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return replies[min(turn, len(replies) - 1)]
    return answer


@pytest.fixture
async def env(notes):
    handle = await EnvHandle.connect(notes.mcp_url, notes.control_url)
    yield handle
    await handle.close()


async def episode(env, answer, task, tmp_path, cfg=None, reward=None):
    with ScriptedLLM(answer) as llm:
        policy = OpenAIPolicy(llm.base_url, "scripted", retries=1)
        log = TrajectoryLog(tmp_path / "traj.jsonl")
        try:
            traj = await run_episode(policy, env, task, cfg or AgentConfig(max_turns=6), reward, log)
        finally:
            await policy.close()
            log.close()
    return traj, llm.requests


async def test_native_tool_calls_complete_the_task(env, tmp_path):
    traj, requests = await episode(env, by_turn(
        Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "body": "milk, eggs"})]),
        Reply("I added the note.")), "add_note", tmp_path)
    assert traj.verdict["verdict"] == "complete" and traj.reward == 1.0 and not traj.masked
    assert traj.stop_reason == "answer" and traj.final_answer == "I added the note."
    assert traj.diff == {"notes": {"inserted": 1, "updated": 0, "deleted": 0}}
    assert [t.source for t in traj.turns] == ["native", "none"]
    assert traj.turns[0].results[0]["is_error"] is False and '"groceries"' in traj.turns[0].results[0]["text"]
    # The request carried the tools, and the result went back as a `tool` message with the call id.
    first, second = requests[0][1], requests[1][1]
    assert "add_note" in {t["function"]["name"] for t in first["tools"]}
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "c1", "content": traj.turns[0].results[0]["text"]}
    assert set(traj.timings) >= {"reset_ms", "policy_ms", "tools_ms", "verify_ms", "wall_ms"}
    # Streamed as it went: a start line, one line per turn, then the whole record.
    events = [e["event"] for e in read_events(tmp_path / "traj.jsonl")]
    assert events == ["start", "turn", "turn", "end"]
    assert read_trajectories(tmp_path / "traj.jsonl")[0].verdict["verdict"] == "complete"
    # The server returned no token ids: the learner re-encodes each turn's prompt, and it is what
    # the server was sent, tool definitions included (from the log, as an offline learner would).
    saved = read_trajectories(tmp_path / "traj.jsonl")[0]
    assert saved.tools == first["tools"]
    words = json.dumps([first, second]).replace('"', " ").split()
    fmt = ChatFormat(tiny.build_tokenizer(words, [], max_words=100_000))
    (sequence,) = episode_sequences(saved, fmt)
    prompt = fmt.encode_prompt(first["messages"], first["tools"])
    assert sequence.input_ids[:len(prompt)] == prompt and sequence.loss_mask[:len(prompt)] == [0] * len(prompt)
    assert fmt.encode_prompt(first["messages"]) != prompt
    # each generated span ends at the end-of-turn token: the newline after it was never generated
    end = fmt.encode_text("<|im_end|>")
    mask = sequence.loss_mask
    span_ends = [i for i, m in enumerate(mask) if m and (i + 1 == len(mask) or not mask[i + 1])]
    assert len(span_ends) == 2
    assert all(sequence.input_ids[i + 1 - len(end):i + 1] == end for i in span_ends)


async def test_text_fallback_calls(env, tmp_path):
    traj, requests = await episode(env, by_turn(
        Reply('Let me look. <tool_call>{"name": "list_notes", "arguments": {}}</tool_call>'),
        Reply("You have 3 notes.")), "count_notes", tmp_path, AgentConfig(max_turns=4, tool_format="text"))
    assert traj.verdict["verdict"] == "complete" and traj.reward == 1.0
    assert traj.turns[0].source == "text" and traj.turns[0].tool_calls[0]["name"] == "list_notes"
    body = requests[1][1]
    assert "tools" not in body and "<tool_call>" in body["messages"][0]["content"]  # the tools are in the prompt
    assert body["messages"][-1]["role"] == "user" and "<tool_response>" in body["messages"][-1]["content"]


async def test_malformed_calls_are_answered_and_penalised(env, tmp_path):
    traj, requests = await episode(env, by_turn(
        Reply('<tool_call>{"name": "add_note", "arguments": {title: groceries}}</tool_call>'),
        Reply(content="", tool_calls=[native("add_note", "{not json", "c2")]),
        Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "colour": "red"}, "c3")]),
        Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "body": "milk, eggs"}, "c4")]),
        Reply("Done.")), "add_note", tmp_path, reward=RewardConfig(format_penalty=0.1, tool_error_penalty=0.05))
    kinds = [r["error_kind"] for t in traj.turns for r in t.results]
    assert kinds == ["malformed", "malformed", "invalid_arguments", None]
    assert traj.verdict["verdict"] == "complete" and not traj.masked
    assert traj.reward == pytest.approx(1.0 - 2 * 0.1 - 0.05)  # two format errors, one agent tool error
    # The episode went on: the model saw each error.
    assert "malformed tool call" in requests[1][1]["messages"][-1]["content"]
    assert requests[3][1]["messages"][-1]["content"].startswith("Error: invalid_arguments")


async def test_max_turns_and_history_window(env, tmp_path):
    traj, requests = await episode(env, by_turn(Reply(content="", tool_calls=[native("list_notes", {})])),
                                   "count_notes", tmp_path, AgentConfig(max_turns=3, history_window=1))
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 3 and traj.final_answer is None
    assert traj.verdict["verdict"] == "incomplete" and traj.reward == 0.0
    # Turn 3 saw system + instruction + only the last turn (assistant + its tool result).
    assert [m["role"] for m in requests[2][1]["messages"]] == ["system", "user", "assistant", "tool"]
    assert traj.turns[2].context_messages == 4 and len(traj.messages) == 8


async def test_environment_failures_are_masked_not_charged(env, tmp_path):
    # A tool that crashes is the environment's bug: the episode is masked, whatever the verdict.
    traj, _ = await episode(env, by_turn(Reply(content="", tool_calls=[native("add_then_crash", {"title": "x"})]),
                                         Reply("ok")), "add_note", tmp_path)
    assert traj.turns[0].results[0]["error_kind"] == "tool_crashed"
    assert traj.masked and traj.reward == 0.0 and "tool_crashed" in traj.mask_reason
    # A verifier that crashes: verdict error (crash) -> masked.
    traj, _ = await episode(env, by_turn(Reply("nothing to do")), "kills_itself", tmp_path)
    assert traj.verdict["verdict"] == "error" and traj.verdict["error_kind"] == "crash"
    assert traj.masked and traj.reward == 0.0


async def test_lost_instance_is_an_infra_error(notes, tmp_path):
    dead = EnvHandle(McpSession(notes.mcp_url), ControlClient("http://127.0.0.1:9"), "notes", "gone")
    try:
        traj, _ = await episode(dead, by_turn(Reply("hi")), "add_note", tmp_path)
    finally:
        await dead.close()
    assert traj.stop_reason == "infra_error" and traj.masked and "reset failed" in traj.infra_error


async def test_unreachable_policy_is_a_clear_error(env, tmp_path):
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "nobody", retries=2)
    log = TrajectoryLog(tmp_path / "t.jsonl")
    with pytest.raises(PolicyUnavailable, match=r"cannot reach http://127.0.0.1:9/v1/chat/completions.*2 attempts"):
        await run_episode(policy, env, "add_note", AgentConfig(), log=log)
    await policy.close()
    log.close()
    (record,) = read_trajectories(tmp_path / "t.jsonl")
    assert record.stop_reason == "policy_error" and record.masked


async def test_rate_limits_are_waited_out_and_extra_body_shapes_the_request(monkeypatch):
    """A 429 burst is retried as the server's Retry-After says, not the end of a run; extra_body
    adds fields and its nulls remove ours (OpenAI's reasoning models refuse max_tokens)."""
    from awm.trainer import policy as policy_mod

    slept: list[float] = []

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(policy_mod, "_backoff", sleep)

    def answer(stage, body, index):
        if index < 2:
            return Reply("slow down", status=429, headers={"Retry-After": "7"})
        return Reply("done")

    with ScriptedLLM(answer) as llm:
        policy = OpenAIPolicy(llm.base_url, "m", retries=3,
                              extra_body={"max_tokens": None, "max_completion_tokens": 64})
        reply = await policy.chat([{"role": "user", "content": "hi"}], None)
        await policy.close()
    assert reply.content == "done" and len(llm.requests) == 3
    assert slept == [7.0, 7.0]  # the server's Retry-After, not the backoff's 0.5 and 1.0
    body = llm.requests[-1][1]
    assert "max_tokens" not in body and body["max_completion_tokens"] == 64


async def test_refusing_policy_is_a_clear_error(env, tmp_path):
    with pytest.raises(PolicyUnavailable, match="refused the request: HTTP 401"):
        await episode(env, lambda stage, body, i: Reply(status=401), "add_note", tmp_path)


# vLLM's words for a prompt past max_model_len (OpenAI, SGLang and TGI word it alike)
VLLM_TOO_LONG = ("This model's maximum context length is 4096 tokens. However, you requested 4180 tokens "
                 "(3156 in the messages, 1024 in the completion). Please reduce the length of the messages.")


async def test_a_prompt_past_the_context_window_ends_the_episode_not_the_run(env, tmp_path):
    """The second request is too long: the episode stops there and is verified as it stands."""
    answer = by_turn(Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "body": "milk, eggs"})]),
                     Reply(VLLM_TOO_LONG, status=400))
    traj, requests = await episode(env, answer, "add_note", tmp_path)
    assert traj.stop_reason == "context_exceeded" and len(requests) == 2 and len(traj.turns) == 1
    assert traj.verdict["verdict"] == "complete" and not traj.masked and traj.reward == 1.0
    # other refusals (a wrong model name, a bad key) still stop the run, with the server's words
    with pytest.raises(PolicyUnavailable, match="HTTP 404.*no such model"):
        await episode(env, lambda stage, body, i: Reply("no such model", status=404), "add_note", tmp_path)
    # ... also after the first turn, where an overflow would only end the episode
    later = by_turn(Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "body": "milk, eggs"})]),
                    Reply("tool name is too long", status=400))
    with pytest.raises(PolicyUnavailable, match="HTTP 400.*tool name is too long"):
        await episode(env, later, "add_note", tmp_path)


@pytest.mark.parametrize("body, overflow", [
    (VLLM_TOO_LONG, True),
    ("'max_tokens' or 'max_completion_tokens' is too large: 4096. This model's maximum context length is 4096 "
     "tokens and your request has 20 input tokens", True),  # vLLM, newer
    ("Prompt length of 5000 is longer than the maximum model length of 4096.", True),  # vLLM 0.6
    ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", True),  # SGLang
    ("Input validation error: `inputs` must have less than 4096 tokens. Given: 5000", True),  # TGI
    ("the request exceeds the available context size, try increasing it", True),  # llama.cpp
    ('{"error": {"message": "...", "type": "invalid_request_error", "code": "context_length_exceeded"}}', True),
    ('{"object": "error", "message": "This model\'s maximum context length is 2048 tokens.", "code": 400}', True),
    ("tool name is too long", False),
    ('{"usage": {"prompt_tokens": 12}, "error": {"message": "function name length exceeds 64"}}', False),
    ("Invalid 'messages[1].content': string too long. Expected a string with maximum length 1048576", False),
    ("model 'x' not found", False)])
def test_context_overflow_is_told_from_other_refusals(body, overflow):
    from awm.trainer.policy import context_exceeded

    assert context_exceeded(body) is overflow


@pytest.mark.parametrize("words", [
    VLLM_TOO_LONG,
    "The input (5000 tokens) is longer than the model's context length (4096 tokens).",  # SGLang
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens",  # TGI
    '{"error": {"code": "context_length_exceeded", "message": "..."}}'])  # OpenAI
async def test_a_first_prompt_that_never_fits_stops_the_run(env, tmp_path, words):
    """On the first turn nothing was cut short: the settings (max_tokens, the tool list) can never
    fit, and every episode would end the same way - a clear error, not a run of empty episodes."""
    with pytest.raises(PolicyUnavailable, match="opening prompt of notes/add_note .* does not fit.*lower max_tokens"):
        await episode(env, lambda stage, body, i: Reply(words, status=400), "add_note", tmp_path)


def _awm(*args, home):
    environ = dict(os.environ, AWM_HOME=str(home), COLUMNS="140")
    return subprocess.run([sys.executable, "-m", "awm.cli", *args], capture_output=True, text=True, env=environ,
                          timeout=120)


def test_awm_agent_command(notes, pg, tmp_path):
    answer = by_turn(Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "body": "milk, eggs"})]),
                     Reply("Added it."))
    with ScriptedLLM(answer) as llm:
        result = _awm("agent", "--mcp-url", notes.mcp_url, "--control-url", notes.control_url, "--task", "add_note",
                      "--base-url", llm.base_url, "--model", "scripted", "--out", str(tmp_path / "a.jsonl"),
                      home=pg.root.parent)
    assert result.returncode == 0, result.stderr
    assert "add_note" in result.stdout and "complete" in result.stdout and "notes: +1" in result.stdout
    assert [e["event"] for e in read_events(tmp_path / "a.jsonl")] == ["start", "turn", "turn", "end"]
    down = _awm("agent", "--mcp-url", notes.mcp_url, "--control-url", notes.control_url, "--task", "add_note",
                "--base-url", "http://127.0.0.1:9/v1", "--model", "x", "--out", str(tmp_path / "b.jsonl"),
                home=pg.root.parent)
    assert down.returncode == 3 and "policy endpoint is unavailable" in down.stderr


def _append_from_a_process(path: str, writer: int) -> None:
    log = TrajectoryLog(path)
    for n in range(40):  # lines from 1 KB to ~300 KB: far past any stdio buffer
        log.write("turn", {"writer": writer, "n": n, "payload": chr(65 + writer) * (1024 * (1 + 7 * n))})
    log.close()


def test_processes_appending_to_one_trajectory_log_never_interleave_lines(tmp_path):
    """verl's agent-loop workers are processes that append to one trajectory file: each line is
    one write on an O_APPEND descriptor, so every line reads back whole."""
    import multiprocessing

    path = tmp_path / "shared.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_from_a_process, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    events = list(read_events(path))  # a torn line would not parse
    assert sorted((e["writer"], e["n"]) for e in events) == [(w, n) for w in range(4) for n in range(40)]
    for e in events:
        assert e["payload"] == chr(65 + e["writer"]) * (1024 * (1 + 7 * e["n"]))
