"""Prometheus metrics of the operator (served on :9090/metrics).

A private registry, so several operators in one test process do not collide and the default
process collectors do not get mixed into fleet dashboards by accident.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from awm_operator.phases import CampaignPhase

CAMPAIGN_PHASES = tuple(CampaignPhase)
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
        self.prepares = Counter("awm_prepares_total", "binding: late - environments made ready on pods ahead "
                                "of their claims, by outcome (prepared, cached: it had it already, failed).", ["namespace", "fleet", "outcome"],
                                registry=r)
        self.switches = Counter("awm_claim_switches_total",
                                "binding: late - pods bound to a claim's environment, by what it cost them: serving "
                                "(no switch), cached (a reset of a kept environment), new (a new database).",
                                ["namespace", "fleet", "kind"], registry=r)
        self.switch_latency = Histogram("awm_claim_switch_seconds",
                                        "binding: late - switching a claim's pods to its environment (all at once).",
                                        ["namespace", "fleet"], buckets=LATENCY_BUCKETS, registry=r)
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
        self.ledger_bytes = Gauge("awm_ledger_bytes",
                                  "Bytes of claims in a fleet's ledger (a ConfigMap holds at most 1 MiB; the "
                                  "ledger spreads over several).", ["namespace", "fleet"], registry=r)
        self.ledger_shards = Gauge("awm_ledger_shards", "ConfigMaps a fleet's ledger is spread over.",
                                   ["namespace", "fleet"], registry=r)
        self.shard_up = Gauge("awm_db_shard_up", "1 if a fleet's Postgres shard answered its last probe.",
                              ["namespace", "fleet", "shard"], registry=r)
        self.shard_connections = Gauge("awm_db_shard_connections", "Client backends open on a shard (all fleets).",
                                       ["namespace", "fleet", "shard"], registry=r)
        self.shard_max_connections = Gauge("awm_db_shard_max_connections",
                                           "max_connections of a shard, less its superuser-reserved slots.",
                                           ["namespace", "fleet", "shard"], registry=r)
        self.shard_instances = Gauge("awm_db_shard_instances", "Pods of a fleet placed on a shard.",
                                     ["namespace", "fleet", "shard"], registry=r)
        self.shard_lost = Counter("awm_db_shard_lost_total",
                                  "Times a shard stayed down long enough for its pods to be replaced.",
                                  ["namespace", "fleet", "shard"], registry=r)
        self.claims_expired = Counter("awm_claims_expired_total", "Claims released because their TTL ran out.",
                                      ["namespace", "fleet"], registry=r)

        self.campaign_phase = Gauge("awm_campaign_phase", "1 for a campaign's current phase.",
                                    ["namespace", "campaign", "phase"], registry=r)
        self.campaign_step = Gauge("awm_campaign_step", "Last training step (or evaluated tasks) reported.",
                                   ["namespace", "campaign"], registry=r)
        self.campaign_reward = Gauge("awm_campaign_reward_mean", "Mean reward last reported by a campaign.",
                                     ["namespace", "campaign"], registry=r)
        self.campaign_rollouts = Gauge("awm_campaign_rollouts_per_second", "Rollouts/s last reported by a campaign.",
                                       ["namespace", "campaign"], registry=r)
        self.campaign_pass_rate = Gauge("awm_campaign_pass_rate", "Pass rate per environment of an evaluation.",
                                        ["namespace", "campaign", "env"], registry=r)
        self.campaign_pass_at_k = Gauge("awm_campaign_pass_at_k", "pass@k per environment of an evaluation.",
                                        ["namespace", "campaign", "env"], registry=r)

    def observe_campaign(self, namespace: str, campaign: str, status: dict[str, Any]) -> None:
        """Mirror a campaign's status (as last written) into gauges."""
        for phase in CAMPAIGN_PHASES:
            self.campaign_phase.labels(namespace, campaign, phase).set(1 if status.get("phase") == phase else 0)
        for gauge, key in ((self.campaign_step, "step"), (self.campaign_reward, "rewardMean"),
                           (self.campaign_rollouts, "rolloutsPerS")):
            if isinstance(status.get(key), (int, float)):
                gauge.labels(namespace, campaign).set(status[key])
        for env, rate in (status.get("passRates") or {}).items():
            self.campaign_pass_rate.labels(namespace, campaign, env).set(rate)
        for env, rate in (status.get("passAtK") or {}).items():
            self.campaign_pass_at_k.labels(namespace, campaign, env).set(rate)

    def forget_campaign(self, namespace: str, campaign: str) -> None:
        for gauge in (self.campaign_phase, self.campaign_step, self.campaign_reward, self.campaign_rollouts,
                      self.campaign_pass_rate, self.campaign_pass_at_k):
            for labels in [k for k in gauge._metrics if k[:2] == (namespace, campaign)]:  # noqa: SLF001
                gauge.remove(*labels)

    def observe_shard(self, namespace: str, fleet: str, shard: Any, instances: int) -> None:
        """A shard's last probe (``databases.Shard``) and the fleet's pods on it."""
        labels = (namespace, fleet, shard.name)
        self.shard_up.labels(*labels).set(1 if shard.up else 0)
        self.shard_instances.labels(*labels).set(instances)
        if shard.up:
            self.shard_connections.labels(*labels).set(shard.connections)
            self.shard_max_connections.labels(*labels).set(shard.max_connections)

    def _shard_metrics(self) -> tuple:
        """Every series labelled by (namespace, fleet, shard): one list, so forgetting a shard and
        forgetting a fleet remove the same ones."""
        return (self.shard_up, self.shard_connections, self.shard_max_connections, self.shard_instances,
                self.shard_lost)

    def forget_shard(self, namespace: str, fleet: str, shard: str) -> None:
        for metric in self._shard_metrics():
            try:
                metric.remove(namespace, fleet, shard)
            except KeyError:
                pass

    def forget_fleet(self, namespace: str, fleet: str) -> None:
        for state in ("starting", "ready", "allocated"):
            try:
                self.instances.remove(namespace, fleet, state)
            except KeyError:
                pass
        for gauge in (self.desired, self.demand, self.ledger_bytes, self.ledger_shards):
            try:
                gauge.remove(namespace, fleet)
            except KeyError:
                pass
        for metric in self._shard_metrics():
            for labels in [k for k in metric._metrics if k[:2] == (namespace, fleet)]:  # noqa: SLF001
                metric.remove(*labels)
