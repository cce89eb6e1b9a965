"""The playground: a person acting as the agent on a real instance, through the server.

The browser never talks to the instance: MCP needs a session and the control API is not for the
agent's side (and both refuse foreign browser origins, awm.envserver.hostguard). The UI server holds
one MCP session and one control client per instance in use, and records each call's database
change exactly as the trainer does (trainer/calldiff.py), so what the playground shows is what a
trajectory would record.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, Field

from awm.client import ControlClient, McpSession
from awm.trainer.calldiff import DiffTracker
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
        self.mcp = McpSession(instance.mcp_url, timeout=30.0)
        self.control = ControlClient(instance.control_url, timeout=30.0)
        self.tracker = DiffTracker(DIFF_ROWS)
        self.tools: list[dict[str, Any]] = []
        self.lock = asyncio.Lock()  # one call at a time: the episode is one transaction
        self.used = time.monotonic()

    async def open(self) -> None:
        await self.mcp.initialize()
        self.tools = await self.mcp.list_tools()

    async def close(self) -> None:
        await self.mcp.close()
        await self.control.close()


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
        info = await session.control.info()
        return {"instance": session.instance.model_dump(), "tools": session.tools, "tasks": info.get("tasks", []),
                "ttl_s": self.ttl_s}

    async def reset(self, name: str, body: ResetRequest) -> dict[str, Any]:
        session = await self.session(name)
        async with session.lock:
            result = await session.control.reset(body.task_id)
            session.tracker = DiffTracker(DIFF_ROWS)  # the snapshot again: nothing changed yet
        return result

    async def call(self, name: str, body: CallRequest) -> dict[str, Any]:
        session = await self.session(name)
        async with session.lock:
            t0 = time.perf_counter()
            outcome = await session.mcp.call_tool(body.tool, body.arguments)
            ms = (time.perf_counter() - t0) * 1000
            change = {} if outcome.is_error else await session.tracker.after_call(session.control)
        return {"name": body.tool, "arguments": body.arguments, "is_error": outcome.is_error,
                "error_kind": outcome.error_kind, "text": outcome.text, "structured": outcome.structured,
                "ms": round(ms, 3), "diff": change}

    async def verify(self, name: str, body: VerifyRequest) -> dict[str, Any]:
        session = await self.session(name)
        async with session.lock:
            verdict = await session.control.verify(body.final_answer)
            diff = await session.control.diff()
        return {"verdict": verdict, "diff": diff.get("tables", {})}

    async def release(self, name: str) -> None:
        session = self.sessions.pop(name, None)
        self.fleet.holders.pop(name, None)
        if session is not None:
            await session.close()

    async def close(self) -> None:
        for name in list(self.sessions):
            await self.release(name)
