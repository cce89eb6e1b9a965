"""An OpenEnv environment server in front of awm instances (`awm openenv serve`).

OpenEnv (``openenv-core``) defines the environment API that TRL, SkyRL, torchforge and others
speak: WebSocket sessions at ``/ws`` (reset / step / state), the same over HTTP, a schema and a
health route. This module implements OpenEnv's :class:`Environment` interface on awm and lets
OpenEnv's own server (``openenv.core.env_server.create_app``) serve it, so the protocol is
OpenEnv's, not a re-implementation of it.

One OpenEnv session holds one awm instance while an episode runs:

* ``reset(task_id=..., env=...)`` claims an instance of that environment (waiting for a free one),
  resets it to the task and observes the instruction and the tools;
* ``step`` takes OpenEnv's MCP actions - ``ListToolsAction``, ``CallToolAction`` (one tool call
  through awm's MCP server; errors come back with their awm class) - or :class:`AwmAction` with
  ``answer``: the final answer, which ends the episode: awm verifies it (code verifier or LLM
  judge) and the observation carries the reward (``trainer.reward``: failures that are
  the environment's are masked: reward ``None``, ``metadata.masked``);
* ``max_steps`` tool calls without an answer end the episode too (verified without an answer).

The instance goes back to the pool when the episode ends or the session closes.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any, Literal

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                               ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from awm.client import ControlClient, McpSession
from trainer.reward import RewardConfig, score


class AwmAction(Action):
    """One step: OpenEnv's MCP actions (``{"type": "list_tools"}``, ``{"type": "call_tool",
    "tool_name": ..., "arguments": {...}}``, as OpenEnv's MCP clients send them) or the final
    answer (``{"answer": ...}``), which ends and verifies the episode."""

    type: Literal["list_tools", "call_tool", "answer"] = "answer"
    tool_name: str | None = Field(default=None, description="call_tool: the tool.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: its arguments.")
    answer: str | None = Field(default=None, description="answer: the final answer.")


class AwmObservation(Observation):
    env: str = ""
    task_id: str | None = None
    instruction: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list, description="On reset: the tools (MCP schemas).")
    verdict: dict[str, Any] | None = Field(default=None, description="When done: awm's /verify answer.")


class AwmState(State):
    env: str | None = None
    task_id: str | None = None
    instance: str | None = None


@dataclass(frozen=True)
class Slot:
    env: str
    name: str
    mcp_url: str
    control_url: str


class InstancePool:
    """The instances a server hands to sessions, per environment (a local fleet's, or claimed)."""

    def __init__(self, slots: list[Slot], max_steps: int = 30, reward: RewardConfig | None = None) -> None:
        self.queues: dict[str, asyncio.Queue[Slot]] = {}
        for slot in slots:
            self.queues.setdefault(slot.env, asyncio.Queue()).put_nowait(slot)
        self.size = len(slots)
        self.max_steps = max_steps
        self.reward = reward or RewardConfig()
        self.tasks: dict[str, list[str]] = {}  # env -> task ids, for a reset that names none
        self._turn = itertools.count()

    def envs(self) -> list[str]:
        return sorted(self.queues)

    async def claim(self, env: str | None) -> Slot:
        if env is None:
            envs = self.envs()
            env = envs[next(self._turn) % len(envs)]
        if env not in self.queues:
            raise ValueError(f"unknown environment {env!r} (serving: {', '.join(self.envs())})")
        return await self.queues[env].get()

    def release(self, slot: Slot) -> None:
        self.queues[slot.env].put_nowait(slot)


class AwmEnvironment(Environment):
    """One OpenEnv session on awm. Cheap to construct (OpenEnv builds throwaway ones to ask
    questions): it claims an instance only on reset."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, pool: InstancePool) -> None:
        super().__init__()
        self.pool = pool
        self.slot: Slot | None = None
        self.control: ControlClient | None = None
        self.mcp: McpSession | None = None
        self._state = AwmState()
        self._error_kinds: list[str] = []
        self._done = False

    @property
    def state(self) -> AwmState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="awm", version="1.0.0", description=(
            "awm environments (database-backed MCP tools, verifiers, LLM judge): " + ", ".join(self.pool.envs())))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AwmObservation:
        raise RuntimeError("awm's OpenEnv environment is asynchronous: use reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("awm's OpenEnv environment is asynchronous: use step_async")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          task_id: str | None = None, env: str | None = None, **kwargs: Any) -> AwmObservation:
        await self._release()
        self.slot = await self.pool.claim(env)
        self.control = ControlClient(self.slot.control_url)
        self.mcp = await McpSession(self.slot.mcp_url).__aenter__()
        if task_id is None:
            info = await self.control.info()
            served = [t["id"] for t in info["tasks"] if t.get("served", True)]
            if not served:
                raise ValueError(f"environment {self.slot.env!r} serves no task")
            task_id = served[(seed or 0) % len(served)]
        episode = await self.control.reset(task_id)
        tools = [{"name": t["name"], "description": t.get("description", ""), "input_schema": t.get("inputSchema", {})}
                 for t in await self.mcp.list_tools()]
        self._state = AwmState(episode_id=episode_id or episode["episode_id"], step_count=0, env=self.slot.env,
                               task_id=task_id, instance=self.slot.name)
        self._error_kinds, self._done = [], False
        return AwmObservation(env=self.slot.env, task_id=task_id, instruction=episode["instruction"], tools=tools,
                              metadata={"reset_ms": episode["reset_ms"], "ungated": episode.get("ungated", False)})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        if self.mcp is None or self.control is None or self._done:
            raise RuntimeError("no episode: reset first")
        if isinstance(action, AwmAction) and action.type != "answer":  # the MCP shapes, as OpenEnv's
            action = (ListToolsAction() if action.type == "list_tools" else  # own types
                      CallToolAction(tool_name=action.tool_name or "", arguments=action.arguments))
        if isinstance(action, ListToolsAction):
            tools = [Tool(name=t["name"], description=t.get("description") or "", input_schema=t.get("inputSchema", {}))
                     for t in await self.mcp.list_tools()]
            return ListToolsObservation(tools=tools)
        if isinstance(action, CallToolAction):
            self._state.step_count += 1
            out = await self.mcp.call_tool(action.tool_name, action.arguments)
            if out.is_error:
                self._error_kinds.append(out.error_kind or "tool_error")
            observation = CallToolObservation(
                tool_name=action.tool_name, result=out.structured if out.structured is not None else out.text,
                error=ToolError(error_type=_error_type(out.error_kind), message=out.text) if out.is_error else None,
                metadata={"error_kind": out.error_kind} if out.is_error else {})
            if self._state.step_count >= self.pool.max_steps:
                return await self._finish(None, f"{self.pool.max_steps} tool calls without an answer")
            return observation
        if isinstance(action, AwmAction):
            return await self._finish(action.answer, "answer")
        raise ValueError(f"unsupported action {type(action).__name__}: use list_tools, call_tool or answer")

    async def _finish(self, answer: str | None, why: str) -> AwmObservation:
        assert self.control is not None and self.slot is not None
        verdict = await self.control.verify(answer)
        result = score(verdict, self._error_kinds, 0, None, self.pool.reward)
        self._done = True
        observation = AwmObservation(
            done=True, reward=None if result.masked else result.reward, env=self.slot.env,
            task_id=self._state.task_id, verdict=verdict,
            metadata={"masked": result.masked, "mask_reason": result.mask_reason, "ended_by": why,
                      "reward_components": result.components})
        await self._release()
        return observation

    async def _release(self) -> None:
        if self.mcp is not None:
            await self.mcp.__aexit__(None, None, None)
        if self.control is not None:
            await self.control.close()
        if self.slot is not None:
            self.pool.release(self.slot)
        self.slot, self.control, self.mcp = None, None, None

    def close(self) -> None:
        if self.slot is not None:  # a session closed mid-episode: its instance goes back
            try:
                asyncio.get_running_loop().create_task(self._release())
            except RuntimeError:
                self.pool.release(self.slot)
                self.slot = None


def _error_type(kind: str | None) -> ToolErrorType:
    return {"invalid_arguments": ToolErrorType.INVALID_ARGS, "timeout": ToolErrorType.TIMEOUT,
            "unavailable": ToolErrorType.TRANSPORT_ERROR}.get(kind or "", ToolErrorType.EXECUTION_ERROR)


def build_app(pool: InstancePool) -> Any:
    """OpenEnv's own FastAPI app (HTTP + /ws) serving awm sessions from ``pool``."""
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(lambda: AwmEnvironment(pool), AwmAction, AwmObservation,
                              max_concurrent_envs=max(pool.size, 1))
