"""Instances claimed from the operator's allocation API: :class:`OperatorClaims` (one holder's
claims on one EnvFleet, waiting out the operator's transient answers), :class:`HeldClaimsSource`
(claimed once and held for a run) and :class:`OperatorSource` (one claim per episode or group)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Mapping

from awm.episode.allocation import (AllocationClient, AllocationError, OperatorSettings, OperatorUnreachable,
                                   new_claim_id)
from awm.episode.sources.lease import InstanceSource, Lease, RoundRobin, lease_list
from awm.episode.sources.pool import PoolSource

log = logging.getLogger("awm.episode.sources")


class OperatorClaims:
    """Claims of one holder on one EnvFleet, through the operator's allocation API: waits out
    the operator's transient answers (a fleet still starting its pods: 409; unknown for a moment
    after a campaign made it: 404; a standby replica: 503; an unreachable operator) until
    ``claim_timeout_s``."""

    def __init__(self, settings: OperatorSettings, *, client: AllocationClient | None = None,
                 claim_timeout_s: float = 1800.0, ttl_s: float | None = 600.0,
                 scenarios: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.alloc = client or settings.client()
        self._own = client is None
        self.holder = settings.holder
        self.claim_timeout_s, self.ttl_s = claim_timeout_s, ttl_s
        self.scenarios = dict(scenarios or {})

    async def claim(self, env: str, count: int, group_size: int | None) -> list[Lease]:
        deadline = time.monotonic() + self.claim_timeout_s
        extra: dict[str, Any] = {"ttl_seconds": self.ttl_s} if self.ttl_s else {}
        # One id for every attempt: an attempt whose answer was lost (the operator bound it, the
        # connection broke) is returned by the next one instead of held by nobody until its TTL.
        claim_id = new_claim_id()
        delay = 0.5
        while True:
            left = deadline - time.monotonic()
            try:
                got = await self.alloc.claim(count=count, group_size=group_size, environment=env,
                                             wait_seconds=max(0.0, min(60.0, left)), holder=self.holder,
                                             switch="client", claim_id=claim_id, **extra)
                break
            except AllocationError as exc:
                if exc.status not in (404, 409, 503) or left <= 0:
                    raise
                log.info("claiming %d of %s: %s (waiting)", count, env, exc)
            except OperatorUnreachable as exc:
                if left <= 0:
                    raise
                log.info("claiming %d of %s: operator unreachable: %s (retrying)", count, env, exc)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)
        # A late-binding fleet leaves the switch to us (switch="client"): each lease switches its
        # instance when it connects, so a group's switches run at once on its pods.
        return [Lease(i.environment, i.pod, i.mcp_url, i.control_url, self.scenarios.get(i.environment, ""),
                      got.id, unswitched=i.switched is False) for i in got.instances]

    async def release(self, claim_id: str) -> None:
        """Release one claim (the operator resets its instances); a failure is left to its TTL."""
        try:
            await self.alloc.release(claim_id)
        except (AllocationError, OperatorUnreachable) as exc:
            log.warning("releasing claim %s: %s", claim_id, exc)

    async def release_holder(self) -> None:
        """Release whatever this holder still has (none, usually: a crashed predecessor's claims,
        an episode cut short). An operator that does not know the fleet yet (404) holds none; a
        standby (503) or an unreachable one is asked a few times, then the claims are left to
        their TTL."""
        if self.holder is None:
            return
        for delay in (0.5, 1.0, 2.0, 4.0, 0.0):
            try:
                got = await self.alloc.release_holder(self.holder)
                if got.released:
                    log.warning("released %d claims (%d instances) that %s still held", len(got.released),
                                got.returned + got.replaced, self.holder)
                return
            except AllocationError as exc:
                if exc.status == 404:
                    return
                log.info("releasing the claims of %s: %s", self.holder, exc)
            except OperatorUnreachable as exc:
                log.info("releasing the claims of %s: operator unreachable: %s", self.holder, exc)
            await asyncio.sleep(delay)

    async def close(self) -> None:
        if self._own:
            await self.alloc.close()


class HeldClaimsSource(PoolSource):
    """Instances of an EnvFleet claimed once and held for the run (see the module's docstring).

    ``per_env`` instances of every environment are claimed at start (as GRPO groups of
    ``group_size`` when it divides ``per_env``), and released on close. In a campaign the claims
    are held as ``campaign/<name>``, and start first releases whatever that holder still has: a
    Job's retried pod gets the instances its crashed predecessor held at once, instead of after
    their TTL (the campaign's fleet has no others to give).
    """

    def __init__(self, settings: OperatorSettings, envs: list[str], per_env: int, group_size: int | None = None,
                 scenarios: Mapping[str, str] | None = None, *, claim_timeout_s: float = 1800.0,
                 claim_ttl_s: float | None = 600.0, ready_timeout_s: float = 120.0,
                 client: AllocationClient | None = None) -> None:
        super().__init__([], ready_timeout_s=ready_timeout_s)
        if per_env < 1:
            raise ValueError("per_env must be at least 1")
        self.settings = settings
        self._envs = list(envs)
        self.per_env, self.group_size = per_env, group_size
        self.claim_ttl_s = claim_ttl_s
        self.operator = OperatorClaims(settings, client=client, claim_timeout_s=claim_timeout_s, ttl_s=claim_ttl_s,
                                       scenarios=scenarios)
        self.alloc = self.operator.alloc
        self.holder = self.operator.holder
        self.claims: list[str] = []   # allocation-API claim ids, released on close
        self._renewer: asyncio.Task[None] | None = None

    def envs(self) -> list[str]:
        return list(self._envs)

    async def start(self) -> HeldClaimsSource:
        groups = self.group_size if self.group_size and self.group_size > 1 and self.per_env % self.group_size == 0 \
            else None
        try:
            await self.operator.release_holder()
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

    async def __aenter__(self) -> HeldClaimsSource:
        return await self.start()

    async def _claim(self, env: str, count: int, group_size: int | None) -> list[Lease]:
        leases = await self.operator.claim(env, count, group_size)
        self.claims.extend(dict.fromkeys(lease.claim_id for lease in leases if lease.claim_id))
        # Switched now, all at once (the operator leaves that to us): an environment the
        # instances refuse fails the claim here, as it would have failed at the operator, rather
        # than every episode's connect later.
        failed = [r for r in await asyncio.gather(*(lease.ensure_switched() for lease in leases), return_exceptions=True)
                  if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return leases

    async def _renew_forever(self) -> None:
        """Renew every claim at a third of its TTL. An operator without claim TTLs has nothing
        to renew (HTTP 405 on the first try): then stop."""
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
                except OperatorUnreachable as exc:
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
            await self.operator.release(claim_id)
            self.claims.remove(claim_id)
        await self.operator.close()


class OperatorSource(InstanceSource):
    """Instances of an EnvFleet, one operator claim per episode (or per GRPO group).

    ``envs`` names the fleet's environments (the allocation API claims by environment)."""

    def __init__(self, settings: OperatorSettings, envs: list[str], ttl_seconds: float | None = 600.0,
                 claim_timeout_s: float = 1800.0, client: AllocationClient | None = None,
                 scenarios: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self._envs = list(envs)
        self.operator = OperatorClaims(settings, client=client, claim_timeout_s=claim_timeout_s, ttl_s=ttl_seconds,
                                       scenarios=scenarios)
        self.alloc = self.operator.alloc
        self.holder = self.operator.holder
        self._turns = RoundRobin()

    def envs(self) -> list[str]:
        return list(self._envs)

    async def _connected(self, leases: list[Lease]) -> list[Lease]:
        try:
            # a group's switches at once; every connect ends before the group is given back
            failed = [r for r in await asyncio.gather(*(lease.connect() for lease in leases), return_exceptions=True)
                      if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:
            await self.release(leases, healthy=False)
            raise
        return leases

    async def claim(self, env: str | None = None) -> Lease:
        env = self._turns.pick(self._envs) if env is None else env
        (lease,) = await self._connected(await self.operator.claim(env, 1, None))
        return lease

    async def prepare(self, wants: Mapping[str, int]) -> None:
        """The operator makes them ready on the fleet's pods (a late-binding fleet; a pinned
        one refuses, which is fine: its pods serve their environment already)."""
        try:
            await self.alloc.prepare(wants)
        except (AllocationError, OperatorUnreachable) as exc:
            log.info("prepare %s: %s (claims will switch instead)", dict(wants), exc)

    async def claim_group(self, env: str, size: int) -> list[Lease]:
        return await self._connected(await self.operator.claim(env, size, size if size > 1 else None))

    async def release(self, leases: Lease | list[Lease], healthy: bool = True) -> None:
        """Release the claims the leases belong to (a group's one claim, once): the operator
        resets the instances, and replaces one whose reset fails."""
        leases = lease_list(leases)
        for lease in leases:
            await lease.disconnect()
        for claim_id in dict.fromkeys(lease.claim_id for lease in leases):
            if claim_id:
                await self.operator.release(claim_id)

    async def close(self) -> None:
        await self.operator.release_holder()  # an episode cut short: its instances go back now
        await self.operator.close()
