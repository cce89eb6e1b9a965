"""Dropping the databases of a fleet's pods that are gone.

Each instance has its own database on one of the fleet's shards, made by the pod's init
container; nothing drops it when the pod goes (deleted, evicted, its node lost). This job of the
fleet's reconciler does, on every shard that answers: every ``db_sweep_interval`` seconds, and
soon after pods disappeared, but never right after start-up, while the pod cache may still be
filling (a pod not seen yet would lose its database). A sweep runs in a background task, one at a
time: a slow or unreachable database server must not hold up the pass that keeps the fleet's
pods and status.
"""

from __future__ import annotations

import asyncio
import logging
import time

from awm_operator import databases
from awm_operator.config import OperatorConfig
from awm_operator.fleet_shards import read_shards
from awm_operator.fleet_wakeups import WakeUps
from awm_operator.kube import Kube
from awm_operator.state import Fleet

log = logging.getLogger("awm.operator.reconcile")  # one of the fleet reconciler's jobs: its log


class DatabaseSweep:
    """When the fleet's databases were last swept, and the sweep in flight.

    ``started`` is when the operator started (monotonic): no sweep in its first 10 seconds."""

    def __init__(self, fleet: Fleet, kube: Kube, config: OperatorConfig, started: float, wakeups: WakeUps) -> None:
        self.fleet, self.kube, self.config, self.started, self.wakeups = fleet, kube, config, started, wakeups
        self.last = time.monotonic()
        self.task: asyncio.Task[None] | None = None  # a database sweep in flight

    def start_if_due(self, now: float) -> None:
        """Drop the databases of pods that are gone: every ``db_sweep_interval`` seconds, and
        soon after pods disappeared (never right after start-up, when the pod cache may still be
        filling). In a background task, one at a time."""
        fleet = self.fleet
        due = now - self.last >= self.config.db_sweep_interval
        recent = fleet.pods_gone_at > self.last and now - fleet.pods_gone_at >= 2.0
        if not (due or recent) or now - self.started < 10.0 or self.task is not None:
            if fleet.pods_gone_at > self.last:
                self.wakeups.at(2.1, "sweep")
            return
        self.last = now
        self.task = asyncio.create_task(self._sweep(), name=f"awm sweep {fleet.namespace}/{fleet.name}")

    async def _sweep(self) -> None:
        """On every shard that answers (a shard down now is swept when it is back)."""
        fleet = self.fleet
        dropped: list[str] = []
        try:
            shards = await read_shards(self.kube, fleet)
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
            self.task = None
        if dropped:
            log.info("fleet %s/%s: dropped %d databases of deleted pods", fleet.namespace, fleet.name, len(dropped))

    def cancel(self) -> None:
        """Stop a sweep in flight (the fleet's daemon ends)."""
        if self.task is not None:
            self.task.cancel()
