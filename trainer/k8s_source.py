"""Instances from the Kubernetes operator, and progress reports to it (httpx only: the trainer
image needs neither kopf nor a Kubernetes client).

A campaign's Job (``operator/awm_operator/campaigns.py``) runs ``awm train`` / ``awm eval`` with
``AWM_OPERATOR_URL``, ``AWM_NAMESPACE``, ``AWM_FLEET`` and ``AWM_CAMPAIGN`` set; when they are
there, those commands use :class:`KubernetesSource` instead of starting a local fleet, and
:class:`ProgressReporter` sends each step's numbers to the Campaign's status.

:class:`KubernetesSource` claims all of its instances up front through the operator's allocation
API (``awm_operator.client.AllocationClient``): per environment, in GRPO groups, one round trip
each, then hands them to episodes locally like :class:`~awm.trainer.rollout.PoolSource` (an episode
resets its instance itself, so nothing goes back to the operator between episodes). Claims are
renewed while the run lasts (the operator releases claims whose TTL runs out, so a trainer that
dies does not hold instances), an instance that stops answering is replaced by a fresh claim,
and closing the source releases everything (the operator resets the instances and returns them
to the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

import httpx

from awm_operator.client import AllocationClient, AllocationError, bearer, new_connection, past_standby
from awm.trainer.rollout import Lease, PoolSource

log = logging.getLogger("trainer.k8s")

ENV_OPERATOR_URL = "AWM_OPERATOR_URL"
ENV_NAMESPACE = "AWM_NAMESPACE"
ENV_FLEET = "AWM_FLEET"
ENV_CAMPAIGN = "AWM_CAMPAIGN"
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class KubernetesSettings:
    """Where the operator is and which fleet (and campaign) the run belongs to."""

    operator_url: str
    namespace: str
    fleet: str
    campaign: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "KubernetesSettings | None":
        """The settings a campaign's Job gets, or None outside one (then runs use a local fleet)."""
        e = os.environ if env is None else env
        url, fleet = e.get(ENV_OPERATOR_URL), e.get(ENV_FLEET)
        if not url or not fleet:
            return None
        namespace = e.get(ENV_NAMESPACE)
        if not namespace and os.path.exists(SA_NAMESPACE):
            with open(SA_NAMESPACE) as f:
                namespace = f.read().strip()
        return cls(url.rstrip("/"), namespace or "default", fleet, e.get(ENV_CAMPAIGN) or None)


class KubernetesSource(PoolSource):
    """Instances of an EnvFleet, claimed through the operator's allocation API.

    ``per_env`` instances of every environment are claimed at start (``group_size`` > 1 and a
    multiple of it: as GRPO groups, each of one environment), and released on close. In a
    campaign the claims are held as ``campaign/<name>``, and start first releases whatever that
    holder still has: a Job's retried pod gets the instances its crashed predecessor held at once,
    instead of after their TTL (the campaign's fleet has no others to give).
    """

    def __init__(self, settings: KubernetesSettings, envs: list[str], per_env: int, group_size: int | None = None,
                 scenarios: Mapping[str, str] | None = None, *, claim_timeout_s: float = 1800.0,
                 claim_ttl_s: float | None = 600.0, ready_timeout_s: float = 120.0,
                 client: AllocationClient | None = None) -> None:
        super().__init__([], ready_timeout_s=ready_timeout_s)
        if per_env < 1:
            raise ValueError("per_env must be at least 1")
        self.settings = settings
        self._envs = list(envs)
        self.per_env, self.group_size = per_env, group_size
        self.scenarios = dict(scenarios or {})
        self.claim_timeout_s, self.claim_ttl_s = claim_timeout_s, claim_ttl_s
        self.alloc = client or AllocationClient(settings.operator_url, settings.namespace, settings.fleet)
        self._own_client = client is None
        self.claims: list[str] = []   # allocation-API claim ids, released on close
        self.holder = f"campaign/{settings.campaign}" if settings.campaign else None
        self._renewer: asyncio.Task[None] | None = None

    def envs(self) -> list[str]:
        return list(self._envs)

    async def start(self) -> "KubernetesSource":
        groups = self.group_size if self.group_size and self.group_size > 1 and self.per_env % self.group_size == 0 \
            else None
        try:
            if self.holder:
                await self._release_predecessor()
            claimed = await asyncio.gather(*(self._claim(env, self.per_env, groups) for env in self._envs))
        except BaseException:
            await self.close()
            raise
        for leases in claimed:
            for lease in leases:
                self._add(lease)
        if self.claim_ttl_s:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        log.info("claimed %d instances of %d environments from fleet %s/%s", len(self._all), len(self._envs),
                 self.settings.namespace, self.settings.fleet)
        return self

    async def __aenter__(self) -> "KubernetesSource":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _add(self, lease: Lease) -> None:
        self._all.append(lease)
        self._queues.setdefault(lease.env, asyncio.Queue()).put_nowait(lease)

    async def _release_predecessor(self) -> None:
        """Release the claims this campaign's earlier trainer pod left behind (none, usually). An
        operator that does not know the fleet yet (404) holds none of them; a standby (503) or an
        unreachable one is retried a few times, then the claims are left to their TTL."""
        assert self.holder is not None
        for delay in (0.5, 1.0, 2.0, 4.0, 0.0):
            try:
                got = await self.alloc.release_holder(self.holder)
                if got.get("released"):
                    log.warning("released %d claims (%d instances) that %s still held from an earlier run",
                                len(got["released"]), got.get("returned", 0) + got.get("replaced", 0), self.holder)
                return
            except AllocationError as exc:
                if exc.status == 404:
                    return
                log.info("releasing the claims of %s: %s", self.holder, exc)
            except httpx.TransportError as exc:
                log.info("releasing the claims of %s: operator unreachable: %s", self.holder, exc)
            await asyncio.sleep(delay)

    async def _claim(self, env: str, count: int, group_size: int | None) -> list[Lease]:
        """One claim, waiting for capacity: the fleet may still be starting its pods (409), be
        unknown to the operator for a moment after the campaign made it (404), or the replica
        we reached may be a standby (503)."""
        deadline = time.monotonic() + self.claim_timeout_s
        extra: dict[str, Any] = {"ttl_seconds": self.claim_ttl_s} if self.claim_ttl_s else {}
        delay = 0.5
        while True:
            left = deadline - time.monotonic()
            try:
                got = await self.alloc.claim(count=count, group_size=group_size, environment=env,
                                             wait_seconds=max(0.0, min(60.0, left)), holder=self.holder, **extra)
                break
            except AllocationError as exc:
                if exc.status not in (404, 409, 503) or left <= 0:
                    raise
                log.info("claiming %d of %s: %s (waiting)", count, env, exc)
            except httpx.TransportError as exc:
                if left <= 0:
                    raise
                log.info("claiming %d of %s: operator unreachable: %s (retrying)", count, env, exc)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)
        self.claims.append(got["id"])
        return [Lease(i["environment"], i["pod"], i["mcpUrl"], i["controlUrl"], self.scenarios.get(i["environment"], ""))
                for i in got["instances"]]

    async def _renew_forever(self) -> None:
        """Renew every claim at a third of its TTL. An operator without claim TTLs has nothing
        to renew (HTTP 404/405 on the first try): then stop."""
        assert self.claim_ttl_s
        renew = getattr(self.alloc, "renew", None)
        if renew is None:
            return
        while True:
            await asyncio.sleep(self.claim_ttl_s / 3)
            for claim_id in list(self.claims):
                try:
                    await renew(claim_id, ttl_seconds=self.claim_ttl_s)
                except AllocationError as exc:
                    if exc.status == 405:
                        return
                    log.warning("renewing claim %s: %s", claim_id, exc)
                except httpx.TransportError as exc:
                    log.warning("renewing claim %s: %s", claim_id, exc)

    async def _revive(self, lease: Lease) -> None:
        """An instance that failed us: back to the pool once ready again; if it stays down (its
        pod was lost), claim a replacement of the same environment instead."""
        if await self._wait_ready(lease):
            self._queues[lease.env].put_nowait(lease)
            return
        log.warning("instance %s of %s did not come back: claiming a replacement", lease.name, lease.env)
        (replacement,) = await self._claim(lease.env, 1, None)
        with contextlib.suppress(ValueError):
            self._all.remove(lease)
        self._add(replacement)

    async def close(self) -> None:
        """Close the connections, then release every claim (the operator resets the instances)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
            self._renewer = None
        await super().close()
        for claim_id in list(self.claims):
            try:
                await self.alloc.release(claim_id)
            except (AllocationError, httpx.TransportError) as exc:  # the claim's TTL will end it
                log.warning("releasing claim %s: %s", claim_id, exc)
            self.claims.remove(claim_id)
        if self._own_client:
            await self.alloc.close()


class ProgressReporter:
    """Posts a campaign's progress to the operator (``POST .../campaigns/{name}/progress``).

    Never in the way: :meth:`report` returns at once, one request is in flight at a time and
    only the newest report waits behind it (the operator shows the latest numbers anyway), and a
    failure is logged, never raised: losing a progress report must not cost a training run. A
    report that failed (an operator restarting, a standby replica answering 503) is folded into
    the next one, and :meth:`aclose` retries what is left for a while, so the campaign's status
    ends with the run's final numbers. A standby's 503 is asked again at once on a new
    connection, as the allocation client does: kept, the pooled connection would reach the same
    standby with every report.
    """

    close_retries = (0.5, 1.0, 2.0, 4.0, 8.0)  # seconds between the last attempts, at close
    standby_retries = 8

    def __init__(self, settings: KubernetesSettings, client: httpx.AsyncClient | None = None,
                 timeout: float = 10.0) -> None:
        if not settings.campaign:
            raise ValueError("no campaign to report to (AWM_CAMPAIGN)")
        self.url = (f"{settings.operator_url}/v1/namespaces/{settings.namespace}/campaigns/"
                    f"{settings.campaign}/progress")
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._own = client is None
        self._latest: dict[str, Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.failed = 0

    @staticmethod
    def payload(step: int | None = None, reward_mean: float | None = None, rollouts_per_s: float | None = None,
                pass_rates: Mapping[str, float] | None = None,
                pass_at_k: Mapping[str, float] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"step": step, "rewardMean": reward_mean, "rolloutsPerS": rollouts_per_s,
                                "passRates": dict(pass_rates) if pass_rates is not None else None,
                                "passAtK": dict(pass_at_k) if pass_at_k is not None else None}
        return {k: v for k, v in body.items() if v is not None}

    def report(self, step: int | None = None, reward_mean: float | None = None, rollouts_per_s: float | None = None,
               pass_rates: Mapping[str, float] | None = None, pass_at_k: Mapping[str, float] | None = None) -> None:
        """Queue a report (call from inside the event loop)."""
        self._latest = {**(self._latest or {}),
                        **self.payload(step, reward_mean, rollouts_per_s, pass_rates, pass_at_k)}
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    def report_step(self, record: Mapping[str, Any]) -> None:
        """A training step's record (``metrics.jsonl`` line)."""
        self.report(step=record.get("step"), reward_mean=record.get("reward_mean"),
                    rollouts_per_s=record.get("rollouts_per_s"))

    async def _drain(self) -> None:
        while self._latest is not None:
            body, self._latest = self._latest, None
            try:
                r = await past_standby(lambda: self._client.post(self.url, json=body, headers=bearer()),
                                       self._new_connection, self.standby_retries)
                if not self._own:
                    self._client.headers.pop("Connection", None)
                if r.status_code >= 400:
                    raise httpx.HTTPStatusError(f"HTTP {r.status_code}: {r.text[:200]}", request=r.request, response=r)
                self.sent += 1
            except httpx.HTTPError as exc:
                self.failed += 1
                self._latest = {**body, **(self._latest or {})}  # newer numbers win; nothing is lost
                log.warning("progress report to %s failed: %s", self.url, exc)
                return  # the next report, or the close, tries again

    async def _new_connection(self) -> None:
        self._client = await new_connection(self._client, self._own)

    @property
    def pending(self) -> bool:
        """Whether a report has not reached the operator yet."""
        return self._latest is not None

    async def flush(self) -> None:
        """Wait until every queued report was sent (or failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def aclose(self) -> None:
        await self.flush()
        for delay in self.close_retries:
            if not self.pending:
                break
            await asyncio.sleep(delay)
            self._task = asyncio.get_running_loop().create_task(self._drain())
            await self.flush()
        if self.pending:
            log.error("the campaign's last progress report could not be delivered to %s", self.url)
        if self._own:
            await self._client.aclose()
