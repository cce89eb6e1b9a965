"""Writing an EnvFleet's status: its counts, its Ready and DatabaseAvailable conditions, its shards.

Every reconcile pass computes the status the fleet should show, from the fleet's pods and from
what the reconciler's other jobs found: the selector's index read (fleet_selection.py) and the
shard probes and placement (fleet_shards.py), which this writer is handed. It writes only what
changed, at most once every ``status_min_interval`` seconds (a busy fleet makes several passes a
second; each write is an API request and a watch event for every replica), and writes again
when the object shows another replica's numbers rather than its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from awm_operator import conditions
from awm_operator.config import OperatorConfig
from awm_operator.crds import Condition, EnvFleetStatus
from awm_operator.fleet_selection import EnvironmentSelection
from awm_operator.fleet_shards import FleetShards
from awm_operator.fleet_wakeups import WakeUps
from awm_operator.kube import ApiError, Kube
from awm_operator.metrics import Metrics
from awm_operator.phases import ConditionType, FleetReason, ShardReason, ShardState
from awm_operator.pods import selector
from awm_operator.state import Fleet

log = logging.getLogger("awm.operator.reconcile")  # one of the fleet reconciler's jobs: its log


class StatusWriter:
    """The fleet's status as last written, and the conditions' transition times."""

    def __init__(self, fleet: Fleet, kube: Kube, metrics: Metrics, config: OperatorConfig,
                 selection: EnvironmentSelection, shards: FleetShards, wakeups: WakeUps) -> None:
        self.fleet, self.kube, self.metrics, self.config, self.wakeups = fleet, kube, metrics, config, wakeups
        self.selection, self.shards = selection, shards  # read: the index's error; the shards and placement
        self.last: dict[str, Any] = {}  # the last status written (as _comparable has it)
        self.last_at = float("-inf")
        self.conditions: dict[str, Condition] = {}

    def _condition(self, kind: str, ok: bool, reason: str, message: str) -> Condition:
        cond = conditions.condition(kind, ok, reason, message, generation=self.fleet.generation,
                                    previous=self.conditions.values())
        self.conditions[kind] = cond
        return cond

    async def write(self, force: bool) -> None:
        """Patch the status if it changed (``force``: even within ``status_min_interval`` of the
        last write); the fleet's gauges are set on every call."""
        fleet, m = self.fleet, self.metrics
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
            if self.selection.error is not None:
                ready, reason = False, FleetReason.CATALOG_INDEX_UNAVAILABLE
                message = f"{self.selection.error}; " + message
            elif stuck and not ready:
                # say why, in the words of the first stuck pod: a misspelt environment, a missing
                # catalog image, an unreachable database are otherwise a silent "Reconciling"
                name, problem = stuck[0]
                container = problem.split(":", 1)[0]
                reason = {"bundle": FleetReason.BUNDLE_UNAVAILABLE,
                          "provision": FleetReason.PROVISION_FAILED}.get(container, FleetReason.PODS_FAILING)
                message += f"; {len(stuck)} stuck, e.g. {name}: {problem}"
            elif self.shards.placement_error is not None and not ready:
                ready, reason = False, FleetReason.DATABASE_UNAVAILABLE
                message = f"{self.shards.placement_error}; " + message
            cond = self._condition(ConditionType.READY, ready, reason, message)
            shards = self.shards.status()
            secret_error = self.shards.secret_error
            up = [s for s in shards if s.state == ShardState.UP]
            db_ok = bool(shards) and len(up) == len(shards)
            db_reason = ShardReason.ALL_SHARDS_UP if db_ok else ShardReason.SECRET_UNREADABLE if secret_error \
                else ShardReason.PROBING if not shards or all(s.state == ShardState.UNKNOWN for s in shards) \
                else ShardReason.SHARD_LOST if any(s.state == ShardState.LOST for s in shards) else ShardReason.SHARD_DOWN
            db_message = secret_error or f"{len(up)} of {len(shards)} shards up" + "".join(
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
        if comparable == self.last and _comparable((fleet.body.get("status") or {}), written) == comparable:
            return
        now = time.monotonic()
        wait = self.last_at + self.config.status_min_interval - now
        if wait > 0 and not force:
            self.wakeups.at(wait + 0.01, "status")
            return
        try:
            await self.kube.patch_status("envfleets", fleet.namespace, fleet.name, status)
        except ApiError as exc:
            if exc.status != 404:
                log.warning("fleet %s/%s: status: %s", fleet.namespace, fleet.name, exc)
            return
        self.last, self.last_at = comparable, now


def _comparable(observed: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``status`` as ``observed`` has them, its conditions by type, status and
    message (a transition time is not a change)."""
    conds = sorted((c.get("type"), c.get("status"), c.get("message")) for c in observed.get("conditions") or [])
    return {k: observed.get(k) for k in status if k != "conditions"} | {"conditions": conds}
