"""A fleet's Postgres shards as its reconciler sees them: probed, chosen for new pods, reported.

Every instance of a fleet has a database on one of the fleet's shards (the Postgres servers its
database Secret names). This job of the reconciler probes them in the background every
``shard_probe_interval`` seconds (the Secret is read again, so shards may be added or removed),
and a change of a shard's state (up, down, lost) wakes the fleet. New pods go to the shard with
the most free connection slots (:meth:`FleetShards.place`), none while no shard answers; the
pods of a shard that stayed down for ``shard_lost_after`` seconds are replaced on the others (by
the reconcile pass). What it found is the fleet status's ``shards`` and its DatabaseAvailable
condition (fleet_status.py reads it here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from awm_operator import databases
from awm_operator.config import OperatorConfig
from awm_operator.crds import ShardStatus
from awm_operator.databases import Shard
from awm_operator.fleet_wakeups import WakeUps
from awm_operator.kube import Kube
from awm_operator.metrics import Metrics
from awm_operator.phases import ShardState
from awm_operator.state import Fleet

log = logging.getLogger("awm.operator.reconcile")  # one of the fleet reconciler's jobs: its log


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


class FleetShards:
    """The probes of the fleet's shards (``fleet.shards``), and where its new pods can go."""

    def __init__(self, fleet: Fleet, kube: Kube, metrics: Metrics, config: OperatorConfig, wakeups: WakeUps) -> None:
        self.fleet, self.kube, self.metrics, self.config, self.wakeups = fleet, kube, metrics, config, wakeups
        self.task: asyncio.Task[None] | None = None  # a probe of the fleet's shards in flight
        self.probed_at = float("-inf")
        self.secret_error: str | None = None  # the database Secret cannot be read, or names no shard
        self.placement_error: str | None = None  # pods wanted and no shard could take one (last pass)

    def probe(self, now: float) -> None:
        """Every ``shard_probe_interval`` seconds, in the background: read the fleet's database
        Secret (shards may be added or removed) and connect to every shard. A change of a shard's
        state (up, down, lost) wakes the fleet."""
        if self.task is None and now - self.probed_at >= self.config.shard_probe_interval:
            self.probed_at = now
            self.task = asyncio.create_task(self._probe(), name=f"awm shards {self.fleet.namespace}/{self.fleet.name}")
        self.wakeups.at(self.config.shard_probe_interval, "shards")

    async def _probe(self) -> None:
        fleet, cfg, m = self.fleet, self.config, self.metrics
        changed = not fleet.shards
        try:
            before = set(fleet.shards)
            shards = await read_shards(self.kube, fleet)
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
            changed |= self.secret_error is not None
            self.secret_error = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the Secret is missing or names no shard: said in the status
            message = f"database secret: {exc}"
            changed |= message != self.secret_error
            self.secret_error = message
        finally:
            self.task = None
        if changed:
            fleet.poke()

    def place(self, starting: Counter[str]) -> Shard | None:
        """The shard for a new pod (counted in ``starting``, the pods per shard not ready yet);
        None when no shard answers or has a free slot: why is kept for the status
        (``placement_error``) and the fleet is woken to try again after the next probe."""
        shard = databases.choose_shard(self.fleet.shards.values(), starting)
        if shard is None:
            self.placement_error = self.no_shard_message()
            self.wakeups.at(self.config.shard_probe_interval, "placement")
            return None
        starting[shard.name] += 1
        return shard

    def no_shard_message(self) -> str:
        shards = self.fleet.shards.values()
        if self.secret_error:
            return self.secret_error
        if not shards or all(s.up is None for s in shards):
            return "waiting for the first probe of the database shards"
        down = [f"{s.name}: {s.error or 'down'}" for s in shards if not s.up]
        if down and len(down) == len(self.fleet.shards):
            return "no database shard answers: " + "; ".join(down[:3])
        return "no database shard has a free connection slot for another instance"

    def status(self) -> list[ShardStatus]:
        """``status.shards``: each shard's state and what this fleet has on it."""
        placed = Counter(p.shard for p in self.fleet.pods.values() if not p.deleting)
        return [ShardStatus(name=s.name, state=ShardState.UNKNOWN if s.up is None else ShardState.UP if s.up
                            else ShardState.LOST if s.lost else ShardState.DOWN, instances=placed.get(s.name, 0), message=s.error,
                            # (backends open change every probe: in the metrics, not in the status)
                            max_connections=s.max_connections if s.up else None)
                for s in self.fleet.shards.values()]

    def cancel(self) -> None:
        """Stop a probe in flight (the fleet's daemon ends)."""
        if self.task is not None:
            self.task.cancel()
