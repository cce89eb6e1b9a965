"""The client of the operator's allocation API (aiohttp only: no kopf, no Kubernetes client), and
where a run finds the operator (:class:`OperatorSettings`).

It is in the core, not in ``awm_operator``: the trainer, the framework adapters and the UI claim
instances through it without importing the operator.

aiohttp, not httpx (the rest of the core's HTTP): a trainer claims a GRPO step's 64 groups at
once from one event loop, and httpx's client cost ~0.6 ms of CPU per request alone and 0.9-3 ms
with 64 in flight (its connection pool), aiohttp's ~0.08 ms (quiet, this project's 2-core VM): a
step's claims cost the claiming loop ~110 ms with httpx, more than the whole step may take
(docs/benchmarks.md, "The operator's pod client and the trainer's claim client").

    async with AllocationClient("http://awm-operator:8080", namespace="rl", fleet="train") as alloc:
        claim = await alloc.claim(count=64, group_size=8)     # 8 GRPO groups of 8
        for inst in claim.instances: ...                      # mcp_url, control_url, group
        await alloc.release(claim.id)                         # reset and back to the pool

Requests and answers are the models of :mod:`awm.claims`, which the operator's API reads and
writes too: a request the API would refuse is refused here before it is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, TypeVar

import aiohttp

from awm import settings
from awm.claims import (BadRequest, Claim, ClaimOutcome, ClaimRefusal, ClaimRequest, HolderRelease, Preparation, PrepareRequest,
                        Release, Renewal, RenewRequest, Switch, Wire)
from awm.client import tls_context


SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


@dataclass(frozen=True)
class OperatorSettings:
    """Where the operator is and which fleet (and campaign) the run belongs to."""

    operator_url: str
    namespace: str
    fleet: str
    campaign: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorSettings | None":
        """The settings a campaign's Job gets, or None outside one (then runs use a local fleet)."""
        url, fleet = settings.var.AWM_OPERATOR_URL.get(env), settings.var.AWM_FLEET.get(env)
        if not url or not fleet:
            return None
        namespace = settings.var.AWM_NAMESPACE.get(env)
        if not namespace and SA_NAMESPACE.is_file():
            namespace = SA_NAMESPACE.read_text().strip()
        return cls(url.rstrip("/"), namespace or "default", fleet, settings.var.AWM_CAMPAIGN.get(env))

    @property
    def holder(self) -> str | None:
        """The holder a campaign's claims carry (``campaign/<name>``), so that a retried Job
        can release what its crashed predecessor still held."""
        return f"campaign/{self.campaign}" if self.campaign else None

    def client(self) -> "AllocationClient":
        return AllocationClient(self.operator_url, self.namespace, self.fleet)


def bearer() -> dict[str, str]:
    """The caller's credentials for the operator's API: ``AWM_API_TOKEN``, else the pod's
    ServiceAccount token, read at every request (bound tokens are rotated by the kubelet)."""
    token = settings.AWM_API_TOKEN.strip()
    if not token and SA_TOKEN.is_file():
        token = SA_TOKEN.read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


class AllocationError(RuntimeError):
    """The operator answered and refused (``status``: its HTTP status; ``refusal``: its answer,
    with the claim's outcome where it has one)."""

    def __init__(self, status: int, message: str, refusal: ClaimRefusal | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.refusal = refusal


class OperatorUnreachable(ConnectionError):
    """No answer from the operator (refused, reset, timed out): unlike an AllocationError, worth
    asking again."""


PROXY_VARIABLES = ("https_proxy", "http_proxy", "all_proxy")  # no_proxy alone sends nothing through one
R = TypeVar("R")
A = TypeVar("A", bound=Wire)


async def past_standby(send: Callable[[dict[str, str]], Awaitable[R]], retries: int,
                       status: Callable[[R], int] = lambda r: r.status_code) -> R:  # type: ignore[attr-defined]
    """``send(headers)`` until a replica other than a standby answers. With several operator
    replicas behind one Service, a standby answers 503 at once and did nothing; the Service
    balances per connection, so the connection it answered on must not be used again: the
    operator closes it (``Connection: close`` on its 503s), and each retry asks for a connection
    that closes after its answer. The client itself is never closed here: requests of other
    tasks share it (a trainer's episodes claim at once), and a claim whose request is cut off
    would be bound with nobody to hear it. A slow 503 (an active replica that lost its lease
    while the request waited) is returned as it is: the caller's own deadline decides."""
    delay = 0.1
    for attempt in range(retries + 1):
        started = time.monotonic()
        r = await send({"Connection": "close"} if attempt else {})
        if status(r) != 503 or attempt == retries or time.monotonic() - started > 2.0:
            return r
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")


def new_claim_id() -> str:
    """An allocation-API claim id chosen by the client (``api_`` and 32 hex digits), so that a
    claim can be asked for again, after a lost answer, without binding it twice."""
    return f"api_{secrets.token_hex(16)}"


class AllocationClient:
    """``token``: the bearer token to call with; None: the process's own (:func:`bearer`). The
    UI's playground passes the token of the person at the browser, so that the operator's RBAC
    check is theirs, not the UI's. ``session``: an aiohttp session to share (the caller closes
    it); by default the client makes its own on first use (in the event loop that uses it)."""

    def __init__(self, base_url: str, namespace: str, fleet: str, timeout: float = 660.0,
                 session: aiohttp.ClientSession | None = None, standby_retries: int = 8,
                 token: str | None = None) -> None:
        self.base = f"{base_url.rstrip('/')}/v1/namespaces/{namespace}/envfleets/{fleet}"
        self._token = token
        self.standby_retries = standby_retries
        self.timeout = timeout
        self._session = session
        self._own = session is None

    async def __aenter__(self) -> "AllocationClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # The process's one TLS context; proxies from the environment only where one is set
            # (aiohttp otherwise looks up ~/.netrc and the proxy variables in a thread per request).
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(ssl=tls_context(), limit=0),
                trust_env=any(os.environ.get(v) or os.environ.get(v.upper()) for v in PROXY_VARIABLES))
        return self._session

    async def claim(self, count: int = 1, group_size: int | None = None, environment: str | None = None,
                    wait_seconds: float = 30.0, ttl_seconds: float | None = None,
                    holder: str | None = None, switch: Switch = "operator", claim_id: str | None = None) -> Claim:
        """Bind instances; unless released or renewed within ``ttl_seconds`` (the operator's
        default when None), the operator releases them by itself. ``holder`` names who holds
        them, so that :meth:`release_holder` can free them all. ``switch="client"``: a
        late-binding fleet answers at once, and each instance marked ``switched=False`` is
        the caller's to switch (:meth:`awm.episode.sources.Lease.connect` does). ``claim_id``
        (:func:`new_claim_id`): asking again with the same id after a lost answer returns the
        claim bound the first time instead of binding a second one."""
        try:  # refused here as the operator would refuse it, before it is sent
            req = ClaimRequest.read(dict(count=count, group_size=group_size, environment=environment, switch=switch,
                                         wait_seconds=wait_seconds, ttl_seconds=ttl_seconds, holder=holder, id=claim_id))
        except BadRequest as exc:
            raise AllocationError(400, f"bad request: {exc}",
                                  ClaimRefusal(error=f"bad request: {exc}", outcome=ClaimOutcome.REFUSED)) from None
        return await self._call("POST", "/claims", Claim, req)

    async def prepare(self, environments: Mapping[str, int], wait: bool = False) -> Preparation:
        """binding: late - make ``environments`` (name -> instances) ready on the fleet's pods
        ahead of their claims, e.g. a GRPO step's next groups: a claim of one then lands on a
        pod that has it ready and costs a reset instead of a switch. ``wait``: answer once they
        are made (what was made and what failed), else once the pods are chosen."""
        return await self._call("POST", "/prepare", Preparation,
                                PrepareRequest(environments=dict(environments), wait=wait))

    async def release_holder(self, holder: str) -> HolderRelease:
        """Release every claim of ``holder``."""
        return await self._call("DELETE", "/claims", HolderRelease, params={"holder": holder})

    async def get(self, claim_id: str) -> Claim:
        """The claim as the operator sees it now; instances whose pod was lost have ``lost`` set."""
        return await self._call("GET", f"/claims/{claim_id}", Claim)

    async def renew(self, claim_id: str, ttl_seconds: float | None = None) -> Renewal:
        return await self._call("POST", f"/claims/{claim_id}/renew", Renewal, RenewRequest(ttl_seconds=ttl_seconds))

    async def release(self, claim_id: str) -> Release:
        return await self._call("DELETE", f"/claims/{claim_id}", Release)

    async def fleet(self) -> dict[str, Any]:
        return await self._request("GET", "")

    async def _call(self, method: str, path: str, answer: type[A], body: Wire | None = None,
                    params: Mapping[str, str] | None = None) -> A:
        """One request whose answer is ``answer``; an answer that is not one is an AllocationError."""
        data = await self._request(method, path, body.wire() if body is not None else None, params)
        try:
            return answer.read(data)
        except BadRequest as exc:
            raise AllocationError(200, f"the operator's answer to {method} {path} is not a {answer.__name__}: "
                                       f"{exc}") from None

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                       params: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One request, asked again past a standby replica (:func:`past_standby`); the answer's
        JSON, or AllocationError (the operator refused) or OperatorUnreachable (no answer)."""
        session, url = self.session, self.base + path

        async def send(extra: dict[str, str]) -> tuple[int, bytes]:
            async with session.request(method, url, json=body, params=params,
                                       headers={**self._headers(), **extra}) as r:
                return r.status, await r.read()

        try:
            status, raw = await past_standby(send, self.standby_retries, status=lambda r: r[0])
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise OperatorUnreachable(f"{method} {url}: {exc.__class__.__name__}: {exc}") from exc
        return self._result(status, raw)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}"} if self._token else bearer()

    @staticmethod
    def _result(status: int, raw: bytes) -> dict[str, Any]:
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(raw)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            data = {"error": text}
        if status >= 400:
            try:
                refusal: ClaimRefusal | None = ClaimRefusal.read(data)
            except BadRequest:
                refusal = None
            raise AllocationError(status, refusal.error if refusal else text, refusal)
        return data
