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
  through awm's MCP server; errors come back with their awm class in ``error_kind``) - or
  :class:`AwmAction` with ``answer``: the final answer, which ends the episode: awm verifies it
  (code verifier or LLM judge) and the observation carries the reward (:mod:`awm.episode.reward`:
  failures that are the environment's are masked: reward ``None``, ``masked`` true and
  ``mask_reason``; ``ended_by`` and ``reward_components`` say how it ended and why it scored);
* ``max_steps`` tool calls without an answer end the episode too (verified without an answer).

All of it is in the observations' own fields: openenv-core's serializer drops ``metadata``, so
an unmodified client would never see it there. The episode itself is
:class:`awm.episode.session.EpisodeSession` on an instance of an
:class:`awm.episode.sources.InstanceSource`; it goes back when the episode ends or the session
closes (a dead instance is checked before it is handed out again).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import (CallToolAction, CallToolObservation, ListToolsAction,
                                               ListToolsObservation, Tool, ToolError, ToolErrorType)
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import Field

from awm import errorclass
from awm.episode.reward import RewardConfig
from awm.errorclass import CLASSES
from awm.episode.session import EpisodeSession, Outcome
from awm.episode.sources import InstanceSource, Lease, PoolSource

__all__ = ["AwmAction", "AwmCallToolObservation", "AwmEnvironment", "AwmObservation", "build_app"]


class AwmAction(Action):
    """One step: OpenEnv's MCP actions (``{"type": "list_tools"}``, ``{"type": "call_tool",
    "tool_name": ..., "arguments": {...}}``, as OpenEnv's MCP clients send them) or the final
    answer (``{"answer": ...}``), which ends and verifies the episode."""

    type: Literal["list_tools", "call_tool", "answer"] = "answer"
    tool_name: str | None = Field(default=None, description="call_tool: the tool.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="call_tool: its arguments.")
    answer: str | None = Field(default=None, description="answer: the final answer.")


# openenv-core's serializer (serialize_observation) drops ``metadata`` from what a client gets:
# everything a client needs is in the observations' own fields.
class AwmObservation(Observation):
    env: str = ""
    task_id: str | None = None
    instruction: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list, description="On reset: the tools (MCP schemas).")
    reset_ms: float | None = Field(default=None, description="On reset: how long the instance's reset took.")
    ungated: bool | None = Field(default=None, description="On reset: the task did not pass awm's quality gates.")
    verdict: dict[str, Any] | None = Field(default=None, description="When done: awm's /verify answer.")
    masked: bool | None = Field(default=None, description="When done: the environment failed the episode "
                                "(reward None; never train on it).")
    mask_reason: str | None = Field(default=None, description="When done and masked: why.")
    ended_by: str | None = Field(default=None, description="When done: answer, the step limit, or infrastructure.")
    reward_components: dict[str, float] = Field(default_factory=dict, description="When done: the reward's parts.")
    error_kind: str | None = Field(default=None, description="When the last tool call failed: awm's error class.")


class AwmCallToolObservation(CallToolObservation):
    """A tool call's answer: OpenEnv's fields, plus awm's error class (the agent's
    ``invalid_arguments`` / ``tool_error`` versus the environment's ``tool_crashed`` / ``timeout``
    / ``unavailable``), which OpenEnv's coarser ``error.error_type`` cannot tell apart."""

    error_kind: str | None = Field(default=None, description="awm's error class of a failed call.")


class AwmState(State):
    env: str | None = None
    task_id: str | None = None
    instance: str | None = None


class AwmEnvironment(Environment):
    """One OpenEnv session on awm. Cheap to construct (OpenEnv builds throwaway ones to ask
    questions): it claims an instance only on reset."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, source: InstanceSource, max_steps: int = 30, reward: RewardConfig | None = None) -> None:
        super().__init__()
        self.source, self.max_steps, self.reward = source, max_steps, reward
        self.lease: Lease | None = None
        self.episode: EpisodeSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = AwmState()

    @property
    def state(self) -> AwmState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="awm", version="1.0.0", description=(
            "awm environments (database-backed MCP tools, verifiers, LLM judge): " + ", ".join(self.source.envs())))

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AwmObservation:
        raise RuntimeError("awm's OpenEnv environment is asynchronous: use reset_async")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise RuntimeError("awm's OpenEnv environment is asynchronous: use step_async")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          task_id: str | None = None, env: str | None = None, **kwargs: Any) -> AwmObservation:
        await self._release()
        self._loop = asyncio.get_running_loop()
        self.lease = await self.source.claim(env)
        assert self.lease.handle is not None
        self.episode = EpisodeSession(self.lease.handle, self.reward, self.max_steps)
        try:
            reset = await self.episode.reset(task_id, seed)
        except BaseException:
            await self._release()
            raise
        tools = [{"name": t["name"], "description": t.get("description", ""), "input_schema": t.get("inputSchema", {})}
                 for t in self.episode.tools]
        self._state = AwmState(episode_id=episode_id or reset["episode_id"], step_count=0, env=self.lease.env,
                               task_id=self.episode.task_id, instance=self.lease.name)
        return AwmObservation(env=self.lease.env, task_id=self.episode.task_id, instruction=reset["instruction"],
                              tools=tools, reset_ms=reset.get("reset_ms"), ungated=reset.get("ungated", False))

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
            if episode.exhausted:
                return await self._finish(None, f"{self.max_steps} tool calls without an answer"
                                          if episode.infra_error is None else "infrastructure", out.error_kind)
            return AwmCallToolObservation(
                tool_name=action.tool_name, result=out.structured if out.structured is not None else out.text,
                error=ToolError(error_type=_error_type(out.error_kind), message=out.text) if out.is_error else None,
                error_kind=out.error_kind)
        if isinstance(action, AwmAction):
            return await self._finish(action.answer, "answer")
        raise ValueError(f"unsupported action {type(action).__name__}: use list_tools, call_tool or answer")

    async def _finish(self, answer: str | None, why: str, error_kind: str | None = None) -> AwmObservation:
        assert self.episode is not None and self.lease is not None
        episode = self.episode
        result: Outcome = await episode.finish(answer, why)
        observation = AwmObservation(
            done=True, reward=result.reward, env=self.lease.env, task_id=episode.task_id, verdict=result.verdict,
            masked=result.masked, mask_reason=result.mask_reason, ended_by=result.ended_by,
            reward_components=result.components, error_kind=error_kind)
        await self._release()
        return observation

    async def _release(self) -> None:
        lease, episode = self.lease, self.episode
        self.lease = self.episode = None
        if lease is not None:
            await self.source.release(lease, healthy=episode is None or episode.healthy)

    def close(self) -> None:
        """A session closed (the client went away, perhaps mid-episode): its instance goes back.
        OpenEnv calls this from a worker thread: the release runs on the loop the episode uses."""
        if self.lease is None:
            return
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None and running is loop:
            loop.create_task(self._release())
        elif loop is not None and not loop.is_closed():
            asyncio.run_coroutine_threadsafe(self._release(), loop)


def _error_type(kind: str | None) -> ToolErrorType:
    """OpenEnv's coarse MCP error type of an awm error class (its one definition: awm.errorclass)."""
    known = errorclass.parse(kind)
    return ToolErrorType(CLASSES[known].mcp_error_type) if known else ToolErrorType.EXECUTION_ERROR


class _ClosedByClient:
    """ASGI middleware: a WebSocket session the client ended is a normal end, not an error.
    openenv-core 0.3.0's ``/ws`` endpoint closes the socket once more after the client went away
    (``await websocket.close()`` in its ``finally``, which catches only ``RuntimeError``); the
    ``WebSocketDisconnect`` that raises would reach uvicorn, which prints ~60 lines of
    "Exception in ASGI application" for every disconnect. The session itself is already cleaned
    up by then (its environment closed, the instance released)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            return


def build_app(source: InstanceSource, max_steps: int = 30, reward: RewardConfig | None = None,
              max_sessions: int | None = None) -> Any:
    """OpenEnv's own FastAPI app (HTTP + /ws) serving awm sessions from ``source``;
    ``max_sessions`` defaults to the number of instances of a pool."""
    from openenv.core.env_server.http_server import create_fastapi_app

    if max_sessions is None:
        max_sessions = source.size if isinstance(source, PoolSource) else 64
    app = create_fastapi_app(lambda: AwmEnvironment(source, max_steps, reward), AwmAction, AwmObservation,
                             max_concurrent_envs=max(max_sessions, 1))
    app.add_middleware(_ClosedByClient)
    return app
