"""Keeping one fleet at its desired size: the body of the fleet's kopf daemon.

Level-triggered, like a controller-runtime reconciler: every pass looks at the whole cached
state (pods from the watch, the live EnvFleet body) and converges it, so missed or coalesced
events cost nothing but a little latency. Pod events, spec changes and waiting claims wake the
loop (``Fleet.poke``); bursts of events are coalesced into one pass every
``reconcile_min_interval`` seconds. Claims bound and released only change the status's counts
(``Fleet.nudge``): a pass every ``status_min_interval`` seconds is soon enough for them.

Taking a fleet over (start-up, or a standby replica becoming active) first reads its ledger, so
no allocated instance is handed out or scaled away. One pass: delete failed pods; create or
delete pods to match ``replicas`` spread over the environments (each holding at least its
allocated instances and what waiting claims ask of it; never deleting allocated ones);
release claims whose TTL ran out and claims whose EnvClaim is gone; report lost instances on
their EnvClaims; autoscale; patch the EnvFleet status; now and then drop the databases of pods
that are gone. In the background, the fleet's Postgres shards are probed every few seconds: new
pods go to the shard with the most free connection slots, none while no shard answers, and the
pods of a shard that stayed down for ``shard_lost_after`` seconds are replaced on the others.

The pass and the pods' creation, deletion and scaling are here; each other job is a class of its
own that keeps its own state (fleet_selection.py, fleet_connections.py, fleet_shards.py,
fleet_claims.py, fleet_status.py, fleet_sweep.py, and their wake-up timers in fleet_wakeups.py),
which :class:`Reconciler` builds and calls in turn: a job's state is changed by that job alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from awm_operator.allocator import Allocator
from awm_operator.autoscale import ScaleDownGate, desired_replicas
from awm_operator.config import OperatorConfig
from awm_operator.databases import Shard
from awm_operator.fleet_claims import ClaimKeeper
from awm_operator.fleet_connections import ConnectAhead
from awm_operator.fleet_selection import EnvironmentSelection
from awm_operator.fleet_shards import FleetShards
from awm_operator.fleet_status import StatusWriter
from awm_operator.fleet_sweep import DatabaseSweep
from awm_operator.fleet_wakeups import WakeUps
from awm_operator.kube import ApiError, Kube
from awm_operator.ledger import Ledger
from awm_operator.metrics import Metrics
from awm_operator.pods import PodInfo, pod_manifest, spread
from awm_operator.state import Fleet

if TYPE_CHECKING:  # campaigns.py imports this module: a type only (import-linter skips these imports)
    from awm_operator.campaigns import Campaigns

log = logging.getLogger("awm.operator.reconcile")

RETRY_BASE_S, RETRY_MAX_S = 1.0, 30.0  # after a failed pass, the next one in 1, 2, 4 ... 30 s


@dataclass
class Context:
    """What every fleet's reconciler shares (built once by the startup handler)."""

    kube: Kube
    allocator: Allocator
    metrics: Metrics
    config: OperatorConfig
    known_claims: set[tuple[str, str]] = field(default_factory=set)   # (namespace, claim id) of EnvClaims
    campaigns: Campaigns | None = None         # built on first use (campaigns_of)
    started: float = field(default_factory=time.monotonic)


@dataclass
class Reconciler:
    """One fleet's reconcile loop: the pass over its pods, composed of the jobs it runs each pass.

    Each job owns its state and, where it has one, its background task: the selector's index
    read (``selection``), connections opened ahead to free pods (``connections``), the shard
    probes and placement (``shards``), expired and vanished claims (``claims``), the status
    write (``status``, handed what it reports), the database sweep (``sweep``); ``wakeups`` holds
    the timers they ask for. Pods are created, deleted and scaled here."""

    fleet: Fleet
    ctx: Context
    gate: ScaleDownGate = field(init=False)
    wakeups: WakeUps = field(init=False)
    selection: EnvironmentSelection = field(init=False)
    connections: ConnectAhead = field(init=False)
    shards: FleetShards = field(init=False)
    claims: ClaimKeeper = field(init=False)
    status: StatusWriter = field(init=False)
    sweep: DatabaseSweep = field(init=False)

    def __post_init__(self) -> None:
        fleet, ctx = self.fleet, self.ctx
        self.gate = ScaleDownGate(ctx.config.scale_down_delay)
        self.wakeups = WakeUps(fleet)
        self.selection = EnvironmentSelection(fleet, ctx.kube, ctx.allocator)
        self.connections = ConnectAhead(fleet, ctx.allocator)
        self.shards = FleetShards(fleet, ctx.kube, ctx.metrics, ctx.config, self.wakeups)
        self.claims = ClaimKeeper(fleet, ctx.kube, ctx.allocator, ctx.metrics, ctx.known_claims, ctx.started,
                                  self.wakeups)
        self.status = StatusWriter(fleet, ctx.kube, ctx.metrics, ctx.config, self.selection, self.shards, self.wakeups)
        self.sweep = DatabaseSweep(fleet, ctx.kube, ctx.config, ctx.started, self.wakeups)

    async def run(self, stopped: Any) -> None:
        """Until kopf stops the daemon (fleet deleted, operator paused or exiting)."""
        cfg, fleet = self.ctx.config, self.fleet
        halt = asyncio.ensure_future(stopped.wait())
        try:
            if not await self.take_over(stopped):
                return
            fleet.active = True
            fleet.poke()
            fleet._grew()  # claims that waited while no replica acted may proceed
            last, failures = 0.0, 0
            while not stopped:
                woken = asyncio.ensure_future(fleet.wake.wait())
                await asyncio.wait([woken, halt], timeout=cfg.resync_interval, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
                fleet.wake.clear()
                interval = cfg.reconcile_min_interval if fleet.urgent else \
                    max(cfg.reconcile_min_interval, cfg.status_min_interval)
                fleet.urgent = False
                pause = last + interval - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                if stopped or fleet.deleted:
                    break
                last = time.monotonic()
                try:
                    with self.ctx.metrics.reconcile.time():
                        again = await self.reconcile()
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - an API timeout, a dropped connection
                    # Level-triggered: the next pass starts over from the cached state. Letting
                    # it end the daemon would leave the fleet unattended for kopf's back-off (60 s).
                    failures += 1
                    delay = min(RETRY_BASE_S * 2 ** (failures - 1), RETRY_MAX_S)
                    log.warning("fleet %s/%s: reconcile pass failed (%s: %s); again in %.0f s",
                                fleet.namespace, fleet.name, type(exc).__name__, exc, delay)
                    self.wakeups.at(delay, "retry")
                    again = False
                if again:
                    fleet.poke()
        finally:
            halt.cancel()
            self.selection.cancel()
            self.sweep.cancel()
            self.shards.cancel()
            self.connections.cancel()
            self.wakeups.cancel()
            fleet.active = False
            fleet.ledger = None

    async def take_over(self, stopped: Any) -> bool:
        """Read the fleet's ledger (retrying while the API server is unreachable); False if the
        daemon was stopped first."""
        ledger = Ledger(self.ctx.kube, self.fleet, self.ctx.metrics, self.ctx.config.ledger_shard_bytes)
        delay = 0.5
        while not stopped:
            try:
                await ledger.load()
                self.fleet.ledger = ledger
                return True
            except Exception as exc:  # noqa: BLE001 - keep trying: the fleet cannot act without it
                log.warning("fleet %s/%s: cannot read its ledger: %s", self.fleet.namespace, self.fleet.name, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
        return False

    async def reconcile(self) -> bool:
        """One pass; True if there is more to do right away."""
        fleet, cfg = self.fleet, self.ctx.config
        spec = fleet.spec
        if spec is None:
            await self.status.write(force=False)
            return False
        now = time.monotonic()
        sem = asyncio.Semaphore(cfg.create_concurrency)
        jobs: list[Awaitable[Any]] = []

        def job(fn: Callable[[], Awaitable[Any]]) -> None:
            async def limited() -> None:
                async with sem:
                    try:
                        await fn()
                    except ApiError as exc:
                        if not exc.lost_race:
                            log.warning("fleet %s/%s: %s", fleet.namespace, fleet.name, exc)
            jobs.append(limited())

        environments = await self.selection.environments(now)
        self.shards.probe(now)
        pods = [p for p in fleet.pods.values() if not p.deleting]
        # 1. failed pods are deleted (and so replaced below, on the next pass); so are the pods
        # of a lost database shard, allocated or not (their claims report them lost)
        lost = {s.name for s in fleet.shards.values() if s.lost}
        for p in pods:
            if p.failed or p.shard in lost:
                if not p.failed:
                    log.warning("fleet %s/%s: replacing pod %s: its database shard %s is lost", fleet.namespace,
                                fleet.name, p.name, p.shard)
                fleet.doom(p)
                job(lambda p=p: self.delete(p, guarded=False))
        live = [p for p in pods if not p.failed and p.shard not in lost]
        self.connections.start()
        starting = Counter(p.shard for p in live if not p.ready)
        # 2. count per environment (none while a selector's index was never read: pods stay as they are)
        by_env: dict[str, list[PodInfo]] = {}
        for p in live:
            by_env.setdefault(p.env, []).append(p)
        desired = spread(spec.replicas, environments, fleet.floors(environments, spec.replicas),
                         {env: len(ps) for env, ps in by_env.items()}) \
            if environments is not None else {p.env: 0 for p in live}
        more = False
        self.shards.placement_error = None  # said again below if a pod finds no shard
        budget = max(cfg.create_concurrency * 4, 64)  # writes per pass: passes stay short
        for env in list(by_env) + [e for e in desired if e not in by_env]:
            if environments is None:
                break
            have, want = by_env.get(env, []), desired.get(env, 0)
            if len(have) < want:
                n = min(want - len(have), budget)
                budget -= n
                more |= n < want - len(have)
                for _ in range(n):
                    shard = self.shards.place(starting)
                    if shard is None:  # no shard answers, or none has a free slot: said, retried
                        break
                    job(lambda env=env, shard=shard: self.create(env, shard))
            elif len(have) > want:
                for p in self.victims(have, len(have) - want):
                    fleet.doom(p)  # now, so no claim picks it while the deletion is in flight
                    job(lambda p=p: self.delete(p, guarded=True))
        # 3. claims to end: TTL run out, or an EnvClaim deleted while no operator watched
        self.claims.release_orphans(now)
        if jobs:
            await asyncio.gather(*jobs)
        await self.claims.report_lost()
        # 5. autoscale, status, databases
        await self.autoscale(now)
        await self.status.write(force=False)
        self.sweep.start_if_due(now)
        return more

    def victims(self, pods: list[PodInfo], n: int) -> list[PodInfo]:
        """Scale down: never allocated or reserved pods; not-ready ones first, then the newest."""
        free = [p for p in pods if p.name not in self.fleet.owner and p.name not in self.fleet.reserved]
        free.sort(key=lambda p: (p.ready, -p.rv))
        return free[:n]

    async def create(self, env: str, shard: Shard) -> None:
        fleet = self.fleet
        assert fleet.spec is not None
        pod = pod_manifest(fleet.name, fleet.namespace, fleet.uid, fleet.spec, env, self.ctx.config,
                           shard=shard.name, dsn_key=shard.key)
        created = await self.ctx.kube.create_pod(fleet.namespace, pod)
        fleet.update_pod(PodInfo.from_pod(created))
        self.ctx.metrics.pod_operations.labels(fleet.namespace, fleet.name, "create").inc()

    async def delete(self, pod: PodInfo, guarded: bool) -> None:
        """``guarded``: only the version we looked at (a resourceVersion precondition), so a pod
        that another operator replica allocated meanwhile survives the scale-down."""
        try:
            await self.ctx.kube.delete_pod(self.fleet.namespace, pod.name, pod.rv if guarded else None)
        except ApiError as exc:
            if exc.status == 409:
                self.fleet.spare(pod)
                return
            raise
        self.ctx.metrics.pod_operations.labels(self.fleet.namespace, self.fleet.name, "delete").inc()

    async def autoscale(self, now: float) -> None:
        fleet, spec = self.fleet, self.fleet.spec
        assert spec is not None
        if not spec.autoscale:
            return
        counts = fleet.counts()
        target = desired_replicas(counts.allocated, fleet.demand(), spec.buffer, spec.min_replicas, spec.max_replicas)
        decision = self.gate.decide(spec.replicas, target, now)
        if decision is not None and decision != spec.replicas:
            log.info("fleet %s/%s: autoscaling %d -> %d (allocated %d, demand %d, buffer %d)", fleet.namespace,
                     fleet.name, spec.replicas, decision, counts.allocated, fleet.demand(), spec.buffer)
            await self.ctx.kube.patch_spec("envfleets", fleet.namespace, fleet.name, {"replicas": decision})
            fleet.spec = spec.model_copy(update={"replicas": decision})  # act now; the event confirms it
            fleet.poke()
        due = self.gate.due_in(now)
        if due is not None:
            self.wakeups.at(due + 0.01, "scale-down")
