"""The agent loop: one episode of a policy acting on one env instance through MCP.

    reset(task) -> [policy -> tool calls over MCP -> results]* -> verify -> diff -> reward

* Native OpenAI tool calls (``tools`` in the request, ``tool_calls`` in the reply); when a reply
  carries none, calls written as text (``<tool_call>{...}</tool_call>``) are used instead. A reply
  with no call at all is the final answer and ends the episode.
* Malformed calls are answered with an error message (the episode goes on) and counted for the
  format penalty. Tool errors keep the server's class (agent's vs environment's).
* The prompt of every turn is the sliding window of :mod:`awm.trainer.history`, the same one the
  learner uses.
* Every turn is appended to the trajectory log as it finishes (:mod:`awm.trainer.trajectory`).
* Infrastructure failures (instance gone, control API down) end the episode as masked, never as
  the agent's failure; a policy outage raises :class:`~awm.trainer.policy.PolicyUnavailable`. A prompt
  grown past the model's context window ends the episode where it is (``context_exceeded``) and it
  is verified and scored like one out of turns.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from awm.episode import toolcalls
from awm.errorclass import ErrorClass
from awm.episode.reward import RewardConfig
from awm.episode.session import ENV_ERRORS, EnvHandle, EpisodeSession
from awm.postgres.snapshot import MAX_DIFF_ROWS
from awm.trainer import awm_format
from awm.trainer.history import window
from awm.trainer.policy import ContextExceeded, Policy, PolicyReply, PolicyUnavailable
from awm.trainer.trajectory import Trajectory, TrajectoryLog, Turn

__all__ = ["AgentConfig", "DEFAULT_SYSTEM", "EnvHandle", "run_episode"]

DEFAULT_SYSTEM = ("You are an agent that completes tasks by calling tools. You are already logged in "
                  "as the user the task is about. Call tools to look things up and make changes; "
                  "when the task is done, reply with a short final answer and no tool call.")


@dataclass
class AgentConfig:
    max_turns: int = 30
    history_window: int | None = None  # assistant turns kept in the prompt (None: all)
    # native: `tools` parameter (text calls still accepted) | text: prompt only | awm: the reference
    # system's list_tools/call_tool meta-tools, one call per turn, its kind of system prompt
    tool_format: str = "native"
    max_calls_per_turn: int = 8  # further calls in one reply are answered with an error
    tool_result_chars: int = 8000  # longer tool results are cut in the history
    system_prompt: str = DEFAULT_SYSTEM
    verify_reset: bool = False  # checksum (and repair) the snapshot at every reset: slower, certain
    # the paper's early termination: the first format error (a call of a class in
    # reward.format_errors; malformed calls by default) ends the episode, scored reward.format_error
    stop_on_format_error: bool = False
    # After each successful tool call, record the rows it inserted/updated/deleted (before and
    # after; at most this many per table) in its result's "diff" (trainer/calldiff.py): one more
    # control-API round trip per call. 0: off.
    call_diff_rows: int = 50
    # full: the tools as the environment describes them | short: first sentence of each
    # description, parameter schemas without their prose (toolcalls.short_tools; small models)
    tool_descriptions: str = "full"
    # A reply without its <think>...</think> block while the policy thinks (Qwen3 in thinking
    # mode, as the paper trains it) is a format error: the turn records it as ``malformed``, which
    # reward.format_errors scores (and agent.stop_on_format_error stops at), as the paper does.
    require_thinking: bool = False

    def __post_init__(self) -> None:
        # A misspelt format would send the model no tools at all: every episode would fail quietly.
        if self.tool_format not in ("native", "text", "awm"):
            raise ValueError(f"tool_format must be native, text or awm, not {self.tool_format!r}")
        if self.tool_descriptions not in ("full", "short"):
            raise ValueError(f"tool_descriptions must be full or short, not {self.tool_descriptions!r}")
        if self.max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        if self.history_window is not None and self.history_window < 1:
            raise ValueError("history_window must be at least 1 (or unset: the whole history)")
        if not 0 <= self.call_diff_rows <= MAX_DIFF_ROWS:
            raise ValueError(f"call_diff_rows must be from 0 (off) to {MAX_DIFF_ROWS}")

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> AgentConfig:
        return cls(**(data or {}))


TurnHook = Callable[[Trajectory, Turn], None]


async def run_episode(policy: Policy, env: EnvHandle, task_id: str, cfg: AgentConfig | None = None,
                      reward_cfg: RewardConfig | None = None, log: TrajectoryLog | None = None,
                      group_id: str | None = None, sample_index: int = 0,
                      on_turn: TurnHook | None = None) -> Trajectory:
    """Run one episode of ``task_id`` and return its scored trajectory (also written to ``log``).
    The instance's side (reset, calls, verdict, reward, masking) is an
    :class:`~awm.episode.session.EpisodeSession`; this loop owns the policy's turns and the record."""
    cfg = cfg or AgentConfig()
    start = time.perf_counter()
    traj = Trajectory(uuid.uuid4().hex[:16], env.env, task_id, "", policy.name, env.instance, group_id,
                      sample_index, policy.version, history_window=cfg.history_window, started_at=time.time())
    session = EpisodeSession(env, reward_cfg, call_diff_rows=cfg.call_diff_rows)
    timings = {"policy_ms": 0.0, "tools_ms": 0.0}
    try:
        await session.reset(task_id, verify=cfg.verify_reset)
    except ENV_ERRORS as exc:
        return await _finish(traj, session, timings, start, log, abort=f"reset failed: {exc}")
    traj.instruction, traj.pristine = session.instruction, session.pristine
    traj.episode_id = session.episode_id or traj.episode_id
    if log:
        log.start(traj)
    tools = toolcalls.short_tools(env.tools) if cfg.tool_descriptions == "short" else env.tools
    traj.messages = _opening(cfg, env, traj.instruction, tools)
    native_tools = toolcalls.openai_tools(tools) if cfg.tool_format == "native" else None
    traj.tools = native_tools
    traj.stop_reason = "max_turns"
    for index in range(cfg.max_turns):
        context = window(traj.messages, cfg.history_window)
        t0 = time.perf_counter()
        try:
            reply = await policy.chat(context, native_tools)
        except ContextExceeded as exc:
            if index == 0:  # not one long episode: the opening prompt (or max_tokens) never fits
                traj.stop_reason = "policy_error"
                message = (f"the opening prompt of {traj.env}/{traj.task_id} (system, task and tool list) does not "
                           f"fit the model's context with the requested completion length; lower max_tokens or "
                           f"use a model with a longer context: {exc}")
                await _finish(traj, session, timings, start, log, abort=message)
                raise PolicyUnavailable(message) from exc
            traj.stop_reason = "context_exceeded"
            break
        except PolicyUnavailable as exc:
            traj.stop_reason = "policy_error"
            await _finish(traj, session, timings, start, log, abort=f"policy unavailable: {exc}")
            raise
        policy_ms = (time.perf_counter() - t0) * 1000
        timings["policy_ms"] += policy_ms
        traj.policy_version = min(traj.policy_version, reply.version)
        calls, source, assistant = _interpret(reply, index, cfg.tool_format == "awm")
        traj.messages.append(assistant)
        turn = Turn(index, assistant, [c.to_dict() for c in calls], [], source, round(policy_ms, 3), 0.0,
                    reply.version, reply.prompt_tokens, reply.completion_tokens, reply.prompt_ids,
                    reply.completion_ids, reply.logprobs, len(context))
        if cfg.require_thinking and not toolcalls.has_thinking(reply.content):
            session.note_error(ErrorClass.MALFORMED)
            session.note_malformed()
            turn.results.append({"tool_call_id": None, "name": None, "is_error": True,
                                 "error_kind": ErrorClass.MALFORMED.value, "ms": 0.0,
                                 "text": "reply without its <think>...</think> block while thinking is on"})
            if cfg.stop_on_format_error and ErrorClass.MALFORMED in session.reward.format_errors:
                traj.stop_reason = "format_error"  # scored reward.format_error, not verified
                _record_turn(traj, turn, log, on_turn)
                return await _finish(traj, session, timings, start, log,
                                     verdict={"verdict": "format_error", "reason": "format error: no <think> block"})
        if not calls:
            traj.final_answer = toolcalls.strip_calls(toolcalls.strip_thinking(reply.content))
            traj.stop_reason = "answer"
            _record_turn(traj, turn, log, on_turn)
            break
        await _execute(session, calls, turn, cfg)
        timings["tools_ms"] += turn.tools_ms
        if session.infra_error is not None:  # the instance failed us: masked, not verified
            _record_turn(traj, turn, log, on_turn)
            return await _finish(traj, session, timings, start, log)
        traj.messages += _result_messages(turn, source, cfg)
        _record_turn(traj, turn, log, on_turn)
        kind = _format_error(turn, session.reward) if cfg.stop_on_format_error else None
        if kind is not None:
            traj.stop_reason = "format_error"  # scored reward.format_error, not verified
            return await _finish(traj, session, timings, start, log,
                                 verdict={"verdict": "format_error", "reason": f"format error: {kind} tool call"})
    return await _finish(traj, session, timings, start, log, answer=traj.final_answer)


def _opening(cfg: AgentConfig, env: EnvHandle, instruction: str,
             tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if cfg.tool_format == "awm":  # the reference's own kind of prompt, its meta-tools in it
        return [{"role": "system", "content": awm_format.system_prompt(env.scenario)},
                {"role": "user", "content": instruction}]
    system = cfg.system_prompt
    if env.scenario:
        system += "\n\nEnvironment: " + env.scenario.strip()
    if cfg.tool_format == "text":
        system += "\n\n" + toolcalls.text_tools_prompt(tools)
    return [{"role": "system", "content": system}, {"role": "user", "content": instruction}]


def _interpret(reply: PolicyReply, index: int, awm: bool = False) -> tuple[list[toolcalls.Parsed], str, dict[str, Any]]:
    """The calls in a reply, where they were found, and the assistant message for the history
    (thinking stays in it: Qwen3-style templates drop or keep it as the model was trained)."""
    prefix = f"call_{index}"
    if reply.tool_calls and not awm:
        calls = toolcalls.parse_native(reply.tool_calls, prefix)
        # Keep ids consistent between the assistant message and the tool results.
        raw = []
        for call, original in zip(calls, reply.tool_calls):
            entry = dict(original) if isinstance(original, dict) else {}
            entry["id"] = call.id
            entry.setdefault("type", "function")
            if isinstance(call, toolcalls.MalformedCall):
                # Servers re-parse arguments from the history and refuse invalid JSON there; the
                # raw text stays in the turn record and the tool message names the error.
                function = entry.get("function") if isinstance(entry.get("function"), dict) else {}
                entry["function"] = {"name": str(function.get("name") or "invalid"), "arguments": "{}"}
            raw.append(entry)
        return calls, "native", {"role": "assistant", "content": reply.content, "tool_calls": raw}
    calls = toolcalls.parse_text(toolcalls.strip_thinking(reply.content), prefix)
    return calls, "text" if calls else "none", {"role": "assistant", "content": reply.content or ""}


async def _execute(session: EpisodeSession, calls: list[toolcalls.Parsed], turn: Turn, cfg: AgentConfig) -> None:
    awm = cfg.tool_format == "awm"
    limit = 1 if awm else cfg.max_calls_per_turn  # the reference executes one call per turn
    for n, call in enumerate(calls):
        if awm and n < limit:
            call = _awm_call(session, call, turn, n, cfg.tool_descriptions == "short")
            if call is None:
                continue
        if isinstance(call, toolcalls.MalformedCall):
            session.note_error(ErrorClass.MALFORMED)
            session.note_malformed()
            turn.results.append({"tool_call_id": call.id, "name": None, "is_error": True,
                                 "error_kind": ErrorClass.MALFORMED.value, "text": f"malformed tool call: {call.error}", "ms": 0.0})
            continue
        if n >= limit:
            session.note_error(ErrorClass.TOO_MANY_CALLS)
            turn.results.append({"tool_call_id": call.id, "name": call.name, "is_error": True,
                                 "error_kind": ErrorClass.TOO_MANY_CALLS.value,
                                 "text": f"not executed: at most {limit} call(s) per turn", "ms": 0.0})
            continue
        result = await session.call_tool(call.name, call.arguments)
        turn.tools_ms += result.ms
        turn.results.append(result.record(call.id))
        if session.infra_error is not None:  # the rest of the turn is not run on a broken instance
            break
    turn.tools_ms = round(turn.tools_ms, 3)


def _awm_call(session: EpisodeSession, call: toolcalls.Parsed, turn: Turn, n: int,
              short: bool = False) -> toolcalls.Parsed | None:
    """A meta-tool call of the AWM format: ``list_tools`` is answered here (None: done), ``call_tool``
    becomes the real tool's call, anything else is an unknown tool (the agent's error)."""
    resolved = awm_format.resolve(call)
    if isinstance(resolved, toolcalls.MalformedCall):
        turn.tool_calls[n] = {**resolved.to_dict()}
        return resolved
    kind, real = resolved
    if kind == "list":
        turn.results.append({"tool_call_id": call.id, "name": awm_format.LIST_TOOLS, "is_error": False,
                             "error_kind": None, "text": awm_format.list_tools_text(
                                 toolcalls.short_tools(session.tools) if short else session.tools), "ms": 0.0})
        return None
    if kind == "unknown" or real is None or real.name not in {t["name"] for t in session.tools}:
        name = real.name if real is not None else getattr(call, "name", "")
        session.note_error(ErrorClass.UNKNOWN_TOOL)
        turn.results.append({"tool_call_id": call.id, "name": name, "is_error": True,
                             "error_kind": ErrorClass.UNKNOWN_TOOL.value,
                             "text": f"Unknown tool {name!r}: list_tools names the tools, call_tool calls one",
                             "ms": 0.0})
        return None
    turn.tool_calls[n] = {**real.to_dict(), "via": awm_format.CALL_TOOL}
    return real


def _format_error(turn: Turn, reward: RewardConfig) -> str | None:
    """The class of the turn's first result that is a format error (reward.format_errors), if any."""
    for result in turn.results:
        if result.get("error_kind") in reward.format_errors:
            return str(result["error_kind"])
    return None


def _result_messages(turn: Turn, source: str, cfg: AgentConfig) -> list[dict[str, Any]]:
    """Tool results for the history: role ``tool`` for native calls, one user message otherwise."""
    def body(result: dict[str, Any]) -> str:
        text = result["text"] if len(result["text"]) <= cfg.tool_result_chars else (
            result["text"][:cfg.tool_result_chars] + f"... [{len(result['text']) - cfg.tool_result_chars} chars cut]")
        return f"Error: {text}" if result["is_error"] else text

    answered = [r for r in turn.results if r["tool_call_id"] is not None]  # not the reply's own format error
    if source == "native":
        return [{"role": "tool", "tool_call_id": r["tool_call_id"], "content": body(r)} for r in answered]
    blocks = "\n".join(f"<tool_response>\n{body(r)}\n</tool_response>" for r in answered)
    return [{"role": "user", "content": blocks}]


def _record_turn(traj: Trajectory, turn: Turn, log: TrajectoryLog | None, hook: TurnHook | None) -> None:
    traj.turns.append(turn)
    if log:
        log.turn(traj, turn)
    if hook:
        hook(traj, turn)


async def _finish(traj: Trajectory, session: EpisodeSession, timings: dict[str, float], start: float,
                  log: TrajectoryLog | None, *, answer: str | None = None, abort: str | None = None,
                  verdict: dict[str, Any] | None = None) -> Trajectory:
    """End the episode through the session (verify, or ``abort`` as the environment's failure, or
    the given ``verdict``) and copy its verdict, reward and masking into the trajectory."""
    if abort is not None:
        outcome = await session.abort(abort)
    else:
        outcome = await session.finish(answer, traj.stop_reason, verdict=verdict, diff=True)
    if outcome.infra_error and traj.stop_reason != "policy_error":
        traj.stop_reason = "infra_error"
    traj.infra_error = outcome.infra_error
    traj.verdict = outcome.verdict
    traj.diff = session.diff
    traj.reward = 0.0 if outcome.reward is None else outcome.reward
    traj.masked, traj.mask_reason, traj.reward_components = outcome.masked, outcome.mask_reason, outcome.components
    timings = {"reset_ms": session.timings["reset_ms"], **timings, "verify_ms": session.timings["verify_ms"],
               "wall_ms": (time.perf_counter() - start) * 1000}
    traj.timings = {k: round(v, 3) for k, v in timings.items()}
    if log:
        log.end(traj)
    return traj
