"""One episode on one instance, from the environment's side: the part the trainer's agent loop,
the framework adapters (OpenEnv, TRL, verl, SkyRL) and the playground share.

    reset(task) -> call_tool(...)* -> finish(answer) -> Outcome(reward | None when masked)

Whoever drives the episode (a policy, a framework's generation, a person) owns the turns; the
session owns what happens to the instance and how it is judged:

* :meth:`EpisodeSession.reset` - the instance back to the task's snapshot (its instruction);
* :meth:`EpisodeSession.call_tool` - one call through the instance's MCP server. Its error keeps
  awm's class (the agent's ``invalid_arguments`` / ``tool_error`` versus the environment's
  ``tool_crashed`` / ``timeout`` / ``unavailable``); a transport failure is not raised but
  recorded as the episode's ``infra_error`` (an ``unavailable`` result), so no caller needs
  awm-specific error handling. With ``call_diff_rows`` each successful call also records the
  rows it changed (:mod:`awm.episode.calldiff`);
* :meth:`EpisodeSession.finish` - the verdict of the task's verifier or LLM judge and the reward
  of :func:`awm.episode.reward.score`: a failure that is the environment's (a crashed tool, a
  verifier error, an instance that stopped answering) *masks* the episode (``reward`` None),
  never charged to the policy, in every framework alike.

:meth:`EpisodeSession.act` is the text form for frameworks whose policy writes plain text: the
reply's ``<tool_call>{...}</tool_call>`` blocks are executed and answered with ``<tool_response>``
blocks, a reply without a call is the final answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from awm.client import ControlApiError, ControlClient, DeadlineExceeded, McpError, McpSession
from awm.episode import toolcalls
from awm.errorclass import ErrorClass
from awm.episode.calldiff import DiffTracker
from awm.episode.reward import RewardConfig, score

# What the environment (not the agent) raises: the episode is masked, the instance checked.
ENV_ERRORS = (McpError, ControlApiError, httpx.HTTPError, ValueError)


@dataclass
class EnvHandle:
    """The two clients of one instance (MCP for the agent, control for us) and its tool list.
    A source keeps it connected between episodes (one handshake per instance, not per episode)."""

    mcp: McpSession
    control: ControlClient
    env: str = ""
    instance: str = ""
    scenario: str = ""  # environment description for the system prompt, when known
    tools: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    async def connect(cls, mcp_url: str, control_url: str, env: str = "", instance: str = "",
                      scenario: str = "", timeout: float | None = None, control: ControlClient | None = None) -> EnvHandle:
        """``control``: a control client already open to the instance (the handle owns it from
        here, closing it if the connect fails). ``timeout``: the deadline of every request to
        the instance (:func:`awm.client.env_deadline_s`, ``AWM_ENV_DEADLINE_S``, when None)."""
        mcp = McpSession(mcp_url, timeout=timeout)
        control = control or ControlClient(control_url, timeout=timeout)
        try:
            await mcp.initialize()
            tools = await mcp.list_tools()
            if not env:
                info = await control.info()
                env, instance = info.get("env", ""), info.get("instance", "")
        except BaseException:
            await mcp.close()
            await control.close()
            raise
        return cls(mcp, control, env, instance, scenario, tools)

    async def renew(self, env: str, scenario: str = "") -> None:
        """After the instance switched to ``env``: a new MCP session and its tools. The switch
        ended the old session on the server, so it is not ended again; the connections stay."""
        self.mcp.forget_session()
        await self.mcp.initialize()
        self.tools = await self.mcp.list_tools()
        self.env, self.scenario = env, scenario

    async def close(self) -> None:
        await self.mcp.close()
        await self.control.close()


@dataclass
class CallResult:
    """One tool call as the episode records it (``diff``: the rows it changed, when tracked)."""

    name: str | None
    is_error: bool
    error_kind: str | None
    text: str
    ms: float = 0.0
    structured: Any = None
    diff: dict[str, Any] | None = None
    diff_error: str | None = None

    def record(self, call_id: str | None = None) -> dict[str, Any]:
        """The trajectory's form of the result (the keys its readers know)."""
        out: dict[str, Any] = {"tool_call_id": call_id, "name": self.name, "is_error": self.is_error,
                               "error_kind": self.error_kind, "text": self.text, "ms": round(self.ms, 3)}
        if self.diff is not None:
            out["diff"] = self.diff
        if self.diff_error is not None:
            out["diff_error"] = self.diff_error
        return out


@dataclass
class Outcome:
    """How an episode ended: ``reward`` is None when it is masked (the environment's failure)."""

    reward: float | None
    masked: bool
    mask_reason: str | None
    verdict: dict[str, Any]
    components: dict[str, float] = field(default_factory=dict)
    ended_by: str = "answer"
    infra_error: str | None = None


@dataclass
class TextStep:
    """The answer to one text reply: tool responses to show the policy, or the episode's end;
    ``calls`` and ``results`` are the reply's calls and their results as a trajectory records
    them (the adapters' episode logs: awm.integrations.episode_log)."""

    observation: str
    done: bool
    outcome: Outcome | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)


class EpisodeSession:
    """Episodes on one connected instance (``handle``), one at a time: :meth:`reset` starts the
    next one (the counters start again), :meth:`finish` ends it. The caller gives the instance
    back to its source; ``healthy`` says whether it may be handed out again at once."""

    def __init__(self, handle: EnvHandle, reward: RewardConfig | None = None, max_steps: int | None = None,
                 max_calls_per_reply: int = 8, call_diff_rows: int = 0) -> None:
        self.handle = handle
        self.reward = reward or RewardConfig()
        self.max_steps, self.max_calls_per_reply = max_steps, max_calls_per_reply
        self.call_diff_rows = call_diff_rows
        self._clear()

    def _clear(self) -> None:
        self.task_id: str | None = None
        self.instruction = ""
        self.episode_id: str | None = None
        self.pristine: Any = None
        self.steps = 0
        self.error_kinds: list[str] = []
        self.malformed = 0
        self.infra_error: str | None = None
        self.outcome: Outcome | None = None
        self.diff: dict[str, Any] = {}
        self.timings = {"reset_ms": 0.0, "verify_ms": 0.0}
        self.tracker = DiffTracker(self.call_diff_rows) if self.call_diff_rows else None

    @property
    def env(self) -> str:
        return self.handle.env

    @property
    def instance(self) -> str:
        return self.handle.instance

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.handle.tools

    @property
    def control(self) -> ControlClient:
        return self.handle.control

    @property
    def mcp(self) -> McpSession:
        return self.handle.mcp

    @property
    def healthy(self) -> bool:
        """Whether the instance served the episode (else its source checks it before reuse)."""
        return self.infra_error is None

    async def reset(self, task_id: str | None = None, seed: int | None = None, verify: bool = False,
                    untasked: bool = False) -> dict[str, Any]:
        """Reset the instance to ``task_id`` (a served task picked by ``seed`` when None) and
        return the reset's answer (``instruction``, ``reset_ms``, ``episode_id``, ``ungated``, ...).
        ``untasked``: an episode of no task (the snapshot, a free-form instruction of the caller's):
        nothing to verify. The environment's errors (:data:`ENV_ERRORS`) are raised: the caller
        decides whether a failed reset ends the episode (:meth:`abort`) or the request."""
        self._clear()
        if task_id is None and not untasked:
            served = [t["id"] for t in (await self.control.info())["tasks"] if t.get("served", True)]
            if not served:
                raise ValueError(f"environment {self.env!r} serves no task")
            task_id = served[(seed or 0) % len(served)]
        t0 = time.perf_counter()
        reset = await self.control.reset(task_id, verify=verify)
        self.timings["reset_ms"] = (time.perf_counter() - t0) * 1000
        self.task_id, self.instruction = task_id, reset.get("instruction") or ""
        self.episode_id, self.pristine = reset.get("episode_id"), reset.get("pristine")
        return reset

    @property
    def exhausted(self) -> bool:
        """Out of tool calls (``max_steps``) or broken: the next step must end the episode."""
        return (self.max_steps is not None and self.steps >= self.max_steps) or self.infra_error is not None

    def note_error(self, kind: str) -> None:
        """A call answered without reaching the instance (a malformed call, one past the limit,
        an unknown meta-tool): its class counts for the reward like a tool's."""
        self.error_kinds.append(kind)

    def note_malformed(self) -> None:
        self.malformed += 1

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> CallResult:
        """One tool call. Invalid arguments (JSON-RPC -32602) are the agent's; any other MCP or
        transport failure (a deadline passed included) is the environment's: it becomes an
        ``unavailable`` result and the episode's ``infra_error`` (masked). Once the instance has
        failed the episode, later calls are not sent: each would wait out the deadline again on a
        hung server (a reply of several calls, the text form's :meth:`act`), and the episode is
        masked whatever they answer."""
        self.steps += 1
        if self.infra_error is not None:
            self.error_kinds.append(ErrorClass.UNAVAILABLE)
            return CallResult(name, True, ErrorClass.UNAVAILABLE,
                              f"unavailable: not sent, the instance failed this episode ({self.infra_error})"[:500])
        t0 = time.perf_counter()
        try:
            out = await self.mcp.call_tool(name, arguments or {})
        except McpError as exc:
            if "(code -32602)" in str(exc):
                result = CallResult(name, True, ErrorClass.INVALID_ARGUMENTS, str(exc))
            else:
                self.infra_error = self.infra_error or f"tool call {name} failed: {exc}"
                result = CallResult(name, True, ErrorClass.UNAVAILABLE, f"unavailable: {exc}")
            self.error_kinds.append(result.error_kind or ErrorClass.TOOL_ERROR)
            return result
        result = CallResult(name, out.is_error, out.error_kind, out.text, (time.perf_counter() - t0) * 1000,
                            out.structured)
        if out.is_error:
            self.error_kinds.append(out.error_kind or ErrorClass.TOOL_ERROR)
        elif self.tracker is not None:  # a failed call's writes are rolled back: nothing to record
            try:
                result.diff = await self.tracker.after_call(self.control)
            except DeadlineExceeded as exc:  # the instance hangs: the next request would wait it out again
                result.diff_error = str(exc)
                self.infra_error = self.infra_error or f"call diff after {name} failed: {exc}"
            except ENV_ERRORS as exc:  # only the record is lost: the call itself succeeded
                result.diff_error = str(exc)
        return result

    async def finish(self, answer: str | None, ended_by: str = "answer", *, verdict: dict[str, Any] | None = None,
                     diff: bool = False) -> Outcome:
        """Verify ``answer`` (unless the instance already failed us, or ``verdict`` is given:
        an episode ended early, e.g. on a malformed call) and score; idempotent. ``diff``: also
        fetch what the episode changed in the database (:attr:`diff`)."""
        if self.outcome is None:
            self.outcome = await self.verify(answer, ended_by, verdict=verdict, diff=diff)
        return self.outcome

    async def verify(self, answer: str | None, ended_by: str = "answer", *, kind: str | None = None,
                     verdict: dict[str, Any] | None = None, diff: bool = False) -> Outcome:
        """The outcome if the episode ended now, without ending it (OpenEnv's AWM protocol verifies
        as often as its client asks): :meth:`finish` is this, once. ``kind``: by the task's ``code``
        or ``judge`` verifier instead of the one it is served with."""
        if verdict is None and self.infra_error is None:
            try:
                t0 = time.perf_counter()
                verdict = await self.control.verify(answer, kind)
                self.timings["verify_ms"] = (time.perf_counter() - t0) * 1000
                if diff:
                    self.diff = (await self.control.diff()).get("tables", {})
            except ENV_ERRORS as exc:
                verdict, self.infra_error = None, f"verify failed: {exc}"
        if self.infra_error is not None:
            verdict = None
        result = score(verdict, self.error_kinds, self.malformed, self.infra_error, self.reward)
        return Outcome(None if result.masked else result.reward, result.masked, result.mask_reason,
                       verdict or {"verdict": "error", "error_kind": "infra", "reason": self.infra_error or ""},
                       result.components, "infrastructure" if self.infra_error else ended_by, self.infra_error)

    async def abort(self, reason: str) -> Outcome:
        """End the episode as the environment's failure (e.g. its reset did not go through)."""
        self.infra_error = self.infra_error or reason
        return await self.finish(None, "infrastructure")

    async def act(self, text: str) -> TextStep:
        """One text reply of the policy: run its tool calls, or end the episode on an answer."""
        calls = toolcalls.parse_text(toolcalls.strip_thinking(text), f"call_{self.steps}")
        if not calls:
            answer = toolcalls.strip_calls(toolcalls.strip_thinking(text))
            return TextStep("", True, await self.finish(answer))
        blocks, results = [], []
        for n, call in enumerate(calls):
            if isinstance(call, toolcalls.MalformedCall):  # recorded as the trainer's agent loop does
                self.note_error(ErrorClass.MALFORMED)
                self.note_malformed()
                out = CallResult(None, True, ErrorClass.MALFORMED, f"malformed tool call: {call.error}")
            elif n >= self.max_calls_per_reply:
                self.note_error(ErrorClass.TOO_MANY_CALLS)
                out = CallResult(call.name, True, ErrorClass.TOO_MANY_CALLS,
                                 f"not executed: at most {self.max_calls_per_reply} calls per reply")
            else:
                out = await self.call_tool(call.name, call.arguments)
            body = f"Error: {out.text}" if out.is_error else out.text
            blocks.append(f"<tool_response>\n{body}\n</tool_response>")
            results.append(out.record(call.id))
        observation = "\n".join(blocks)
        records = [c.to_dict() for c in calls]
        if self.exhausted:
            why = "infrastructure" if self.infra_error else f"{self.max_steps} tool calls without an answer"
            return TextStep(observation, True, await self.finish(None, why), records, results)
        return TextStep(observation, False, calls=records, results=results)
