"""The playground: a person acting as the agent on a real instance, through the server.

The browser never talks to the instance: MCP needs a session and the control API is not for the
agent's side (and both refuse foreign browser origins, awm.envserver.hostguard). The UI server holds
one episode session per instance in use - the same :class:`awm.episode.session.EpisodeSession`
the trainer and the framework adapters use - so a call's error class, its recorded database
change, the verdict, the reward and masking are exactly what a trajectory would record.

Two kinds of instance:

* the UI's own (``awm ui --serve ENV`` or ``--instance``): anyone who reaches the UI may play on
  them - it binds to 127.0.0.1 unless told otherwise;
* in a cluster (``awm ui --playground-claims``, the chart's ``ui.playground``), an instance is
  claimed from the operator's allocation API **with the token of the person at the browser**
  (``Authorization: Bearer``, forwarded, never stored): the operator's RBAC check (create
  envclaims in that namespace) is theirs, not the UI's, whose own identity may only list. The UI
  keeps a SHA-256 digest of that token per claimed session and refuses every later request on it
  with another token (403), so one person cannot drive another's instance through the UI. The
  claim's TTL is the playground's: a page left without releasing its instance loses it to the
  operator's own expiry, with no credential left in the UI to release it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from awm.episode.allocation import AllocationClient, AllocationError
from awm.episode.session import EnvHandle, EpisodeSession
from awm.ui.fleet import FleetView, Instance

log = logging.getLogger("awm.ui")

HOLDER = "playground"
CLAIM_WAIT_S = 20.0  # how long a claim waits for a ready instance before the operator says 409
DIFF_ROWS = 200
TTL_S = 900.0  # a session nobody used for this long is released (a browser that never said goodbye)


class ResetRequest(BaseModel):
    task_id: str | None = None


class CallRequest(BaseModel):
    tool: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class VerifyRequest(BaseModel):
    final_answer: str | None = None


class PlaygroundClaim(BaseModel):
    """What the browser asks for: an instance of a fleet (the allocation API's request is
    :class:`awm.claims.ClaimRequest`, made from it)."""

    namespace: str = Field(min_length=1, max_length=63)
    fleet: str = Field(min_length=1, max_length=253)
    environment: str | None = Field(default=None, max_length=253)


class Unauthorized(Exception):
    """No token where the operator needs one (401)."""


class Forbidden(Exception):
    """A token that is not the claimer's, or a claim this UI does not make (403)."""


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class Claimed:
    """An instance this UI claimed from the operator for one person (identified by their token's
    digest; the token itself is not kept)."""

    namespace: str
    fleet: str
    claim_id: str
    owner: str
    renewed: float


class Session:
    def __init__(self, instance: Instance, claimed: Claimed | None = None) -> None:
        self.instance = instance
        self.claimed = claimed
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

    def __init__(self, fleet: FleetView, ttl_s: float = TTL_S, claims: bool = False) -> None:
        self.fleet = fleet
        self.ttl_s = ttl_s
        self.claims = claims and fleet.operator_url is not None  # claim from the operator for users
        self.sessions: dict[str, Session] = {}

    async def expire(self) -> list[str]:
        """Release the sessions idle longer than the TTL (one in use is never idle: its lock). A
        claimed one is only forgotten here: the operator's TTL on its claim frees the instance."""
        now = time.monotonic()
        stale = [n for n, s in self.sessions.items() if now - s.used > self.ttl_s and not s.lock.locked()]
        for name in stale:
            session = self.sessions.pop(name)
            self.fleet.holders.pop(name, None)
            await session.close()
        return stale

    def _allocation(self, claimed: Claimed | PlaygroundClaim, token: str) -> AllocationClient:
        assert self.fleet.operator_url is not None
        return AllocationClient(self.fleet.operator_url, claimed.namespace, claimed.fleet, timeout=CLAIM_WAIT_S + 10,
                                token=token)

    async def claim(self, body: PlaygroundClaim, token: str | None) -> dict[str, Any]:
        """One instance of ``body.fleet`` (of ``body.environment`` when given), claimed with the
        caller's token; its session's name is ``NAMESPACE.POD`` (a namespace has no dot)."""
        if not self.claims:
            raise Forbidden("this UI does not claim instances for its playground (awm ui --playground-claims, "
                            "the chart's ui.playground)")
        if body.namespace not in self.fleet.namespaces:
            raise Forbidden(f"namespace {body.namespace!r} is not one this UI serves")
        if not token:
            raise Unauthorized("claiming an instance needs your bearer token (the allocation API's authentication)")
        async with self._allocation(body, token) as alloc:
            made = await alloc.claim(count=1, environment=body.environment, wait_seconds=CLAIM_WAIT_S,
                                     ttl_seconds=self.ttl_s, holder=HOLDER)
            (inst,) = made.instances
            name = f"{body.namespace}.{inst.pod}"
            claimed = Claimed(body.namespace, body.fleet, made.id, digest(token), time.monotonic())
            session = Session(Instance(env=inst.environment, name=name, mcp_url=inst.mcp_url or "",
                                       control_url=inst.control_url or ""), claimed)
            try:
                await session.open()
            except BaseException:
                await alloc.release(made.id)
                raise
        stale = self.sessions.pop(name, None)  # the operator handed out again an instance whose claim expired
        if stale is not None:
            await stale.close()
        self.sessions[name] = session
        return {"instance": name, "claim": made.id, "environment": inst.environment}

    def _owned(self, session: Session, token: str | None) -> None:
        if session.claimed is not None and (token is None or not hmac.compare_digest(session.claimed.owner,
                                                                                      digest(token))):
            raise Forbidden("this instance was claimed with another token")

    async def session(self, name: str, token: str | None = None) -> Session:
        existing = self.sessions.get(name)
        if existing is not None:
            self._owned(existing, token)
            existing.used = time.monotonic()
            claimed = existing.claimed
            if claimed is not None and token and existing.used - claimed.renewed > self.ttl_s / 3:
                try:
                    async with self._allocation(claimed, token) as alloc:  # in use: keep the claim
                        await alloc.renew(claimed.claim_id, self.ttl_s)
                except AllocationError as exc:
                    if exc.status == 404:  # the operator let the claim go (its TTL): so does the UI
                        self.sessions.pop(name, None)
                        await existing.close()
                        raise KeyError(name) from exc
                    raise
                claimed.renewed = existing.used
            return existing
        instance = self.fleet.find(name)
        if instance is None:
            raise KeyError(name)
        session = Session(instance)
        await session.open()
        self.sessions[name] = session
        self.fleet.holders[name] = HOLDER
        return session

    async def open(self, name: str, token: str | None = None) -> dict[str, Any]:
        session = await self.session(name, token)
        assert session.handle is not None
        info = await session.handle.control.info()
        return {"instance": session.instance.model_dump(), "tools": session.tools, "tasks": info.get("tasks", []),
                "ttl_s": self.ttl_s, "claimed": session.claimed is not None}

    async def reset(self, name: str, body: ResetRequest, token: str | None = None) -> dict[str, Any]:
        session = await self.session(name, token)
        assert session.episode is not None
        async with session.lock:
            return await session.episode.reset(body.task_id)

    async def call(self, name: str, body: CallRequest, token: str | None = None) -> dict[str, Any]:
        session = await self.session(name, token)
        assert session.episode is not None
        async with session.lock:
            result = await session.episode.call_tool(body.tool, body.arguments)
        return {"name": body.tool, "arguments": body.arguments, "is_error": result.is_error,
                "error_kind": result.error_kind, "text": result.text, "structured": result.structured,
                "ms": round(result.ms, 3), "diff": result.diff or {}, "diff_error": result.diff_error}

    async def verify(self, name: str, body: VerifyRequest, token: str | None = None) -> dict[str, Any]:
        """The verdict and the reward as an episode would get them (masked when it is the
        environment's failure), and what the episode changed in the database."""
        session = await self.session(name, token)
        assert session.episode is not None
        async with session.lock:
            outcome = await session.episode.finish(body.final_answer, diff=True)
        return {"verdict": outcome.verdict, "reward": outcome.reward, "masked": outcome.masked,
                "mask_reason": outcome.mask_reason, "components": outcome.components,
                "diff": session.episode.diff or {}}

    async def release(self, name: str, token: str | None = None) -> None:
        session = self.sessions.get(name)
        if session is not None:
            self._owned(session, token)
        self.sessions.pop(name, None)
        self.fleet.holders.pop(name, None)
        if session is None:
            return
        await session.close()
        if session.claimed is not None and token:
            try:
                async with self._allocation(session.claimed, token) as alloc:
                    await alloc.release(session.claimed.claim_id)
            except AllocationError as exc:
                if exc.status != 404:
                    raise
                # The operator no longer holds the claim (its TTL passed, or the replica that
                # answered never knew it): the instance is free either way, which is what a
                # release asks for. Answering 404 would tell the page its release failed.
                log.info("playground release of %s: the operator had no claim %s", name, session.claimed.claim_id)

    async def close(self) -> None:
        """The server stops: its sessions end; claimed instances return at their claims' TTL."""
        for name in list(self.sessions):
            session = self.sessions.pop(name)
            self.fleet.holders.pop(name, None)
            await session.close()
