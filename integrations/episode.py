"""One awm episode, step by step, on one claimed instance: the part every step-wise RL framework
adapter shares (OpenEnv's ``step``, SkyRL's ``BaseTextEnv.step``, verl's agent loop).

    start(task) -> call_tool(...)* -> finish(answer) -> Outcome(reward | None when masked)

The framework owns generation; the episode owns the environment side: reset to a task's
snapshot, tool calls through the instance's MCP server (errors keep awm's class), the verdict of
the task's verifier or LLM judge, and the reward from :func:`awm.trainer.reward.score` - so a
failure that is the environment's (a crashed tool, a verifier error, an instance that stopped
answering) is *masked* (``reward`` None), never charged to the policy, in every framework alike.

:meth:`Episode.act` is the text form for frameworks whose policy writes plain text: the reply's
``<tool_call>{...}</tool_call>`` blocks are executed and answered with ``<tool_response>``
blocks, a reply without a call is the final answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from awm.client import ControlApiError, ControlClient, McpError, McpSession, ToolOutcome
from awm.integrations.instances import Slot
from awm.trainer import toolcalls
from awm.trainer.reward import RewardConfig, score

_ENV_ERRORS = (McpError, ControlApiError, httpx.HTTPError, ValueError)


@dataclass
class Outcome:
    """How an episode ended: ``reward`` is None when it is masked (the environment's failure)."""

    reward: float | None
    masked: bool
    mask_reason: str | None
    verdict: dict[str, Any]
    components: dict[str, float] = field(default_factory=dict)
    ended_by: str = "answer"


@dataclass
class TextStep:
    """The answer to one text reply: tool responses to show the policy, or the episode's end."""

    observation: str
    done: bool
    outcome: Outcome | None = None


class Episode:
    """An episode on ``slot``. Not reusable: one episode, then :meth:`close` (the caller releases
    the slot to wherever it came from)."""

    def __init__(self, slot: Slot, reward: RewardConfig | None = None, max_steps: int = 30,
                 max_calls_per_reply: int = 8, timeout_s: float = 60.0) -> None:
        self.slot = slot
        self.reward = reward or RewardConfig()
        self.max_steps, self.max_calls_per_reply = max_steps, max_calls_per_reply
        self.mcp = McpSession(slot.mcp_url, timeout=timeout_s)
        self.control = ControlClient(slot.control_url, timeout=timeout_s)
        self.task_id: str | None = None
        self.instruction = ""
        self.tools: list[dict[str, Any]] = []
        self.steps = 0
        self.error_kinds: list[str] = []
        self.malformed = 0
        self.infra_error: str | None = None
        self.outcome: Outcome | None = None

    async def start(self, task_id: str | None = None, seed: int | None = None) -> dict[str, Any]:
        """Connect, reset the instance to ``task_id`` (a served task picked by ``seed`` when None)
        and return the reset's answer (``instruction``, ``reset_ms``, ``ungated``, ...)."""
        await self.mcp.initialize()
        if task_id is None:
            served = [t["id"] for t in (await self.control.info())["tasks"] if t.get("served", True)]
            if not served:
                raise ValueError(f"environment {self.slot.env!r} serves no task")
            task_id = served[(seed or 0) % len(served)]
        reset = await self.control.reset(task_id)
        self.task_id, self.instruction = task_id, reset.get("instruction") or ""
        self.tools = await self.mcp.list_tools()
        return reset

    @property
    def exhausted(self) -> bool:
        """Out of tool calls (``max_steps``) or broken: the next step must end the episode."""
        return self.steps >= self.max_steps or self.infra_error is not None

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolOutcome:
        """One tool call. A transport failure is not raised: it becomes an ``unavailable`` error
        result (masking the episode), so a framework's loop needs no awm-specific handling."""
        self.steps += 1
        try:
            out = await self.mcp.call_tool(name, arguments or {})
        except McpError as exc:
            if "(code -32602)" in str(exc):  # invalid params: the agent's
                out = ToolOutcome(True, f"invalid_arguments: {exc}")
            else:
                self.infra_error = f"tool call {name} failed: {exc}"
                out = ToolOutcome(True, f"unavailable: {exc}")
        if out.is_error:
            self.error_kinds.append(out.error_kind or "tool_error")
        return out

    async def finish(self, answer: str | None, ended_by: str = "answer") -> Outcome:
        """Verify (unless the instance already failed us) and score; idempotent."""
        if self.outcome is not None:
            return self.outcome
        verdict = None
        if self.infra_error is None:
            try:
                verdict = await self.control.verify(answer)
            except _ENV_ERRORS as exc:
                self.infra_error = f"verify failed: {exc}"
        result = score(verdict, self.error_kinds, self.malformed, self.infra_error, self.reward)
        self.outcome = Outcome(None if result.masked else result.reward, result.masked, result.mask_reason,
                               verdict or {"verdict": "error", "error_kind": "infra", "reason": self.infra_error},
                               result.components, ended_by)
        return self.outcome

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
        blocks = []
        for n, call in enumerate(calls):
            if isinstance(call, toolcalls.MalformedCall):
                self.malformed += 1
                body = f"Error: malformed tool call: {call.error}"
            elif n >= self.max_calls_per_reply:
                body = f"Error: not executed: at most {self.max_calls_per_reply} calls per reply"
            else:
                out = await self.call_tool(call.name, call.arguments)
                body = f"Error: {out.text}" if out.is_error else out.text
            blocks.append(f"<tool_response>\n{body}\n</tool_response>")
        observation = "\n".join(blocks)
        if self.exhausted:
            why = "infrastructure" if self.infra_error else f"{self.max_steps} tool calls without an answer"
            return TextStep(observation, True, await self.finish(None, why))
        return TextStep(observation, False)

    async def close(self) -> None:
        await self.mcp.close()
        await self.control.close()
