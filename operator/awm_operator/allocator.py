"""Binding claims to ready instances, and releasing them.

Binding is all-or-nothing. The pods are picked from the in-memory pool (``state.plan``), reserved
at once, then moved ``ready -> allocated`` by JSON patches whose first op tests the state label:
the API server applies a JSON patch atomically against the stored object, so of two claimants
(two operator replicas, or an operator and a stale cache) exactly one wins a pod. A loser rolls
back what it had taken and plans again. Nothing else writes ``allocated``.

Release resets every instance through its control API (``verify`` on: the state is checksummed
and repaired) and moves it back to ``ready``; an instance whose reset fails is deleted, and the
fleet's reconciler replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from awm_operator.kube import ApiError, Kube, escape
from awm_operator.metrics import Metrics
from awm_operator.pods import A_CLAIM, ALLOCATED, L_STATE, READY, PodInfo
from awm_operator.state import ClaimRequest, Fleet, plan

log = logging.getLogger("awm.operator.allocator")

STATE_PATH = f"/metadata/labels/{escape(L_STATE)}"
CLAIM_PATH = f"/metadata/annotations/{escape(A_CLAIM)}"


class ClaimError(RuntimeError):
    """The claim can never be bound as asked (bad request, unknown fleet or environment)."""


class NotActive(RuntimeError):
    """This operator replica does not act on the fleet (kopf peering: another one does)."""


class Unavailable(RuntimeError):
    """Not enough ready instances within the time the caller was willing to wait."""


@dataclass
class Bound:
    pod: PodInfo
    group: int

    def as_status(self) -> dict[str, Any]:
        return {"pod": self.pod.name, "environment": self.pod.env, "group": self.group,
                "mcpUrl": self.pod.mcp_url, "controlUrl": self.pod.control_url}


def allocate_ops(claim_id: str, state: str = READY) -> list[dict[str, Any]]:
    """Compare-and-swap: only if the state label still has the value we saw (ready or starting)."""
    return [{"op": "test", "path": STATE_PATH, "value": state},
            {"op": "replace", "path": STATE_PATH, "value": ALLOCATED},
            {"op": "add", "path": CLAIM_PATH, "value": claim_id}]


def return_ops(claim_id: str) -> list[dict[str, Any]]:
    return [{"op": "test", "path": CLAIM_PATH, "value": claim_id},
            {"op": "replace", "path": STATE_PATH, "value": READY},
            {"op": "remove", "path": CLAIM_PATH}]


class Allocator:
    def __init__(self, kube: Kube, metrics: Metrics, reset_timeout: float = 30.0) -> None:
        self.kube = kube
        self.metrics = metrics
        self.http = httpx.AsyncClient(timeout=reset_timeout, limits=httpx.Limits(max_connections=256))

    async def close(self) -> None:
        await self.http.aclose()

    async def claim(self, fleet: Fleet, claim_id: str, req: ClaimRequest, wait: float | None,
                    source: str) -> list[Bound]:
        """Bind ``req`` to ready instances of ``fleet``, waiting up to ``wait`` seconds (None:
        until bound) for enough of them. While it waits, its instances count as demand for the
        autoscaler."""
        t0 = time.monotonic()
        deadline = None if wait is None else t0 + wait
        problem = req.problem(fleet.spec)
        if problem:
            self.metrics.claims.labels(fleet.namespace, fleet.name, source, "failed").inc()
            raise ClaimError(problem)
        try:
            while True:
                if fleet.deleted:
                    raise ClaimError(f"fleet {fleet.name} was deleted")
                if fleet.active:
                    groups = plan(fleet.available, req)
                    if groups is not None:
                        bound = await self._bind(fleet, claim_id, groups)
                        if bound is not None:
                            self.metrics.claims.labels(fleet.namespace, fleet.name, source, "bound").inc()
                            self.metrics.claim_latency.labels(source).observe(time.monotonic() - t0)
                            return bound
                        continue  # lost a race to another replica: plan again with what is left
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self.metrics.claims.labels(fleet.namespace, fleet.name, source, "timeout").inc()
                    if not fleet.active:
                        raise NotActive(f"this operator replica does not act on fleet {fleet.name}")
                    raise Unavailable(f"fewer than {req.count} ready instances"
                                      + (f" of {req.environment}" if req.environment else "")
                                      + (f" in groups of {req.group_size}" if req.group_size else ""))
                if claim_id not in fleet.pending:
                    fleet.pending[claim_id] = req.count
                    fleet.poke()  # the autoscaler sees the demand
                await fleet.wait_capacity(remaining)
        finally:
            if fleet.pending.pop(claim_id, None) is not None:
                fleet.poke()

    async def _bind(self, fleet: Fleet, claim_id: str, groups: list[list[str]]) -> list[Bound] | None:
        names = [n for g in groups for n in g]
        fleet.reserve(names)
        taken: list[str] = []
        lost = False
        error: BaseException | None = None
        try:
            results = await asyncio.gather(
                *(self.kube.patch_pod(fleet.namespace, n, allocate_ops(claim_id, fleet.pods[n].state)) for n in names),
                return_exceptions=True)
            for name, result in zip(names, results):
                if isinstance(result, BaseException):
                    if isinstance(result, ApiError) and result.lost_race:
                        fleet.forget_available(name)
                        lost = True
                    else:
                        error = result
                else:
                    fleet.update_pod(PodInfo.from_pod(result))
                    taken.append(name)
        finally:
            fleet.unreserve(names)  # the cache says allocated now (or the pod lost a race)
        if lost or error is not None:
            await self._give_back(fleet, claim_id, taken)
            if error is not None:
                raise error
            return None
        by_name = {n: i for i, g in enumerate(groups) for n in g}
        return [Bound(fleet.pods[n], by_name[n]) for n in names]

    async def _give_back(self, fleet: Fleet, claim_id: str, names: list[str]) -> None:
        """Undo a partial bind: the instances were never handed out, so no reset is needed."""
        async def one(name: str) -> None:
            try:
                fleet.update_pod(PodInfo.from_pod(await self.kube.patch_pod(fleet.namespace, name, return_ops(claim_id))))
            except ApiError as exc:
                log.warning("could not return %s/%s after a partial bind: %s", fleet.namespace, name, exc)
        await asyncio.gather(*(one(n) for n in names))

    async def release(self, fleet: Fleet, claim_id: str) -> tuple[int, int]:
        """Reset and return every instance of the claim; (returned, replaced)."""
        pods = fleet.claim_pods(claim_id)
        results = await asyncio.gather(*(self._release_one(fleet, claim_id, p) for p in pods))
        returned = sum(1 for r in results if r == "returned")
        replaced = sum(1 for r in results if r == "replaced")
        fleet.poke()
        return returned, replaced

    async def _release_one(self, fleet: Fleet, claim_id: str, pod: PodInfo) -> str:
        ok = await self._reset(pod)
        if ok:
            try:
                fleet.update_pod(PodInfo.from_pod(
                    await self.kube.patch_pod(fleet.namespace, pod.name, return_ops(claim_id))))
                self.metrics.releases.labels(fleet.namespace, fleet.name, "returned").inc()
                return "returned"
            except ApiError as exc:
                if exc.lost_race:
                    return "gone"
                log.warning("could not return %s/%s to the pool: %s; replacing it", fleet.namespace, pod.name, exc)
        current = fleet.pods.get(pod.name)
        if current is not None:
            fleet.doom(current)  # the reconciler creates its replacement right away
        await self.kube.delete_pod(fleet.namespace, pod.name)
        self.metrics.releases.labels(fleet.namespace, fleet.name, "replaced").inc()
        self.metrics.pod_operations.labels(fleet.namespace, fleet.name, "delete").inc()
        return "replaced"

    async def _reset(self, pod: PodInfo) -> bool:
        if not pod.control_url or pod.deleting or pod.failed:
            return False
        try:
            r = await self.http.post(pod.control_url.rstrip("/") + "/reset", json={"task_id": None, "verify": True})
            if r.status_code != 200:
                log.warning("reset of %s failed: HTTP %s %s", pod.name, r.status_code, r.text[:200])
                return False
            return r.json().get("pristine", True) is not False
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("reset of %s failed: %s", pod.name, exc)
            return False
