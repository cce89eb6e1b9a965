"""Ending a fleet's claims that nobody will release, and telling EnvClaims what they lost.

A claim ends when its holder releases it, or when its EnvClaim is deleted (handlers.py). Two
kinds would otherwise hold their instances for good: claims whose ``ttlSeconds`` ran out, and
EnvClaims' claims whose object was deleted while no operator replica watched (found in the
ledger after a take-over). This job of the fleet's reconciler releases both, in the background
(a release resets the pods through their control API: a slow pod must not hold up the pass).
It also reports instances lost (pod deleted, evicted, failed) on their EnvClaim's status, so a
trainer watching it can react.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from awm_operator import conditions
from awm_operator.allocator import Allocator
from awm_operator.crds import EnvClaimStatus
from awm_operator.fleet_wakeups import WakeUps
from awm_operator.kube import ApiError, Kube
from awm_operator.metrics import Metrics
from awm_operator.phases import ClaimPhase
from awm_operator.state import Fleet

log = logging.getLogger("awm.operator.reconcile")  # one of the fleet reconciler's jobs: its log

ORPHAN_GRACE = 10.0  # seconds a claim must stay unknown before its pods are released
_background: set[asyncio.Task[Any]] = set()


class ClaimKeeper:
    """The fleet's expired and vanished claims, and the lost instances its EnvClaims were told of.

    ``known_claims`` is the operator's set of (namespace, claim id) of the EnvClaims it watches
    (kept by handlers.py); ``started`` is when the operator started (monotonic)."""

    def __init__(self, fleet: Fleet, kube: Kube, allocator: Allocator, metrics: Metrics,
                 known_claims: set[tuple[str, str]], started: float, wakeups: WakeUps) -> None:
        self.fleet, self.kube, self.allocator, self.metrics = fleet, kube, allocator, metrics
        self.known_claims, self.started, self.wakeups = known_claims, started, wakeups
        self.orphans: dict[str, float] = {}  # claim -> when it was first found without its EnvClaim
        self.expiring: set[str] = set()  # claims being released in the background
        self.reported_lost: dict[str, tuple[str, ...]] = {}  # EnvClaim id -> lost pods

    def release_orphans(self, now: float) -> None:
        """Release claims whose TTL ran out, and EnvClaims' claims whose object is gone (deleted
        while no operator replica watched; after a grace period, as the claim watch may lag)."""
        fleet = self.fleet
        wall = time.time()
        next_expiry: float | None = None
        for claim, record in list(fleet.claims.items()):
            if claim in fleet.releasing or claim in self.expiring:
                continue
            if record.expires is not None:
                if record.expires <= wall:
                    log.info("fleet %s/%s: claim %s expired; releasing it", fleet.namespace, fleet.name, claim)
                    self.metrics.claims_expired.labels(fleet.namespace, fleet.name).inc()
                    self.release_later(claim, expired=not claim.startswith("api_"))
                    continue
                next_expiry = min(next_expiry or record.expires, record.expires)
            if claim.startswith("api_") or (fleet.namespace, claim) in self.known_claims:
                self.orphans.pop(claim, None)
                continue
            first = self.orphans.setdefault(claim, now)
            if now - first >= ORPHAN_GRACE and now - self.started >= ORPHAN_GRACE:
                del self.orphans[claim]
                log.info("fleet %s/%s: releasing instances of vanished claim %s", fleet.namespace, fleet.name, claim)
                self.release_later(claim)
        for claim in set(self.orphans) - set(fleet.claims):
            del self.orphans[claim]
        if self.orphans:
            self.wakeups.at(ORPHAN_GRACE / 2, "orphans")
        if next_expiry is not None:
            self.wakeups.at(max(0.0, next_expiry - wall) + 0.05, "expiry")

    def release_later(self, claim: str, expired: bool = False) -> None:
        """Release a claim in the background; an EnvClaim whose TTL ran out first says so in its
        status (phase Expired, no instances), so nobody keeps using instances now in the pool."""
        fleet = self.fleet
        self.expiring.add(claim)

        async def release() -> None:
            try:
                if expired:
                    message = "ttlSeconds ran out: the instances went back to the pool"
                    status = EnvClaimStatus(phase=ClaimPhase.EXPIRED, instances=[], lost=[], message=message,
                                            conditions=conditions.claim_conditions(ClaimPhase.EXPIRED, message))
                    try:
                        await self.kube.patch_status("envclaims", fleet.namespace, claim.rsplit(".", 1)[0], status)
                    except ApiError as exc:
                        if exc.status != 404:
                            raise
                await self.allocator.release(fleet, claim)
            except Exception as exc:  # noqa: BLE001 - the next pass tries again
                log.warning("fleet %s/%s: releasing claim %s failed: %s", fleet.namespace, fleet.name, claim, exc)
                asyncio.get_running_loop().call_later(2.0, fleet.poke)
            finally:
                self.expiring.discard(claim)

        task = asyncio.create_task(release())
        _background.add(task)  # keep a reference until it is done
        task.add_done_callback(_background.discard)

    async def report_lost(self) -> None:
        """An EnvClaim whose instances were lost (pod deleted, evicted, failed) says so in its
        status: phase Degraded and the lost pods, so a trainer watching it can react. Instances
        of allocation-API claims are flagged by ``GET .../claims/{id}``."""
        fleet = self.fleet
        for claim in list(fleet.claims):
            if claim.startswith("api_"):
                continue
            lost = tuple(fleet.lost_pods(claim))
            if lost == self.reported_lost.get(claim, ()):
                continue
            name = claim.rsplit(".", 1)[0]
            total = len(fleet.claims[claim].pods)
            message = f"{len(lost)} of {total} instances lost: {', '.join(lost[:5])}"
            status = EnvClaimStatus(phase=ClaimPhase.DEGRADED, lost=list(lost), message=message,
                                    conditions=conditions.claim_conditions(ClaimPhase.DEGRADED, message))
            try:
                await self.kube.patch_status("envclaims", fleet.namespace, name, status)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("fleet %s/%s: cannot report lost instances on claim %s: %s",
                                fleet.namespace, fleet.name, name, exc)
                    continue
            self.reported_lost[claim] = lost
        for claim in set(self.reported_lost) - set(fleet.claims):
            del self.reported_lost[claim]
