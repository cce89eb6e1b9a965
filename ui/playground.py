"""The playground: a person acting as the agent on a real instance, through the server.

The browser never talks to the instance: MCP needs a session and the control API is not for the
agent's side (and both refuse foreign browser origins, awm.envserver.hostguard). The UI server holds
one episode session per instance in use - the same :class:`awm.episode.session.EpisodeSession`
the trainer and the framework adapters use - so a call's error class, its recorded database
change, the verdict, the reward and masking are exactly what a trajectory would record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, Field

from awm.episode.session import EnvHandle, EpisodeSession
from awm.ui.fleet import FleetView, Instance

HOLDER = "playground"
DIFF_ROWS = 200
TTL_S = 900.0  # a session nobody used for this long is released (a browser that never said goodbye)


class ResetRequest(BaseModel):
    task_id: str | None = None


class CallRequest(BaseModel):
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class VerifyRequest(BaseModel):
    final_answer: str | None = None


class Session:
    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.handle: EnvHandle | None = None
        self.episode: EpisodeSession | None = None
        self.lock = asyncio.Lock()  # one call at a time: the episode is one transaction
        self.used = time.monotonic()

    async def open(self) -> None:
        self.handle = await EnvHandle.connect(self.instance.mcp_url, self.instance.control_url, timeout=30.0)
        self.episode = EpisodeSession(self.handle, call_diff_rows=DIFF_ROWS)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return self.handle.tools if self.handle else []

    async def close(self) -> None:
        if self.handle is not None:
            await self.handle.close()


class Playground:
    """The sessions the UI holds, one per instance. A page releases its instance when it is left
    (the front end's stop and a ``pagehide`` beacon); a session idle for ``ttl_s`` is released by
    :meth:`expire`, which the server runs periodically, so a crashed browser does not hold an
    instance for ever."""

    def __init__(self, fleet: FleetView, ttl_s: float = TTL_S) -> None:
        self.fleet = fleet
        self.ttl_s = ttl_s
        self.sessions: dict[str, Session] = {}

    async def expire(self) -> list[str]:
        """Release the sessions idle longer than the TTL (one in use is never idle: its lock)."""
        now = time.monotonic()
        stale = [n for n, s in self.sessions.items() if now - s.used > self.ttl_s and not s.lock.locked()]
        for name in stale:
            await self.release(name)
        return stale

    async def session(self, name: str) -> Session:
        existing = self.sessions.get(name)
        if existing is not None:
            existing.used = time.monotonic()
            return existing
        instance = self.fleet.find(name)
        if instance is None:
            raise KeyError(name)
        session = Session(instance)
        await session.open()
        self.sessions[name] = session
        self.fleet.holders[name] = HOLDER
        return session

    async def open(self, name: str) -> dict[str, Any]:
        session = await self.session(name)
        assert session.handle is not None
        info = await session.handle.control.info()
        return {"instance": session.instance.model_dump(), "tools": session.tools, "tasks": info.get("tasks", []),
                "ttl_s": self.ttl_s}

    async def reset(self, name: str, body: ResetRequest) -> dict[str, Any]:
        session = await self.session(name)
        assert session.episode is not None
        async with session.lock:
            return await session.episode.reset(body.task_id)

    async def call(self, name: str, body: CallRequest) -> dict[str, Any]:
        session = await self.session(name)
        assert session.episode is not None
        async with session.lock:
            result = await session.episode.call_tool(body.tool, body.arguments)
        return {"name": body.tool, "arguments": body.arguments, "is_error": result.is_error,
                "error_kind": result.error_kind, "text": result.text, "structured": result.structured,
                "ms": round(result.ms, 3), "diff": result.diff or {}, "diff_error": result.diff_error}

    async def verify(self, name: str, body: VerifyRequest) -> dict[str, Any]:
        """The verdict and the reward as an episode would get them (masked when it is the
        environment's failure), and what the episode changed in the database."""
        session = await self.session(name)
        assert session.episode is not None
        async with session.lock:
            outcome = await session.episode.finish(body.final_answer, diff=True)
        return {"verdict": outcome.verdict, "reward": outcome.reward, "masked": outcome.masked,
                "mask_reason": outcome.mask_reason, "components": outcome.components,
                "diff": session.episode.diff or {}}

    async def release(self, name: str) -> None:
        session = self.sessions.pop(name, None)
        self.fleet.holders.pop(name, None)
        if session is not None:
            await session.close()

    async def close(self) -> None:
        for name in list(self.sessions):
            await self.release(name)
