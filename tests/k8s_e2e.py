"""What the end-to-end tests on the real control plane share: polling, a namespace with the
database Secret, the CRDs, and an in-process operator's configuration and URLs."""

from __future__ import annotations

import json
import os
import time
import urllib.error
from pathlib import Path
from typing import Any, Callable

import httpx

from awm_operator.config import OperatorConfig
from awm_operator.main import InThread

CRDS = Path(__file__).resolve().parent.parent / "charts" / "awm" / "crds"
API = "/apis/awm.dev/v1alpha1"


def wait_for(what: str, ok: Callable[[], Any], timeout: float = 90.0, interval: float = 0.2) -> Any:
    """Poll ``ok`` until it returns something truthy (an API 404 or a missing key counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = ok()
        except (urllib.error.HTTPError, KeyError, IndexError):
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def apply_crds(cp: Any) -> None:
    r = cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRDS), check=False)
    assert r.returncode == 0, r.stderr
    cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/envfleets.awm.dev",
               "crd/envclaims.awm.dev", "crd/campaigns.awm.dev")


CLIENTS_NS = "awm-test-clients"  # where the tests' trainer identity lives (one for every namespace)


def setup_namespace(cp: Any, namespace: str, admin_dsn: str) -> None:
    """A namespace with the fleets' database Secret (``awm-db``, key ``dsn``), where the tests'
    trainer identity (ServiceAccount ``trainer`` of ``awm-test-clients``) may claim instances and
    report progress (a Role and RoleBinding); its token is what the tests' clients send
    (``AWM_API_TOKEN``, as a trainer outside the cluster would)."""
    cp.kubectl("create", "namespace", namespace)
    cp.kubectl("-n", namespace, "create", "secret", "generic", "awm-db", f"--from-literal=dsn={admin_dsn}")
    wait_for("the namespace's default ServiceAccount",
             lambda: cp.api("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"))
    os.environ["AWM_API_TOKEN"] = client_token(cp)
    grant_claims(cp, namespace, CLIENTS_NS, "trainer")


def client_token(cp: Any, name: str = "trainer") -> str:
    """A token of ServiceAccount ``awm-test-clients/<name>`` (made on first use), from the
    TokenRequest API."""
    try:
        cp.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLIENTS_NS}})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
    try:
        cp.api("POST", f"/api/v1/namespaces/{CLIENTS_NS}/serviceaccounts",
               {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    except urllib.error.HTTPError as exc:
        if exc.code != 409:
            raise
    answer = wait_for(f"a token for {CLIENTS_NS}/{name}", lambda: cp.api(
        "POST", f"/api/v1/namespaces/{CLIENTS_NS}/serviceaccounts/{name}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}))
    return answer["status"]["token"]


def grant_claims(cp: Any, namespace: str, sa_namespace: str, sa: str) -> None:
    """RBAC: ServiceAccount ``sa_namespace/sa`` may claim instances and report progress in ``namespace``."""
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    name = f"claims-{sa_namespace}-{sa}"
    cp.api("POST", f"{rbac}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
        "rules": [{"apiGroups": ["awm.dev"], "resources": ["envclaims"], "verbs": ["create", "get", "update", "delete"]},
                  {"apiGroups": ["awm.dev"], "resources": ["campaigns/status"], "verbs": ["update"]}]})
    cp.api("POST", f"{rbac}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_namespace}]})


def operator_config(namespace: str, **overrides: Any) -> OperatorConfig:
    """Fast timings for tests; ports 0 (the operator reports the ones it bound)."""
    settings: dict[str, Any] = dict(namespaces=[namespace], api_host="127.0.0.1", api_port=0, metrics_port=0,
                                    scale_down_delay=1.0, resync_interval=5.0, db_sweep_interval=3.0,
                                    reset_timeout=5.0, claim_wait_default=10.0,
                                    shard_probe_interval=0.5, shard_lost_after=3.0,
                                    endpoint_annotations=True)  # env servers run on this machine
    return OperatorConfig(**{**settings, **overrides})


def api_url(op: InThread) -> str:
    return f"http://127.0.0.1:{op.cfg.api_port}"


def metric(op: InThread, name: str, **labels: str) -> float:
    """The sum of a metric's samples with these labels, scraped from the operator's /metrics."""
    text = httpx.get(f"http://127.0.0.1:{op.cfg.metrics_port}/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Cluster:
    """The few calls the tests make, as the admin user."""

    def __init__(self, cp: Any, namespace: str) -> None:
        self.cp, self.ns = cp, namespace

    def create(self, plural: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        kind = {"envfleets": "EnvFleet", "envclaims": "EnvClaim", "campaigns": "Campaign"}[plural]
        body = {"apiVersion": "awm.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}
        return self.cp.api("POST", f"{API}/namespaces/{self.ns}/{plural}", body)

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        try:
            return self.cp.api("GET", f"{API}/namespaces/{self.ns}/{plural}/{name}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def status(self, plural: str, name: str) -> dict[str, Any]:
        return (self.get(plural, name) or {}).get("status") or {}

    def delete(self, plural: str, name: str) -> None:
        self.cp.api("DELETE", f"{API}/namespaces/{self.ns}/{plural}/{name}")

    def scale(self, fleet: str, replicas: int) -> None:
        self.cp.kubectl("-n", self.ns, "scale", f"envfleet/{fleet}", f"--replicas={replicas}")

    def pods(self, fleet: str) -> list[dict[str, Any]]:
        items = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector=awm.dev/fleet={fleet}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ledger_shards(self, fleet: str) -> dict[str, dict[str, str]]:
        """The fleet's ledger ConfigMaps as stored in the API server: name -> data."""
        items = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/configmaps"
                                   f"?labelSelector=app.kubernetes.io/name=awm-ledger,awm.dev/fleet={fleet}")["items"]
        return {cm["metadata"]["name"]: cm.get("data") or {} for cm in items}

    def ledger(self, fleet: str) -> dict[str, list[list[str]]]:
        """The fleet's allocation ledger, all its shards: claim id -> groups of pods."""
        return {cid: json.loads(v)["groups"] for data in self.ledger_shards(fleet).values() for cid, v in data.items()}

    def allocated(self, fleet: str) -> dict[str, str]:
        """pod -> claim id, from the ledger."""
        return {pod: cid for cid, groups in self.ledger(fleet).items() for g in groups for pod in g}

    def delete_pods(self, names: list[str]) -> None:
        for i in range(0, len(names), 50):
            self.cp.kubectl("-n", self.ns, "delete", "pod", "--wait=false", *names[i:i + 50])

    def annotate(self, pod: str, key: str, value: str) -> None:
        self.cp.kubectl("-n", self.ns, "annotate", "--overwrite", "pod", pod, f"{key}={value}")

    def ready(self, fleet: str, n: int) -> bool:
        s = self.status("envfleets", fleet)
        return s.get("ready") == n and s.get("replicas") == n


def claim_of(cluster: Cluster, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    cluster.create("envclaims", name, spec)
    return wait_for(f"claim {name} to settle",
                    lambda: (s := cluster.status("envclaims", name)).get("phase") in ("Bound", "Failed") and s)
