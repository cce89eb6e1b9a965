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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from awm_operator import conditions, databases
from awm_operator.allocator import Allocator
from awm_operator.autoscale import ScaleDownGate, desired_replicas
from awm_operator.config import OperatorConfig
from awm_operator.crds import (CatalogSource, Condition, EnvClaimStatus, EnvFleetStatus, EnvironmentSelector,
                               ShardStatus)
from awm_operator.kube import ApiError, Kube
from awm_operator.ledger import Ledger
from awm_operator.metrics import Metrics
from awm_operator.phases import ClaimPhase, ConditionType, FleetReason, ShardReason, ShardState
from awm_operator.catalog_index import REFRESH_S, RETRY_S, read_index
from awm_operator.databases import Shard
from awm_operator.podhttp import PodHttpError
from awm_operator.pods import PodInfo, pod_manifest, selector, spread
from awm_operator.state import Fleet

if TYPE_CHECKING:  # campaigns.py imports this module: a type only (import-linter skips these imports)
    from awm_operator.campaigns import Campaigns

log = logging.getLogger("awm.operator.reconcile")

ORPHAN_GRACE = 10.0  # seconds a claim must stay unknown before its pods are released
CONNECT_AHEAD_CONCURRENCY = 32  # connections to free pods opened at once, in the background
CONNECT_AHEAD_TIMEOUT_S = 5.0
CONNECT_AHEAD_BACKOFF_S = 10.0  # after a round where a pod refused or closed what it answered on
CONNECT_AHEAD_ROUNDS = 64  # rounds per task at most (each takes in the pods freed meanwhile)
RETRY_BASE_S, RETRY_MAX_S = 1.0, 30.0  # after a failed pass, the next one in 1, 2, 4 ... 30 s
_background: set[asyncio.Task[Any]] = set()


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
    fleet: Fleet
    ctx: Context
    gate: ScaleDownGate = field(default_factory=lambda: ScaleDownGate(30.0))
    last_status: dict[str, Any] = field(default_factory=dict)
    last_status_at: float = float("-inf")
    last_sweep: float = field(default_factory=time.monotonic)
    orphans: dict[str, float] = field(default_factory=dict)
    conditions: dict[str, Condition] = field(default_factory=dict)
    reported_lost: dict[str, tuple[str, ...]] = field(default_factory=dict)  # EnvClaim id -> lost pods
    index_read: tuple[str, float] = ("", 0.0)  # (selector and catalog, when) the index was last read
    index_error: str | None = None
    index_task: asyncio.Task[None] | None = None  # a catalog index read in flight
    sweep_task: asyncio.Task[None] | None = None  # a database sweep in flight
    shard_task: asyncio.Task[None] | None = None  # a probe of the fleet's shards in flight
    connect_task: asyncio.Task[None] | None = None  # connections to free pods being opened ahead
    connect_quiet_until: float = float("-inf")  # after a round a pod refused or did not keep: none till then
    shards_probed_at: float = float("-inf")
    shards_error: str | None = None    # the database Secret cannot be read, or names no shard
    placement_error: str | None = None  # pods wanted and no shard could take one (last pass)
    expiring: set[str] = field(default_factory=set)  # claims being released in the background
    timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)  # wake_at's, by reason

    def __post_init__(self) -> None:
        self.gate = ScaleDownGate(self.ctx.config.scale_down_delay)

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
                    self.wake_at(delay, "retry")
                    again = False
                if again:
                    fleet.poke()
        finally:
            halt.cancel()
            for task in (self.index_task, self.sweep_task, self.shard_task, self.connect_task):
                if task is not None:
                    task.cancel()
            for timer in self.timers.values():
                timer.cancel()
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
            await self.patch_status(force=False)
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

        environments = await self.environments(now)
        self.probe_shards(now)
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
        self.connect_ahead()
        starting = Counter(p.shard for p in live if not p.ready)
        # 2. count per environment (none while a selector's index was never read: pods stay as they are)
        by_env: dict[str, list[PodInfo]] = {}
        for p in live:
            by_env.setdefault(p.env, []).append(p)
        desired = spread(spec.replicas, environments, fleet.floors(environments, spec.replicas),
                         {env: len(ps) for env, ps in by_env.items()}) \
            if environments is not None else {p.env: 0 for p in live}
        more = False
        self.placement_error = None
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
                    shard = databases.choose_shard(fleet.shards.values(), starting)
                    if shard is None:  # no shard answers, or none has a free slot: say so, retry
                        self.placement_error = self.no_shard_message()
                        self.wake_at(self.ctx.config.shard_probe_interval, "placement")
                        break
                    starting[shard.name] += 1
                    job(lambda env=env, shard=shard: self.create(env, shard))
            elif len(have) > want:
                for p in self.victims(have, len(have) - want):
                    fleet.doom(p)  # now, so no claim picks it while the deletion is in flight
                    job(lambda p=p: self.delete(p, guarded=True))
        # 3. claims to end: TTL run out, or an EnvClaim deleted while no operator watched
        self.release_orphans(now)
        if jobs:
            await asyncio.gather(*jobs)
        await self.report_lost()
        # 5. autoscale, status, databases
        await self.autoscale(now)
        await self.patch_status(force=False)
        await self.sweep_databases(now)
        return more

    async def environments(self, now: float) -> list[str] | None:
        """The fleet's environments: its list, or what its selector last chose from the catalog's
        index; None while a selector's index was never read (no pod is created or deleted for it).
        The index is read in the background (re-read every few minutes and when the selector or
        the catalog changes), so a slow catalog server never stalls the fleet's reconcile pass."""
        fleet, spec = self.fleet, self.fleet.spec
        assert spec is not None
        selector = spec.environment_selector
        if selector is None:
            if self.index_task is not None:
                self.index_task.cancel()
            self.index_task, self.index_read, self.index_error, fleet.selected = None, ("", 0.0), None, None
            return spec.environments
        key = selector.model_dump_json() + spec.catalog.model_dump_json()  # not the generation: replicas change it
        last_key, at = self.index_read
        if key != last_key:
            # a new selector or catalog: the old choice (or error) is not its answer, nor is a read
            # still in flight for the old one
            fleet.selected, self.index_error = None, None
            if self.index_task is not None:
                self.index_task.cancel()
                self.index_task = None
        due = key != last_key or now - at >= (REFRESH_S if self.index_error is None else RETRY_S)
        if due and self.index_task is None:
            self.index_read = (key, now)
            self.index_task = asyncio.create_task(self.resolve_selector(key, selector, spec.catalog))
        return fleet.selected

    async def resolve_selector(self, key: str, selector: EnvironmentSelector, catalog: CatalogSource) -> None:
        """Resolve the selector against the catalog's index; the outcome lands on the fleet (a
        failed read keeps the last choice and is retried) and wakes its reconciler."""
        fleet = self.fleet
        loop = asyncio.get_running_loop()
        try:
            names = await read_index(self.ctx.kube, self.ctx.allocator.http, fleet.namespace, catalog)
            chosen = selector.select(names)
            if not chosen:
                raise ValueError(f"the selector matches none of the catalog's {len(names)} environments")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the fleet, retried
            if self.index_read[0] == key:
                self.index_error = f"catalog index: {exc}"
                log.warning("fleet %s/%s: %s", fleet.namespace, fleet.name, self.index_error)
                loop.call_later(RETRY_S + 0.01, fleet.poke)
        else:
            if self.index_read[0] == key:  # the selector did not change while we read
                if chosen != fleet.selected:
                    log.info("fleet %s/%s: the selector chose %d environments", fleet.namespace, fleet.name,
                             len(chosen))
                self.index_error, fleet.selected = None, chosen
                loop.call_later(REFRESH_S + 0.01, fleet.poke)
        finally:
            if self.index_task is asyncio.current_task():
                self.index_task = None
            fleet.poke()

    def connect_ahead(self) -> None:
        """In the background, open the operator's connection to every free ready pod that has
        none kept. A claim's first ``/bind`` (or a release's ``/reset``) to a pod would otherwise
        connect first, and a GRPO step's 1,024 connects cost the operator's event loop about as
        much again as the binds (docs/benchmarks.md): the first step of a fleet paid it. Once
        open, a connection is kept for the pod's next request (``podhttp.IDLE_SECONDS``); one that
        aged out unused is opened again on a later pass."""
        if (self.connect_task is None or self.connect_task.done()) and time.monotonic() >= self.connect_quiet_until:
            if self._to_connect():
                self.connect_task = asyncio.create_task(
                    self._connect_ahead(), name=f"awm connect {self.fleet.namespace}/{self.fleet.name}")

    def _to_connect(self) -> list[str]:
        """One URL per connection to open: free pods' addresses, less the connections kept idle
        there (an address shared by many pods, as a benchmark's stub is, takes one per pod)."""
        http, fleet = self.ctx.allocator.pods, self.fleet
        wanted: Counter[str] = Counter()
        for names in list(fleet.available.values()):
            for name in names:
                info = fleet.pods.get(name)
                if info is not None and info.control_url:
                    wanted[info.control_url.rstrip("/") + "/healthz"] += 1
        urls: list[str] = []
        for url, n in wanted.items():
            try:
                urls += [url] * (n - http.idle_count(url))
            except PodHttpError:  # a pod's annotation that is no URL: its claims will say so
                continue
        return urls

    async def _connect_ahead(self) -> None:
        http, sem = self.ctx.allocator.pods, asyncio.Semaphore(CONNECT_AHEAD_CONCURRENCY)

        async def one(url: str) -> bool:
            async with sem:
                try:
                    return await http.open(url, CONNECT_AHEAD_TIMEOUT_S)
                except PodHttpError:  # not answering yet, or gone: a later round tries again
                    return False

        for _ in range(CONNECT_AHEAD_ROUNDS):  # each round: the free pods without one, then those freed meanwhile
            urls = self._to_connect()
            if not urls:
                return
            if not all(await asyncio.gather(*(one(url) for url in urls))):
                # A pod refused, timed out or closed the connection it answered on: no round
                # again for a while, or such pods would cost a round every pass (0.2 s apart).
                self.connect_quiet_until = time.monotonic() + CONNECT_AHEAD_BACKOFF_S
                return

    def probe_shards(self, now: float) -> None:
        """Every ``shard_probe_interval`` seconds, in the background: read the fleet's database
        Secret (shards may be added or removed) and connect to every shard. A change of a shard's
        state (up, down, lost) wakes the fleet."""
        if self.shard_task is None and now - self.shards_probed_at >= self.ctx.config.shard_probe_interval:
            self.shards_probed_at = now
            self.shard_task = asyncio.create_task(self._probe_shards(),
                                                  name=f"awm shards {self.fleet.namespace}/{self.fleet.name}")
        self.wake_at(self.ctx.config.shard_probe_interval, "shards")

    async def _probe_shards(self) -> None:
        fleet, cfg, m = self.fleet, self.ctx.config, self.ctx.metrics
        changed = not fleet.shards
        try:
            before = set(fleet.shards)
            shards = await read_shards(self.ctx.kube, fleet)
            for name in before - set(shards):
                m.forget_shard(fleet.namespace, fleet.name, name)
            results = await asyncio.gather(*(asyncio.to_thread(databases.probe, s.dsn) for s in shards.values()),
                                           return_exceptions=True)
            placed = Counter(p.shard for p in fleet.pods.values() if not p.deleting)
            for shard, result in zip(shards.values(), results):
                was_lost = shard.lost
                if isinstance(result, BaseException) and not isinstance(result, Exception):
                    raise result
                if shard.observe(result, time.monotonic(), cfg.shard_lost_after):
                    changed = True
                    log.warning("fleet %s/%s: database shard %s is %s%s", fleet.namespace, fleet.name, shard.name,
                                "up" if shard.up else "lost" if shard.lost else "down",
                                f" ({shard.error})" if shard.error else "")
                if shard.lost and not was_lost:
                    m.shard_lost.labels(fleet.namespace, fleet.name, shard.name).inc()
                m.observe_shard(fleet.namespace, fleet.name, shard, placed.get(shard.name, 0))
            changed |= self.shards_error is not None
            self.shards_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the Secret is missing or names no shard: said in the status
            message = f"database secret: {exc}"
            changed |= message != self.shards_error
            self.shards_error = message
        finally:
            self.shard_task = None
        if changed:
            fleet.poke()

    def no_shard_message(self) -> str:
        shards = self.fleet.shards.values()
        if self.shards_error:
            return self.shards_error
        if not shards or all(s.up is None for s in shards):
            return "waiting for the first probe of the database shards"
        down = [f"{s.name}: {s.error or 'down'}" for s in shards if not s.up]
        if down and len(down) == len(self.fleet.shards):
            return "no database shard answers: " + "; ".join(down[:3])
        return "no database shard has a free connection slot for another instance"

    def shard_status(self) -> list[ShardStatus]:
        """``status.shards``: each shard's state and what this fleet has on it."""
        placed = Counter(p.shard for p in self.fleet.pods.values() if not p.deleting)
        return [ShardStatus(name=s.name, state=ShardState.UNKNOWN if s.up is None else ShardState.UP if s.up
                            else ShardState.LOST if s.lost else ShardState.DOWN, instances=placed.get(s.name, 0), message=s.error,
                            # (backends open change every probe: in the metrics, not in the status)
                            max_connections=s.max_connections if s.up else None)
                for s in self.fleet.shards.values()]

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

    def release_orphans(self, now: float) -> None:
        """Release claims whose TTL ran out, and EnvClaims' claims whose object is gone (deleted
        while no operator replica watched; after a grace period, as the claim watch may lag)."""
        fleet, ctx = self.fleet, self.ctx
        wall = time.time()
        next_expiry: float | None = None
        for claim, record in list(fleet.claims.items()):
            if claim in fleet.releasing or claim in self.expiring:
                continue
            if record.expires is not None:
                if record.expires <= wall:
                    log.info("fleet %s/%s: claim %s expired; releasing it", fleet.namespace, fleet.name, claim)
                    ctx.metrics.claims_expired.labels(fleet.namespace, fleet.name).inc()
                    self.release_later(claim, expired=not claim.startswith("api_"))
                    continue
                next_expiry = min(next_expiry or record.expires, record.expires)
            if claim.startswith("api_") or (fleet.namespace, claim) in ctx.known_claims:
                self.orphans.pop(claim, None)
                continue
            first = self.orphans.setdefault(claim, now)
            if now - first >= ORPHAN_GRACE and now - ctx.started >= ORPHAN_GRACE:
                del self.orphans[claim]
                log.info("fleet %s/%s: releasing instances of vanished claim %s", fleet.namespace, fleet.name, claim)
                self.release_later(claim)
        for claim in set(self.orphans) - set(fleet.claims):
            del self.orphans[claim]
        if self.orphans:
            self.wake_at(ORPHAN_GRACE / 2, "orphans")
        if next_expiry is not None:
            self.wake_at(max(0.0, next_expiry - wall) + 0.05, "expiry")

    def wake_at(self, delay: float, why: str) -> None:
        """Poke the fleet in ``delay`` seconds: one timer per reason, replaced by each pass (a
        timer per pass piled up thousands an hour on a busy fleet, each holding its callback)."""
        old = self.timers.pop(why, None)
        if old is not None:
            old.cancel()
        self.timers[why] = asyncio.get_running_loop().call_later(delay, self.fleet.poke)

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
                        await self.ctx.kube.patch_status("envclaims", fleet.namespace, claim.rsplit(".", 1)[0], status)
                    except ApiError as exc:
                        if exc.status != 404:
                            raise
                await self.ctx.allocator.release(fleet, claim)
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
                await self.ctx.kube.patch_status("envclaims", fleet.namespace, name, status)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("fleet %s/%s: cannot report lost instances on claim %s: %s",
                                fleet.namespace, fleet.name, name, exc)
                    continue
            self.reported_lost[claim] = lost
        for claim in set(self.reported_lost) - set(fleet.claims):
            del self.reported_lost[claim]

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
            self.wake_at(due + 0.01, "scale-down")

    def _condition(self, kind: str, ok: bool, reason: str, message: str) -> Condition:
        cond = conditions.condition(kind, ok, reason, message, generation=self.fleet.generation,
                                    previous=self.conditions.values())
        self.conditions[kind] = cond
        return cond

    async def patch_status(self, force: bool) -> None:
        fleet, m = self.fleet, self.ctx.metrics
        c = fleet.counts()
        for state, n in (("starting", c.starting), ("ready", c.ready), ("allocated", c.allocated)):
            m.instances.labels(fleet.namespace, fleet.name, state).set(n)
        m.demand.labels(fleet.namespace, fleet.name).set(fleet.demand())
        if fleet.spec is None:
            cond = self._condition(ConditionType.READY, False, FleetReason.INVALID_SPEC, fleet.spec_error or "no spec")
            status = EnvFleetStatus(conditions=[cond])
        else:
            want = fleet.spec.replicas
            m.desired.labels(fleet.namespace, fleet.name).set(want)
            ready = c.ready + c.allocated >= want and c.replicas == want
            message = f"{c.ready} ready, {c.allocated} allocated, {c.starting} starting of {want}"
            reason = FleetReason.ALL_READY if ready else FleetReason.RECONCILING
            stuck = sorted((p.name, p.problem) for p in fleet.pods.values() if p.problem and not p.deleting)
            if self.index_error is not None:
                ready, reason = False, FleetReason.CATALOG_INDEX_UNAVAILABLE
                message = f"{self.index_error}; " + message
            elif stuck and not ready:
                # say why, in the words of the first stuck pod: a misspelt environment, a missing
                # catalog image, an unreachable database are otherwise a silent "Reconciling"
                name, problem = stuck[0]
                container = problem.split(":", 1)[0]
                reason = {"bundle": FleetReason.BUNDLE_UNAVAILABLE,
                          "provision": FleetReason.PROVISION_FAILED}.get(container, FleetReason.PODS_FAILING)
                message += f"; {len(stuck)} stuck, e.g. {name}: {problem}"
            elif self.placement_error is not None and not ready:
                ready, reason = False, FleetReason.DATABASE_UNAVAILABLE
                message = f"{self.placement_error}; " + message
            cond = self._condition(ConditionType.READY, ready, reason, message)
            shards = self.shard_status()
            up = [s for s in shards if s.state == ShardState.UP]
            db_ok = bool(shards) and len(up) == len(shards)
            db_reason = ShardReason.ALL_SHARDS_UP if db_ok else ShardReason.SECRET_UNREADABLE if self.shards_error \
                else ShardReason.PROBING if not shards or all(s.state == ShardState.UNKNOWN for s in shards) \
                else ShardReason.SHARD_LOST if any(s.state == ShardState.LOST for s in shards) else ShardReason.SHARD_DOWN
            db_message = self.shards_error or f"{len(up)} of {len(shards)} shards up" + "".join(
                f"; {s.name}: {s.state.lower()} ({s.message})" for s in shards if s.state != ShardState.UP)
            db = self._condition(ConditionType.DATABASE_AVAILABLE, db_ok, db_reason, db_message[:1000])
            # environments: null when there is no selector (a merge patch removes what a removed
            # selector chose)
            status = EnvFleetStatus(replicas=c.replicas, ready=c.ready, allocated=c.allocated,
                                    selector=selector(fleet.name), conditions=[cond, db], shards=shards,
                                    observed_generation=fleet.generation, environments=fleet.selected)
        written = status.patch()
        comparable = _comparable(written, written)
        # Written already, and the object (as last watched) says so. The second half matters when
        # another replica wrote the status after us (two act at once for a while under kopf's
        # peering; a standby that took over): our own last write alone would leave its numbers
        # standing for good.
        if comparable == self.last_status and _comparable((fleet.body.get("status") or {}), written) == comparable:
            return
        now = time.monotonic()
        wait = self.last_status_at + self.ctx.config.status_min_interval - now
        if wait > 0 and not force:
            self.wake_at(wait + 0.01, "status")
            return
        try:
            await self.ctx.kube.patch_status("envfleets", fleet.namespace, fleet.name, status)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("fleet %s/%s: status: %s", fleet.namespace, fleet.name, exc)
            return
        self.last_status, self.last_status_at = comparable, now

    async def sweep_databases(self, now: float) -> None:
        """Drop the databases of pods that are gone: every ``db_sweep_interval`` seconds, and
        soon after pods disappeared (never right after start-up, when the pod cache may still be
        filling). In a background task, one at a time: a slow or unreachable database server
        must not hold up the pass that keeps the fleet's pods and status."""
        fleet, cfg = self.fleet, self.ctx.config
        due = now - self.last_sweep >= cfg.db_sweep_interval
        recent = fleet.pods_gone_at > self.last_sweep and now - fleet.pods_gone_at >= 2.0
        if not (due or recent) or now - self.ctx.started < 10.0 or self.sweep_task is not None:
            if fleet.pods_gone_at > self.last_sweep:
                self.wake_at(2.1, "sweep")
            return
        self.last_sweep = now
        self.sweep_task = asyncio.create_task(self._sweep(), name=f"awm sweep {fleet.namespace}/{fleet.name}")

    async def _sweep(self) -> None:
        """On every shard that answers (a shard down now is swept when it is back)."""
        fleet = self.fleet
        dropped: list[str] = []
        try:
            shards = await read_shards(self.ctx.kube, fleet)
            live = set(fleet.pods)
            for shard in shards.values():
                if shard.up is False:
                    continue
                try:
                    dropped += await asyncio.to_thread(databases.drop_orphans, shard.dsn, fleet.namespace,
                                                       fleet.name, live)
                except Exception as exc:  # the database being unreachable must not stop the fleet
                    log.warning("fleet %s/%s: database sweep of shard %s failed: %s", fleet.namespace, fleet.name,
                                shard.name, exc)
        except Exception as exc:
            log.warning("fleet %s/%s: database sweep failed: %s", fleet.namespace, fleet.name, exc)
        finally:
            self.sweep_task = None
        if dropped:
            log.info("fleet %s/%s: dropped %d databases of deleted pods", fleet.namespace, fleet.name, len(dropped))


def _comparable(observed: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``status`` as ``observed`` has them, its conditions by type, status and
    message (a transition time is not a change)."""
    conds = sorted((c.get("type"), c.get("status"), c.get("message")) for c in observed.get("conditions") or [])
    return {k: observed.get(k) for k in status if k != "conditions"} | {"conditions": conds}


async def read_shards(kube: Kube, fleet: Fleet) -> dict[str, Shard]:
    """The fleet's shards from its database Secret (keys ``dsn`` and ``dsn-<name>``), merged into
    ``fleet.shards``: a shard whose key and DSN are unchanged keeps what its probes found."""
    if fleet.spec is None:
        raise RuntimeError("fleet has no valid spec")
    name = fleet.spec.database.secret_name
    data = await kube.read_secret(fleet.namespace, name)
    keys = databases.shard_keys(data)
    if not keys:
        raise KeyError(f"secret {fleet.namespace}/{name} has no key `dsn` or `dsn-<shard>`")
    shards: dict[str, Shard] = {}
    for shard, key in keys.items():
        old = fleet.shards.get(shard)
        shards[shard] = old if old is not None and (old.key, old.dsn) == (key, data[key]) else \
            Shard(name=shard, key=key, dsn=data[key])
    fleet.shards = shards
    return shards
