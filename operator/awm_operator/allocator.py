"""Binding claims to ready instances, and releasing them.

Binding is all-or-nothing. The pods are picked from the in-memory pool (``state.plan``), reserved
at once (so no other claim in this process picks them), then written to the fleet's ledger as one
claim record (``ledger.py``: a group-committed ConfigMap with optimistic concurrency). If another
operator replica took one of them first, the claim plans again with what is left. Nothing is
written to the pods.

Release resets every instance through its control API (``verify`` on: the state is checksummed
and repaired) and then removes the claim from the ledger, which returns the instances to the
pool; an instance whose reset fails is deleted instead, and the fleet's reconciler replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Mapping

import aiohttp

from awm.claims import Claim, ClaimedInstance, ClaimOutcome, ClaimRequest
from awm_operator.ledger import LostRace
from awm_operator.metrics import Metrics
from awm_operator.kube import Kube
from awm_operator.podhttp import PodHttp, PodHttpError
from awm_operator.pods import PodInfo
from awm_operator.state import ClaimRecord, Fleet, plan, plan_late, unsatisfiable

log = logging.getLogger("awm.operator.allocator")


MAX_CACHED = 64  # binding: late - environments of a pod's cached_envs taken into account (it keeps 1-16)
MAX_SWITCH_ROUNDS = 3  # binding: late - a claim whose pods fail to switch this often gives up
PREPARE_CONCURRENCY = 64  # binding: late - preparations of one request in flight (each one clone on its shard)


class Refused(RuntimeError):
    """A claim not bound; ``outcome`` says why, in the allocation API's words (and HTTP status)."""

    outcome = ClaimOutcome.REFUSED


class ClaimError(Refused):
    """The claim can never be bound as asked (bad request, unknown fleet or environment)."""


class NotActive(Refused):
    """This operator replica does not act on the fleet (kopf peering: another one does)."""

    outcome = ClaimOutcome.STANDBY


class Unavailable(Refused):
    """Not enough ready instances within the time the caller was willing to wait."""

    outcome = ClaimOutcome.UNALLOCATED


class InProgress(Refused):
    """The claim id is being bound by another request right now (a client that asked again
    before its first request ended): ask again once that one has."""

    outcome = ClaimOutcome.CONTENTION


@dataclass
class Bound:
    pod: PodInfo
    group: int
    env: str | None = None  # binding: late - the environment it was switched to
    switched: bool = True   # False: the client switches it to ``env`` (ClaimRequest.client_switches)

    def instance(self) -> ClaimedInstance:
        return ClaimedInstance(pod=self.pod.name, environment=self.env or self.pod.env, group=self.group,
                               mcp_url=self.pod.mcp_url, control_url=self.pod.control_url, switched=self.switched)


def describe(fleet: Fleet, claim_id: str) -> Claim | None:
    """A claim as the allocation API shows it: instances (lost ones flagged) and expiry."""
    record = fleet.claims.get(claim_id)
    if record is None:
        return None
    lost = set(fleet.lost_pods(claim_id))
    instances = []
    for i, group in enumerate(record.groups):
        for name in group:
            info = fleet.pods.get(name)
            instances.append(ClaimedInstance(pod=name, environment=fleet.env_of(name), group=i,
                                             mcp_url=info.mcp_url if info else None,
                                             control_url=info.control_url if info else None, switched=None,
                                             lost=name in lost))
    return Claim(id=claim_id, namespace=fleet.namespace, fleet=fleet.name, instances=instances, lost=len(lost),
                 expires_at=record.expires, holder=record.holder, owner=record.owner,
                 releasing=claim_id in fleet.releasing)


class Allocator:
    def __init__(self, kube: Kube, metrics: Metrics, reset_timeout: float = 30.0) -> None:
        self.kube = kube
        self.metrics = metrics
        self.reset_timeout = reset_timeout
        # A switch may load the environment's template on its first claim on the cluster.
        self.bind_timeout = max(reset_timeout, 300.0)
        self._http: aiohttp.ClientSession | None = None  # other HTTP (a catalog's index)
        self.pods = PodHttp()  # the pods' control API: switches and resets come by the thousand
        # work answered already: ledger writes of releases, preparations asked in the background
        self._forgetting: set[asyncio.Future[Any]] = set()

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.reset_timeout))
        return self._http

    async def close(self) -> None:
        if self._forgetting:
            await asyncio.gather(*self._forgetting, return_exceptions=True)
        await self.pods.close()
        if self._http is not None:
            await self._http.close()

    async def claim(self, fleet: Fleet, claim_id: str, req: ClaimRequest, wait: float | None,
                    source: str, ttl: float | None = None, holder: str | None = None,
                    owner: str | None = None) -> list[Bound]:
        """Bind ``req`` to ready instances of ``fleet``, waiting up to ``wait`` seconds (None:
        until bound) for enough of them. While it waits, its instances count as demand for the
        autoscaler. ``ttl``: seconds after which the operator releases the claim by itself."""
        t0 = time.monotonic()
        deadline = None if wait is None else t0 + wait
        problem = unsatisfiable(req, fleet.spec, fleet.selected)
        if problem:
            self.metrics.claims.labels(fleet.namespace, fleet.name, source, "failed").inc()
            raise ClaimError(problem)
        if claim_id in fleet.claiming:  # two binds of one id at once would each pick pods
            raise InProgress(f"claim {claim_id} is being bound by another request")
        fleet.claiming.add(claim_id)
        failed_switches = 0
        try:
            while True:
                if fleet.deleted:
                    raise ClaimError(f"fleet {fleet.name} was deleted")
                if claim_id in fleet.claims:
                    # Bound already: by another replica acting on the same EnvClaim at the same
                    # time (the ledger keeps its binding), or by this one before a restart cut
                    # its status write short. A claim is bound once; asking again returns it.
                    bound = [Bound(fleet.pods[n], i, fleet.env_of(n)) for i, g in enumerate(fleet.claims[claim_id].groups)
                             for n in g if n in fleet.pods]
                    if fleet.late:  # its pods may not have been switched yet (a restart, another replica)
                        switched = await self._switch(fleet, claim_id, bound, req)
                        if switched is None:
                            continue
                        bound = switched
                    self.metrics.claims.labels(fleet.namespace, fleet.name, source, "bound").inc()
                    return bound
                if fleet.active and fleet.ledger is not None:
                    groups = plan_late(fleet.available, req, fleet.prepared, fleet.holding) if fleet.late \
                        else plan(fleet.available, req)
                    if groups is not None:
                        bound = await self._bind(fleet, claim_id, groups, ttl, holder, owner)
                        if bound is not None and fleet.late:
                            bound = await self._switch(fleet, claim_id, bound, req)
                            if bound is None:
                                failed_switches += 1
                                if failed_switches >= MAX_SWITCH_ROUNDS:  # not one pod after another
                                    raise Unavailable(f"instances failed to switch to {req.environment!r} "
                                                      f"{failed_switches} times; see the operator's log")
                            elif claim_id not in fleet.claims:
                                raise ClaimError(f"claim {claim_id} was released while its instances switched")
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
                    fleet.pending[claim_id] = req
                    fleet.poke()  # the autoscaler sees the demand
                await fleet.wait_capacity(remaining)
        finally:
            fleet.claiming.discard(claim_id)
            if fleet.pending.pop(claim_id, None) is not None:
                fleet.nudge()  # less demand: the autoscaler may scale down, after its delay

    async def _bind(self, fleet: Fleet, claim_id: str, groups: list[list[str]],
                    ttl: float | None, holder: str | None = None, owner: str | None = None) -> list[Bound] | None:
        assert fleet.ledger is not None
        names = [n for g in groups for n in g]
        infos = {n: fleet.pods[n] for n in names}
        fleet.reserve(names)
        try:
            record = ClaimRecord(groups, expires=time.time() + ttl if ttl else None, holder=holder, owner=owner)
            await fleet.ledger.commit({claim_id: record})
        except LostRace as exc:
            log.info("fleet %s/%s: claim %s lost a race (%s); planning again", fleet.namespace, fleet.name,
                     claim_id, exc)
            return None
        finally:
            fleet.unreserve(names)  # held by the claim now (or free again if it lost)
        return [Bound(infos[n], i) for i, g in enumerate(groups) for n in g]

    async def _switch(self, fleet: Fleet, claim_id: str, bound: list[Bound], req: ClaimRequest) -> list[Bound] | None:
        """binding: late - switch the claim's pods to its environment (each GRPO group to one; a
        claim for no environment and no groups keeps whatever they serve). Every pod is asked,
        also one that serves it already (a no-op there): what this replica remembers of a pod's
        environment is never trusted for correctness. If one fails, the claim is undone, the
        failed pods are deleted (the reconciler replaces them) and the caller plans again. A claim
        whose client switches its pods (``client_switches``) is answered at once, each instance
        marked ``switched: false``."""
        targets: dict[str, str] = {}
        for b in bound:
            env = req.environment or (fleet.key_of(b.pod.name) if req.group_size else None)
            if env is not None:
                targets[b.pod.name] = env
        if not targets:
            return [replace(b, env=fleet.env_of(b.pod.name)) for b in bound]
        if req.client_switches:  # the client switches them: remembered as a hint for later plans only
            for name, env in targets.items():
                fleet.switched(name, env)
            return [replace(b, env=targets.get(b.pod.name) or fleet.env_of(b.pod.name),
                            switched=b.pod.name not in targets) for b in bound]
        pods = {b.pod.name: b.pod for b in bound}
        t0 = time.monotonic()
        results = await asyncio.gather(*(self._bind_env(pods[n], env) for n, env in targets.items()))
        self.metrics.switch_latency.labels(fleet.namespace, fleet.name).observe(time.monotonic() - t0)
        refused = {n: why for n, (ok, why, _) in zip(targets, results) if ok is None}
        failed = [n for n, (ok, _, _) in zip(targets, results) if ok is False]
        kinds: dict[str, int] = {}
        for (name, env), (ok, _, answer) in zip(targets.items(), results):
            if ok:
                fleet.switched(name, env, cached_envs(answer))
                kind = switch_kind(answer)
                kinds[kind] = kinds.get(kind, 0) + 1
        for kind, n in kinds.items():  # once per kind, not per pod: a GRPO step switches 1,024
            self.metrics.switches.labels(fleet.namespace, fleet.name, kind).inc(n)
        if refused or failed:
            assert fleet.ledger is not None
            await fleet.ledger.commit({claim_id: None})  # undone: its pods are free again
            if failed:  # their state is unknown (no answer, a server error): replaced
                log.warning("fleet %s/%s: claim %s: %d pods could not switch; replacing them", fleet.namespace,
                            fleet.name, claim_id, len(failed))
                await asyncio.gather(*(self._replace_pod(fleet, pods[name]) for name in failed))
            if refused:  # the environment is the problem (unknown, broken): asking again will not help
                raise ClaimError(next(iter(refused.values())))
            return None
        return [replace(b, env=targets.get(b.pod.name) or fleet.env_of(b.pod.name)) for b in bound]

    async def _bind_env(self, pod: PodInfo, env: str) -> tuple[bool | None, str, dict[str, Any]]:
        """Switch one pod: (True, "", its answer), (False, why, {}) when its state is unknown,
        (None, why, {}) when it refused the environment (4xx: the pod serves what it served)."""
        if not pod.control_url:
            return False, "no control URL", {}
        try:
            r = await self.pods.post_json(pod.control_url.rstrip("/") + "/bind", {"env": env}, self.bind_timeout)
            if 400 <= r.status < 500:
                return None, f"{pod.name} cannot serve {env!r}: {r.text()}", {}
            if r.status != 200:
                log.warning("switch of %s to %s failed: HTTP %s %s", pod.name, env, r.status, r.text(200))
                return False, f"HTTP {r.status}", {}
            answer = r.json()
        except (PodHttpError, ValueError) as exc:
            log.warning("switch of %s to %s failed: %s", pod.name, env, exc)
            return False, str(exc), {}
        if not isinstance(answer, dict) or answer.get("env") != env:
            return False, "it answered with another environment", {}
        return True, "", answer

    async def prepare(self, fleet: Fleet, wants: dict[str, int], background: bool = False) -> dict[str, Any]:
        """binding: late - make environments ready on pods ahead of their claims (``wants``:
        environment -> instances), e.g. the environments of a GRPO step's next groups: each pod
        chosen (:meth:`Fleet.to_prepare`) acquires a database of its environment and checks it
        while it waits or runs another episode, and a claim of that environment then lands on
        it and costs a reset instead of a switch (the switch's database clone, ~150 ms on a
        loaded disk, moves off the claim path). Returns what was asked, made and failed; with
        ``background``, once the pods are chosen (what they make is in the operator's metrics)."""
        if not fleet.late:
            raise ClaimError(f"fleet {fleet.name} is pinned: its pods serve the environment they were made for")
        known = fleet.selected if fleet.selected is not None else (fleet.spec.environments if fleet.spec else [])
        unknown = [env for env in wants if env not in known]
        if unknown:
            raise ClaimError(f"environment {unknown[0]!r} is not in the fleet")
        if not fleet.active:
            raise NotActive(f"this operator replica does not act on fleet {fleet.name}")
        chosen = fleet.to_prepare(wants)
        for name, env in chosen.items():
            fleet.mark_prepared(name, env)
        gate = asyncio.Semaphore(PREPARE_CONCURRENCY)

        async def one(name: str, env: str) -> str:
            async with gate:
                outcome, answer = await self._prepare_env(fleet.pods.get(name), env)
            if outcome == "failed" and fleet.prepared.get(name) == env:
                fleet.mark_prepared(name, None)
            elif outcome != "failed" and name in fleet.pods:
                fleet.holds(name, cached_envs(answer) or ())
            self.metrics.prepares.labels(fleet.namespace, fleet.name, outcome).inc()
            return outcome

        work = asyncio.gather(*(one(n, e) for n, e in chosen.items()))
        asked = {"asked": sum(wants.values()), "chosen": len(chosen), "pods": dict(chosen)}
        if background:
            task = asyncio.ensure_future(work)
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)
            return asked
        results = await work
        return {**asked, **{k: results.count(k) for k in ("prepared", "cached", "failed")}}

    async def _prepare_env(self, pod: PodInfo | None, env: str) -> tuple[str, dict[str, Any]]:
        """One pod: "prepared" (a database made ready), "cached" (it had the environment
        already), or "failed"; and its answer."""
        if pod is None or not pod.control_url or pod.deleting:
            return "failed", {}
        try:
            r = await self.pods.post_json(pod.control_url.rstrip("/") + "/prepare", {"env": env}, self.bind_timeout)
            if r.status != 200:
                log.warning("preparing %s on %s failed: HTTP %s %s", env, pod.name, r.status, r.text(200))
                return "failed", {}
            answer = r.json()
        except (PodHttpError, ValueError) as exc:
            log.warning("preparing %s on %s failed: %s", env, pod.name, exc)
            return "failed", {}
        if not isinstance(answer, dict) or answer.get("env") != env:
            return "failed", {}
        return ("prepared" if answer.get("prepared") else "cached"), answer

    async def renew(self, fleet: Fleet, claim_id: str, ttl: float) -> float:
        """Push a claim's expiry to ``ttl`` seconds from now; returns the new expiry."""
        record = fleet.claims.get(claim_id)
        if record is None or fleet.ledger is None:
            raise ClaimError(f"no claim {claim_id} in fleet {fleet.name}")
        renewed = replace(record, expires=time.time() + ttl)
        await fleet.ledger.commit({claim_id: renewed})
        return float(renewed.expires or 0)

    async def release(self, fleet: Fleet, claim_id: str, durable: bool = True) -> tuple[int, int]:
        """Reset every instance of the claim, then remove it from the ledger; (returned, replaced).
        Lost instances (their pods gone) count as neither.

        ``durable=False`` (the allocation API's release of one claim) answers once the instances
        are reset and writes the ledger after: a client then waits for one ledger write per claim
        and release cycle, not two. The instances return to the pool only once that write is
        done either way (the claim stays marked as releasing until then). If the operator dies
        before it, the claim stays in the ledger until its TTL; nothing is handed out twice."""
        if claim_id in fleet.releasing or claim_id not in fleet.claims:
            return 0, 0
        if fleet.ledger is None:
            raise NotActive(f"this operator replica does not act on fleet {fleet.name}")
        fleet.releasing.add(claim_id)
        try:
            pods = fleet.claim_pods(claim_id)
            results = await asyncio.gather(*(self._reset_or_replace(fleet, p) for p in pods))
            if durable:
                await fleet.ledger.commit({claim_id: None})
            else:
                task = asyncio.create_task(self._forget(fleet, claim_id), name=f"awm release {claim_id}")
                self._forgetting.add(task)
                task.add_done_callback(self._forgetting.discard)
        finally:
            if durable:
                fleet.releasing.discard(claim_id)
        returned = sum(1 for r in results if r)
        replaced = len(results) - returned
        self.metrics.releases.labels(fleet.namespace, fleet.name, "returned").inc(returned)
        self.metrics.releases.labels(fleet.namespace, fleet.name, "replaced").inc(replaced)
        if replaced:
            fleet.poke()  # doomed pods: their replacements are created at once
        return returned, replaced

    async def _forget(self, fleet: Fleet, claim_id: str) -> None:
        """The ledger write of a release that was answered already."""
        try:
            assert fleet.ledger is not None
            await fleet.ledger.commit({claim_id: None})
        except Exception as exc:  # noqa: BLE001 - the claim stays (expires by its TTL, or is released again)
            log.warning("fleet %s/%s: release of %s not written to the ledger: %s", fleet.namespace, fleet.name,
                        claim_id, exc)
        finally:
            fleet.releasing.discard(claim_id)

    async def _reset_or_replace(self, fleet: Fleet, pod: PodInfo) -> bool:
        """True if the instance was reset; else it is deleted (the reconciler replaces it). A
        late pod's answer says what it serves and keeps (a client may have switched it)."""
        answer = await self._reset(pod)
        if answer is not None:
            env = answer.get("env")
            if fleet.late and isinstance(env, str) and env and pod.name in fleet.pods:
                fleet.reported(pod.name, env, cached_envs(answer))
            return True
        await self._replace_pod(fleet, pod)
        return False

    async def _replace_pod(self, fleet: Fleet, pod: PodInfo) -> None:
        """Delete an instance that failed us; the reconciler creates its replacement at once."""
        current = fleet.pods.get(pod.name)
        if current is not None:
            fleet.doom(current)  # the reconciler creates its replacement right away
        try:
            await self.kube.delete_pod(fleet.namespace, pod.name)
            self.metrics.pod_operations.labels(fleet.namespace, fleet.name, "delete").inc()
        except Exception as exc:  # noqa: BLE001 - the reconciler deletes doomed pods again if needed
            log.warning("could not delete %s/%s after it failed: %s", fleet.namespace, pod.name, exc)

    async def _reset(self, pod: PodInfo) -> dict[str, Any] | None:
        """The pod's answer to a verified reset; None if it failed or was not pristine."""
        if not pod.control_url or pod.deleting or pod.failed:
            return None
        try:
            r = await self.pods.post_json(pod.control_url.rstrip("/") + "/reset", {"task_id": None, "verify": True},
                                          self.reset_timeout)
            if r.status != 200:
                log.warning("reset of %s failed: HTTP %s %s", pod.name, r.status, r.text(200))
                return None
            answer = r.json()
        except (PodHttpError, ValueError) as exc:
            log.warning("reset of %s failed: %s", pod.name, exc)
            return None
        if not isinstance(answer, dict) or answer.get("pristine", True) is False:
            return None
        return answer


def cached_envs(answer: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The environments a late pod said it keeps (``cached_envs`` of its answers to /bind,
    /prepare and /reset), or None where it did not say; only names, at most MAX_CACHED."""
    envs = answer.get("cached_envs")
    if not isinstance(envs, list):
        return None
    return tuple(e for e in envs[:MAX_CACHED] if isinstance(e, str) and 0 < len(e) <= 253)


def switch_kind(answer: Mapping[str, Any]) -> str:
    """What a pod's /bind cost it: serving (it served the environment), cached (a reset of an
    environment it kept), new (a new database)."""
    if not answer.get("switched"):
        return "serving"
    return "cached" if answer.get("cached") else "new"
