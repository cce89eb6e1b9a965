"""Operator settings, from environment variables (the Helm chart sets them on the Deployment).

The variables, their types and defaults are declared in awm/settings.py (the section "The
operator"; docs/settings.md lists them): this dataclass's defaults are theirs. Everything has a
default that works for a local run (``awm operator run`` against a kubeconfig), so tests build an
``OperatorConfig`` directly and only override what they need.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping

from awm import settings

_env = settings.var  # the declarations (defaults included) of the variables read below


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=_env.AWM_NAMESPACES.default_value)  # empty: cluster-wide
    release: str = _env.AWM_RELEASE.default   # app.kubernetes.io/instance on env pods
    peering: str | None = _env.AWM_PEERING.default  # KopfPeering name; None: standalone
    priority: int = 0                         # kopf peering priority of this replica (from_env: random)
    metrics_port: int = _env.AWM_METRICS_PORT.default
    api_port: int = _env.AWM_API_PORT.default  # /healthz and the allocation API
    api_host: str = "0.0.0.0"
    # DNS-rebinding guard of the API (hostguard.py): extra Host names and browser Origins to accept.
    api_allowed_hosts: list[str] = field(default_factory=_env.AWM_API_ALLOWED_HOSTS.default_value)
    api_allowed_origins: list[str] = field(default_factory=_env.AWM_API_ALLOWED_ORIGINS.default_value)
    cluster_domains: list[str] = field(default_factory=_env.AWM_CLUSTER_DOMAINS.default_value)
    # Callers of /v1/ authenticated (TokenReview) and authorised (SubjectAccessReview): auth.py.
    api_auth: bool = _env.AWM_API_AUTH.default
    log_level: str = _env.AWM_LOG_LEVEL.default
    envserver_image: str = _env.AWM_ENVSERVER_IMAGE.default
    envserver_pull_policy: str = _env.AWM_ENVSERVER_IMAGE_PULL_POLICY.default
    envserver_runtime_class: str = _env.AWM_ENVSERVER_RUNTIME_CLASS.default  # "" = the cluster's default
    envserver_resources: dict[str, Any] = field(default_factory=_env.AWM_ENVSERVER_RESOURCES.default_value)
    catalog_image: str = _env.AWM_CATALOG_IMAGE.default
    catalog_path: str = _env.AWM_CATALOG_PATH.default
    catalog_pull_policy: str = _env.AWM_CATALOG_IMAGE_PULL_POLICY.default
    image_pull_secrets: list[dict[str, str]] = field(default_factory=_env.AWM_IMAGE_PULL_SECRETS.default_value)
    # Tests and benchmarks only: let a fleet's pod template set awm.dev/control-url and mcp-url (env
    # servers outside the cluster). Off, anyone who may create an EnvFleet could make the operator
    # POST resets to, and hand trainers, any URL.
    endpoint_annotations: bool = _env.AWM_ENDPOINT_ANNOTATIONS.default
    # Tuning: how hard the operator may push the API server, and how fast it reacts.
    create_concurrency: int = 64              # pod creations / deletions in flight per fleet
    reconcile_min_interval: float = 0.2       # coalesces bursts of pod events into one pass
    resync_interval: float = _env.AWM_RESYNC_INTERVAL.default  # a full pass even when nothing happened
    status_min_interval: float = 0.5          # EnvFleet status patches at most this often
    scale_down_delay: float = _env.AWM_SCALE_DOWN_DELAY.default  # autoscaler: demand must stay lower this long
    db_sweep_interval: float = _env.AWM_DB_SWEEP_INTERVAL.default  # dropping databases of pods that are gone
    shard_probe_interval: float = _env.AWM_SHARD_PROBE_INTERVAL.default  # connecting to each Postgres shard
    shard_lost_after: float = _env.AWM_SHARD_LOST_AFTER.default  # then its pods are replaced elsewhere
    reset_timeout: float = _env.AWM_RESET_TIMEOUT.default  # control-API reset on release
    claim_wait_default: float = 30.0          # allocation API: wait for capacity this long
    claim_ttl_default: float = _env.AWM_CLAIM_TTL_DEFAULT.default  # claims not renewed are released then
    claim_ttl_max: float = _env.AWM_CLAIM_TTL_MAX.default
    ledger_shard_bytes: int = _env.AWM_LEDGER_SHARD_BYTES.default  # a ledger ConfigMap takes claims until this

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorConfig":
        e = env  # None: os.environ, read now
        cfg = cls()
        cfg.namespaces = _env.AWM_NAMESPACES.get(e)
        cfg.release = _env.AWM_RELEASE.get(e)
        cfg.peering = _env.AWM_PEERING.get(e)
        # Replicas must differ: kopf pauses every operator that sees a live peer of equal priority.
        # Unset, each process draws its own (the chart's Deployment cannot number its pods).
        priority = _env.AWM_PRIORITY.get(e)
        cfg.priority = priority if priority is not None else secrets.randbelow(2**31 - 2) + 1
        cfg.metrics_port = _env.AWM_METRICS_PORT.get(e)
        health_port = _env.AWM_HEALTH_PORT.get(e)  # wins over AWM_API_PORT
        cfg.api_port = health_port if health_port is not None else _env.AWM_API_PORT.get(e)
        cfg.log_level = _env.AWM_LOG_LEVEL.get(e)
        cfg.api_allowed_hosts = _env.AWM_API_ALLOWED_HOSTS.get(e)
        cfg.api_allowed_origins = _env.AWM_API_ALLOWED_ORIGINS.get(e)
        cfg.cluster_domains = _env.AWM_CLUSTER_DOMAINS.get(e) or cfg.cluster_domains
        cfg.api_auth = _env.AWM_API_AUTH.get(e)
        cfg.envserver_image = _env.AWM_ENVSERVER_IMAGE.get(e)
        cfg.envserver_pull_policy = _env.AWM_ENVSERVER_IMAGE_PULL_POLICY.get(e)
        cfg.envserver_resources = _env.AWM_ENVSERVER_RESOURCES.get(e)
        cfg.envserver_runtime_class = _env.AWM_ENVSERVER_RUNTIME_CLASS.get(e)
        cfg.catalog_image = _env.AWM_CATALOG_IMAGE.get(e)
        cfg.catalog_path = _env.AWM_CATALOG_PATH.get(e)
        cfg.catalog_pull_policy = _env.AWM_CATALOG_IMAGE_PULL_POLICY.get(e)
        cfg.image_pull_secrets = _env.AWM_IMAGE_PULL_SECRETS.get(e)
        cfg.endpoint_annotations = _env.AWM_ENDPOINT_ANNOTATIONS.get(e)
        cfg.scale_down_delay = _env.AWM_SCALE_DOWN_DELAY.get(e)
        cfg.resync_interval = _env.AWM_RESYNC_INTERVAL.get(e)
        cfg.reset_timeout = _env.AWM_RESET_TIMEOUT.get(e)
        cfg.db_sweep_interval = _env.AWM_DB_SWEEP_INTERVAL.get(e)
        cfg.shard_probe_interval = _env.AWM_SHARD_PROBE_INTERVAL.get(e)
        cfg.shard_lost_after = _env.AWM_SHARD_LOST_AFTER.get(e)
        cfg.claim_ttl_default = _env.AWM_CLAIM_TTL_DEFAULT.get(e)
        cfg.claim_ttl_max = _env.AWM_CLAIM_TTL_MAX.get(e)
        cfg.ledger_shard_bytes = _env.AWM_LEDGER_SHARD_BYTES.get(e)
        return cfg
