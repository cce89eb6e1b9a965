"""Operator settings, from environment variables (the Helm chart sets them on the Deployment).

Everything has a default that works for a local run (``awm operator run`` against a kubeconfig),
so tests build an ``OperatorConfig`` directly and only override what they need.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from awm_operator.shards import SHARD_BYTES


def _list(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def _json(value: str | None, default: Any) -> Any:
    return json.loads(value) if value else default


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)  # empty: every namespace (cluster-wide)
    release: str = "awm"                      # app.kubernetes.io/instance on env pods
    peering: str | None = None                # KopfPeering name; None: standalone
    priority: int = 0                         # kopf peering priority of this replica
    metrics_port: int = 9090
    api_port: int = 8080                      # /healthz and the allocation API
    api_host: str = "0.0.0.0"
    # DNS-rebinding guard of the API (hostguard.py): extra Host names and browser Origins to accept.
    api_allowed_hosts: list[str] = field(default_factory=list)
    api_allowed_origins: list[str] = field(default_factory=list)
    cluster_domains: list[str] = field(default_factory=lambda: ["cluster.local"])
    # Callers of /v1/ authenticated (TokenReview) and authorised (SubjectAccessReview): auth.py.
    api_auth: bool = True
    log_level: str = "info"
    envserver_image: str = "awm-envserver:0.1.0"
    envserver_pull_policy: str = "IfNotPresent"
    envserver_runtime_class: str = ""  # RuntimeClass of env pods (gVisor, Kata); "" = the cluster's default
    envserver_resources: dict[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}})
    catalog_image: str = "awm-catalog:0.1.0"
    catalog_path: str = "/catalog"
    catalog_pull_policy: str = "IfNotPresent"
    image_pull_secrets: list[dict[str, str]] = field(default_factory=list)
    # Tests and benchmarks only: let a fleet's pod template set awm.dev/control-url and mcp-url (env
    # servers outside the cluster). Off, anyone who may create an EnvFleet could make the operator
    # POST resets to, and hand trainers, any URL.
    endpoint_annotations: bool = False
    # Tuning: how hard the operator may push the API server, and how fast it reacts.
    create_concurrency: int = 64              # pod creations / deletions in flight per fleet
    reconcile_min_interval: float = 0.2       # coalesces bursts of pod events into one pass
    resync_interval: float = 30.0             # a full pass even when nothing happened
    status_min_interval: float = 0.5          # EnvFleet status patches at most this often
    scale_down_delay: float = 30.0            # autoscaler: demand must stay lower this long
    db_sweep_interval: float = 60.0           # dropping databases of pods that are gone
    shard_probe_interval: float = 5.0         # connecting to each Postgres shard of a fleet
    shard_lost_after: float = 60.0            # a shard down this long is lost: its pods are replaced elsewhere
    reset_timeout: float = 30.0               # control-API reset on release
    claim_wait_default: float = 30.0          # allocation API: wait for capacity this long
    claim_ttl_default: float = 3600.0         # allocation API: claims not renewed are released then
    claim_ttl_max: float = 7 * 86400.0
    ledger_shard_bytes: int = SHARD_BYTES     # a ledger ConfigMap takes new claims until it holds this

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorConfig":
        e = os.environ if env is None else env
        cfg = cls()
        cfg.namespaces = [n.strip() for n in e.get("AWM_NAMESPACES", "").split(",") if n.strip()]
        cfg.release = e.get("AWM_RELEASE", cfg.release)
        cfg.peering = e.get("AWM_PEERING") or None
        # Replicas must differ: kopf pauses every operator that sees a live peer of equal priority.
        # Unset, each process draws its own (the chart's Deployment cannot number its pods).
        cfg.priority = int(e["AWM_PRIORITY"]) if e.get("AWM_PRIORITY") else secrets.randbelow(2**31 - 2) + 1
        cfg.metrics_port = int(e.get("AWM_METRICS_PORT", cfg.metrics_port))
        cfg.api_port = int(e.get("AWM_HEALTH_PORT", e.get("AWM_API_PORT", cfg.api_port)))
        cfg.log_level = e.get("AWM_LOG_LEVEL", cfg.log_level)
        cfg.api_allowed_hosts = _list(e.get("AWM_API_ALLOWED_HOSTS"))
        cfg.api_allowed_origins = _list(e.get("AWM_API_ALLOWED_ORIGINS"))
        cfg.cluster_domains = _list(e.get("AWM_CLUSTER_DOMAINS")) or cfg.cluster_domains
        cfg.api_auth = e.get("AWM_API_AUTH", "on").lower() not in ("off", "0", "false", "no")
        cfg.envserver_image = e.get("AWM_ENVSERVER_IMAGE", cfg.envserver_image)
        cfg.envserver_pull_policy = e.get("AWM_ENVSERVER_IMAGE_PULL_POLICY", cfg.envserver_pull_policy)
        cfg.envserver_resources = _json(e.get("AWM_ENVSERVER_RESOURCES"), cfg.envserver_resources)
        cfg.envserver_runtime_class = e.get("AWM_ENVSERVER_RUNTIME_CLASS", cfg.envserver_runtime_class)
        cfg.catalog_image = e.get("AWM_CATALOG_IMAGE", cfg.catalog_image)
        cfg.catalog_path = e.get("AWM_CATALOG_PATH", cfg.catalog_path)
        cfg.catalog_pull_policy = e.get("AWM_CATALOG_IMAGE_PULL_POLICY", cfg.catalog_pull_policy)
        cfg.image_pull_secrets = _json(e.get("AWM_IMAGE_PULL_SECRETS"), cfg.image_pull_secrets)
        cfg.endpoint_annotations = e.get("AWM_ENDPOINT_ANNOTATIONS", "").lower() in ("1", "true", "yes")
        for name in ("scale_down_delay", "resync_interval", "reset_timeout", "db_sweep_interval",
                     "shard_probe_interval", "shard_lost_after",
                     "claim_ttl_default", "claim_ttl_max"):
            key = f"AWM_{name.upper()}"
            if key in e:
                setattr(cfg, name, float(e[key]))
        cfg.ledger_shard_bytes = int(e.get("AWM_LEDGER_SHARD_BYTES", cfg.ledger_shard_bytes))
        return cfg
