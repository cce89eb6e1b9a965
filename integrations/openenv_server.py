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
  judge) and the observation carries the reward (``awm.trainer.reward``: failures that are
  the environment's are masked: reward ``None``, ``metadata.masked``);
* ``max_steps`` tool calls without an answer end the episode too (verified without an answer).

The instance goes back to the pool when the episode ends or the session closes.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                               ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from awm.integrations.episode import Episode, Outcome
from awm.integrations.instances import InstancePool, Slot

__all__ = ["AwmAction", "AwmEnvironment", "AwmObservation", "InstancePool", "Slot", "build_app"]


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


class AwmEnvironment(Environment):
    """One OpenEnv session on awm. Cheap to construct (OpenEnv builds throwaway ones to ask
    questions): it claims an instance only on reset."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, pool: InstancePool) -> None:
        super().__init__()
        self.pool = pool
        self.episode: Episode | None = None
        self._state = AwmState()

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
        slot = await self.pool.claim(env)
        self.episode = Episode(slot, self.pool.reward, self.pool.max_steps)
        try:
            reset = await self.episode.start(task_id, seed)
        except BaseException:
            await self._release()
            raise
        tools = [{"name": t["name"], "description": t.get("description", ""), "input_schema": t.get("inputSchema", {})}
                 for t in self.episode.tools]
        self._state = AwmState(episode_id=episode_id or reset["episode_id"], step_count=0, env=slot.env,
                               task_id=self.episode.task_id, instance=slot.name)
        return AwmObservation(env=slot.env, task_id=self.episode.task_id, instruction=reset["instruction"],
                              tools=tools, metadata={"reset_ms": reset["reset_ms"],
                                                     "ungated": reset.get("ungated", False)})

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        episode = self.episode
        if episode is None or episode.outcome is not None:
            raise RuntimeError("no episode: reset first")
        if isinstance(action, AwmAction) and action.type != "answer":  # the MCP shapes, as OpenEnv's
            action = (ListToolsAction() if action.type == "list_tools" else  # own types
                      CallToolAction(tool_name=action.tool_name or "", arguments=action.arguments))
        if isinstance(action, ListToolsAction):
            tools = [Tool(name=t["name"], description=t.get("description") or "", input_schema=t.get("inputSchema", {}))
                     for t in await episode.mcp.list_tools()]
            return ListToolsObservation(tools=tools)
        if isinstance(action, CallToolAction):
            out = await episode.call_tool(action.tool_name, action.arguments)
            self._state.step_count = episode.steps
            observation = CallToolObservation(
                tool_name=action.tool_name, result=out.structured if out.structured is not None else out.text,
                error=ToolError(error_type=_error_type(out.error_kind), message=out.text) if out.is_error else None,
                metadata={"error_kind": out.error_kind} if out.is_error else {})
            if episode.exhausted:
                return await self._finish(None, f"{self.pool.max_steps} tool calls without an answer"
                                          if episode.infra_error is None else "infrastructure")
            return observation
        if isinstance(action, AwmAction):
            return await self._finish(action.answer, "answer")
        raise ValueError(f"unsupported action {type(action).__name__}: use list_tools, call_tool or answer")

    async def _finish(self, answer: str | None, why: str) -> AwmObservation:
        assert self.episode is not None
        episode = self.episode
        result: Outcome = await episode.finish(answer, why)
        observation = AwmObservation(
            done=True, reward=result.reward, env=episode.slot.env, task_id=episode.task_id, verdict=result.verdict,
            metadata={"masked": result.masked, "mask_reason": result.mask_reason, "ended_by": why,
                      "reward_components": result.components})
        await self._release()
        return observation

    async def _release(self) -> None:
        episode, self.episode = self.episode, None
        if episode is not None:
            await episode.close()
            await self.pool.release(episode.slot)

    def close(self) -> None:
        if self.episode is not None:  # a session closed mid-episode: its instance goes back
            try:
                asyncio.get_running_loop().create_task(self._release())
            except RuntimeError:
                self.pool.release_nowait(self.episode.slot)
                self.episode = None


def _error_type(kind: str | None) -> ToolErrorType:
    return {"invalid_arguments": ToolErrorType.INVALID_ARGS, "timeout": ToolErrorType.TIMEOUT,
            "unavailable": ToolErrorType.TRANSPORT_ERROR}.get(kind or "", ToolErrorType.EXECUTION_ERROR)


def build_app(pool: InstancePool) -> Any:
    """OpenEnv's own FastAPI app (HTTP + /ws) serving awm sessions from ``pool``."""
    from openenv.core.env_server.http_server import create_fastapi_app

    return create_fastapi_app(lambda: AwmEnvironment(pool), AwmAction, AwmObservation,
                              max_concurrent_envs=max(pool.size, 1))
