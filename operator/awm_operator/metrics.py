"""Prometheus metrics of the operator (served on :9090/metrics).

A private registry, so several operators in one test process do not collide and the default
process collectors do not get mixed into fleet dashboards by accident.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.instances = Gauge("awm_fleet_instances", "Env instances of a fleet by state.",
                               ["namespace", "fleet", "state"], registry=r)
        self.desired = Gauge("awm_fleet_desired_instances", "spec.replicas of a fleet.",
                             ["namespace", "fleet"], registry=r)
        self.demand = Gauge("awm_fleet_pending_demand", "Instances that waiting claims ask for.",
                            ["namespace", "fleet"], registry=r)
        self.claims = Counter("awm_claims_total", "Claims by result (bound, pending, failed, timeout).",
                              ["namespace", "fleet", "source", "result"], registry=r)
        self.claim_latency = Histogram("awm_claim_latency_seconds",
                                       "From the operator receiving a claim to its instances bound.",
                                       ["source"], buckets=LATENCY_BUCKETS, registry=r)
        self.releases = Counter("awm_instances_released_total",
                                "Released instances: returned to the pool after a reset, or replaced.",
                                ["namespace", "fleet", "result"], registry=r)
        self.reconcile = Histogram("awm_reconcile_seconds", "Duration of one fleet reconcile pass.",
                                   buckets=LATENCY_BUCKETS, registry=r)
        self.pod_operations = Counter("awm_pod_operations_total", "Pods created or deleted.",
                                      ["namespace", "fleet", "operation"], registry=r)
        self.ledger_writes = Counter("awm_ledger_writes_total",
                                     "Writes of fleets' allocation ledgers by result (ok, conflict, error).",
                                     ["namespace", "fleet", "result"], registry=r)
        self.ledger_batch = Histogram("awm_ledger_batch_claims",
                                      "Claim changes (binds, releases, renewals) carried by one ledger write.",
                                      buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.claims_expired = Counter("awm_claims_expired_total", "Claims released because their TTL ran out.",
                                      ["namespace", "fleet"], registry=r)

    def forget_fleet(self, namespace: str, fleet: str) -> None:
        for state in ("starting", "ready", "allocated"):
            try:
                self.instances.remove(namespace, fleet, state)
            except KeyError:
                pass
        for gauge in (self.desired, self.demand):
            try:
                gauge.remove(namespace, fleet)
            except KeyError:
                pass
