"""The Helm chart (charts/awm): lint, rendered objects, and a real install on a real API server.

Static part: `helm lint --strict`, `helm template` with the default values and with an external
database, parsed and checked object by object (kinds, names, labels, RBAC verbs, security
contexts, NetworkPolicy rules, metrics wiring, CRDs in sync with the pydantic models).

Cluster part: etcd + kube-apiserver + controller-manager + scheduler + kwok from k8s/harness.py
(pods are scheduled and marked Running, nothing executes): `helm install`, CRDs established, the
examples accepted and an out-of-range fleet rejected by the API server's schema validation, the
operator's ServiceAccount allowed exactly what the chart grants, `helm uninstall` leaving nothing
of the release behind (CRDs stay, by Helm's policy).

Without the binaries (k8s/build.sh builds them) every test here is skipped, with the reason,
except under CI=true, where that is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from k8s import harness
from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "awm"
EXAMPLES = CHART / "examples"
RELEASE = "awm"


BIN = harness.default_bin_dir()


@pytest.fixture(scope="module")
def helm() -> str:
    path = BIN / "helm"
    if os.access(path, os.X_OK):
        return str(path)
    found = shutil.which("helm")
    if found:
        return found
    require(False, f"helm not found in {BIN} nor on PATH: run k8s/build.sh")
    raise AssertionError  # unreachable


def run(*cmd: str, check: bool = True, env: dict[str, str] | None = None,
        input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True, env=env, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def render(helm: str, *sets: str, namespace: str = "awm-system") -> list[dict[str, Any]]:
    args = [helm, "template", RELEASE, str(CHART), "--namespace", namespace]
    for s in sets:  # "key=value", or "key:=<json>" for a value --set would mistype
        args += ["--set-json", s.replace(":=", "=", 1)] if ":=" in s else ["--set", s]
    return [d for d in yaml.safe_load_all(run(*args).stdout) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str, namespace: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name
             and (namespace is None or d["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


EXTERNAL = ("postgres.enabled=false", "externalDatabase.dsn=postgresql://awm:pw@db.example:5432/postgres")


# --------------------------------------------------------------------------- lint and values


def test_lint_strict(helm: str) -> None:
    for sets in ((), EXTERNAL, ("externalDatabase.secretName=my-db", "postgres.enabled=false")):
        args = [a for s in sets for a in ("--set", s)]
        r = run(helm, "lint", "--strict", str(CHART), *args)
        assert "0 chart(s) failed" in r.stdout, r.stdout


@pytest.mark.parametrize("bad, message", [
    ("operator.bogus=1", "additional properties 'bogus' not allowed"),
    ("operator.replicas=-1", "minimum"),
    ("postgres.persistence.whenDeleted=Keep", "whenDeleted"),
    ("operator.image.tag=", "tag"),
    ("networkPolicy.clients[0].podSelector.bogus=x", "bogus"),
])
def test_schema_rejects_bad_values(helm: str, bad: str, message: str) -> None:
    r = run(helm, "lint", "--strict", str(CHART), "--set", bad, check=False)
    assert r.returncode != 0 and message in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("sets", [
    ("postgres.enabled=false",),                                    # no database at all
    ("externalDatabase.shards.a=postgresql://a/p",),                # the chart's and external shards
    ("externalDatabase.secretName=my-db",),                         # two of them
    ("postgres.enabled=false", "externalDatabase.secretName=a", "externalDatabase.dsn=postgresql://x"),
])
def test_exactly_one_database(helm: str, sets: tuple[str, ...]) -> None:
    args = [a for s in sets for a in ("--set", s)]
    r = run(helm, "template", RELEASE, str(CHART), *args, check=False)
    assert r.returncode != 0 and "set exactly one of postgres.enabled" in r.stderr, r.stderr


def test_values_schema_covers_every_value() -> None:
    """Strict: every object in values.schema.json forbids unknown keys, and values.yaml uses only
    keys the schema declares (so a typo in values.yaml cannot slip through as an 'extra')."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def resolve(node: dict) -> dict:
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].split("/")[-1]]
        return node

    def walk(value: Any, node: dict, path: str) -> None:
        node = resolve(node)
        if isinstance(value, dict) and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path}: additionalProperties not false"
            for key, sub in value.items():
                assert key in node["properties"], f"{path}.{key} is not in the schema"
                walk(sub, node["properties"][key], f"{path}.{key}")

    walk(values, schema, "values")


# --------------------------------------------------------------------------- rendered objects


EXPECTED_DEFAULT = {
    ("ServiceAccount", "awm-operator"), ("Role", "awm-operator"), ("RoleBinding", "awm-operator"),
    ("ClusterRole", "awm-operator-awm-system"), ("ClusterRoleBinding", "awm-operator-awm-system"),
    ("Deployment", "awm-operator"), ("Service", "awm-operator-metrics"), ("Service", "awm-operator"),
    ("KopfPeering", "awm"),
    ("Secret", "awm-database"), ("Service", "awm-postgres"), ("StatefulSet", "awm-postgres"),
    ("NetworkPolicy", "awm-envserver"), ("NetworkPolicy", "awm-postgres"), ("NetworkPolicy", "awm-operator"),
    ("ConfigMap", "awm-dashboard"),
}
UI_OBJECTS = {("ServiceAccount", "awm-ui"), ("Role", "awm-ui"), ("RoleBinding", "awm-ui"), ("Deployment", "awm-ui"),
              ("Service", "awm-ui")}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def test_default_render_objects_and_labels(helm: str) -> None:
    assert {(d["kind"], d["metadata"]["name"]) for d in render(helm)} == EXPECTED_DEFAULT  # the UI is opt-in
    docs = render(helm, "ui.enabled=true")
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == EXPECTED_DEFAULT | UI_OBJECTS
    for d in docs:
        meta = d["metadata"]
        labels = meta["labels"]
        where = f"{d['kind']}/{meta['name']}"
        assert labels["app.kubernetes.io/instance"] == RELEASE, where
        assert labels["app.kubernetes.io/managed-by"] == "Helm", where
        assert labels["app.kubernetes.io/part-of"] == "awm", where
        assert labels["app.kubernetes.io/name"].startswith("awm-"), where
        assert labels["helm.sh/chart"] == "awm-0.1.0", where
        if d["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, where
        else:
            assert meta["namespace"] == "awm-system", where
    # Workloads select on stable labels only (no version: selectors are immutable).
    for d in by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet"):
        sel = d["spec"]["selector"]["matchLabels"]
        assert set(sel) == {"app.kubernetes.io/name", "app.kubernetes.io/instance"}
        assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    for vct in one(docs, "StatefulSet", "awm-postgres")["spec"]["volumeClaimTemplates"]:
        assert "helm.sh/chart" not in vct["metadata"]["labels"]  # immutable: no version label


OPERATOR_RULES = {
    ("awm.dev", "envfleets"): {"get", "list", "watch", "patch"},
    ("awm.dev", "envclaims"): {"get", "list", "watch"},
    ("awm.dev", "envfleets/status"): {"get", "patch"},
    ("awm.dev", "envclaims/status"): {"get", "patch"},
    ("awm.dev", "envfleets/finalizers"): {"update"},
    ("", "pods"): {"get", "list", "watch", "create", "delete"},
    ("", "configmaps"): {"get", "list", "create", "patch"},  # each fleet's allocation ledger (its shards)
    ("", "secrets"): {"get"},
    ("", "events"): {"create"},
    ("kopf.dev", "kopfpeerings"): {"get", "list", "watch", "patch"},
}
# What campaigns add (operator/awm_operator/campaigns.py): their own resource, the fleet and
# Job (and training ConfigMap) each campaign makes and the fleet it deletes when done.
CAMPAIGN_RULES = {
    ("awm.dev", "campaigns"): {"get", "list", "watch"},
    ("awm.dev", "campaigns/status"): {"patch", "update"},  # update: granted to the trainer, see below
    ("awm.dev", "campaigns/finalizers"): {"update"},
    ("awm.dev", "envfleets"): {"create", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create"},
    ("", "configmaps"): {"get", "create"},
    ("", "services"): {"get", "create"},  # the headless Service of a learner on several nodes
    # Each campaign's trainer identity (campaign_manifests.trainer_access): RBAC lets the operator grant only
    # what it holds, hence the envclaims and campaigns/status verbs it never uses itself.
    ("", "serviceaccounts"): {"create", "get"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "get"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "get"},
    ("awm.dev", "envclaims"): {"create", "update", "delete"},
}


def merged(*rule_sets: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rules in rule_sets:
        for key, verbs in rules.items():
            out.setdefault(key, set()).update(verbs)
    return out


OPERATOR_CLUSTER_RULES = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
    ("", "namespaces"): {"list", "watch"},
    # Who calls the allocation API, and whether RBAC lets them (awm_operator/auth.py).
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
}


def rules_of(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_is_exactly_what_the_operator_needs(helm: str) -> None:
    docs = render(helm, "ui.enabled=true")
    assert rules_of(one(docs, "Role", "awm-operator")) == merged(OPERATOR_RULES, CAMPAIGN_RULES)
    assert rules_of(one(docs, "ClusterRole", "awm-operator-awm-system")) == OPERATOR_CLUSTER_RULES
    sa = {"kind": "ServiceAccount", "name": "awm-operator", "namespace": "awm-system"}
    for kind, role_kind, name in (("RoleBinding", "Role", "awm-operator"),
                                  ("ClusterRoleBinding", "ClusterRole", "awm-operator-awm-system")):
        binding = one(docs, kind, name)
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name}
        assert binding["subjects"] == [sa]
    deployment = one(docs, "Deployment", "awm-operator")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "awm-operator"
    # the UI's identity may list campaigns and fleets (what the operator's API asks of it), nothing else
    assert rules_of(one(docs, "Role", "awm-ui")) == {("awm.dev", "campaigns"): {"list"}, ("awm.dev", "envfleets"): {"list"}}
    assert one(docs, "RoleBinding", "awm-ui")["subjects"] == [
        {"kind": "ServiceAccount", "name": "awm-ui", "namespace": "awm-system"}]
    assert one(docs, "Deployment", "awm-ui")["spec"]["template"]["spec"]["serviceAccountName"] == "awm-ui"


def containers(docs: list[dict]) -> list[tuple[str, dict, dict]]:
    out = []
    for d in by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet"):
        pod = d["spec"]["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            out.append((f"{d['kind']}/{d['metadata']['name']}/{c['name']}", pod, c))
    return out


@pytest.mark.parametrize("sets", [("ui.enabled=true",), EXTERNAL])
def test_pods_are_locked_down(helm: str, sets: tuple[str, ...]) -> None:
    found = containers(render(helm, *sets))
    assert found
    for where, pod, c in found:
        psc, csc = pod["securityContext"], c["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] > 0, where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert csc["allowPrivilegeEscalation"] is False, where
        assert csc["readOnlyRootFilesystem"] is True, where
        assert csc["capabilities"] == {"drop": ["ALL"]}, where
        assert "privileged" not in csc or csc["privileged"] is False, where
        res = c["resources"]
        assert {"cpu", "memory"} <= set(res["requests"]) and {"cpu", "memory"} <= set(res["limits"]), where
        # Pinned tags: name:tag, never latest, never untagged.
        image = c["image"]
        name, _, tag = image.rpartition(":")
        assert name and "/" not in tag and tag not in ("", "latest"), f"{where}: {image}"
        # Read-only root: whatever must be writable is an emptyDir or a PVC.
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes or m["name"] == "data", where


def test_operator_deployment(helm: str) -> None:
    docs = render(helm, "operator.replicas=3", "imageRegistry=registry.example/awm")
    d = one(docs, "Deployment", "awm-operator")
    assert d["spec"]["replicas"] == 3
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.example/awm/awm-operator:0.1.0"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9090, "api": 8080}
    assert c["livenessProbe"]["httpGet"] == c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    api = one(docs, "Service", "awm-operator")
    assert api["spec"]["ports"] == [{"name": "api", "port": 8080, "targetPort": "api", "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["AWM_NAMESPACES"] == "awm-system" and env["AWM_RELEASE"] == RELEASE
    assert env["AWM_PEERING"] == "awm"  # the KopfPeering object the chart creates
    assert one(docs, "KopfPeering", "awm", "awm-system")["apiVersion"] == "kopf.dev/v1"
    assert env["AWM_ENVSERVER_IMAGE"] == "registry.example/awm/awm-envserver:0.1.0"
    assert env["AWM_CATALOG_IMAGE"] == "registry.example/awm/awm-catalog:0.1.0"
    assert json.loads(env["AWM_ENVSERVER_RESOURCES"])["limits"] == {"cpu": "1", "memory": "1Gi"}
    # A registry in the repository itself is kept as is.
    pg = one(docs, "StatefulSet", "awm-postgres")["spec"]["template"]["spec"]["containers"][0]
    assert pg["image"] == "docker.io/library/postgres:17.6-bookworm"


def test_operator_env_is_what_the_operator_reads(helm: str) -> None:
    """The Deployment's variables, parsed by the operator's own OperatorConfig.from_env."""
    from awm_operator import config
    docs = render(helm, "operator.watchNamespaces={team-a,team-b}", "operator.logLevel=debug")
    c = one(docs, "Deployment", "awm-operator")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    cfg = config.OperatorConfig.from_env(env)
    assert cfg.namespaces == ["team-a", "team-b"]
    assert (cfg.release, cfg.peering, cfg.metrics_port, cfg.api_port) == (RELEASE, "awm", 9090, 8080)
    assert cfg.log_level == "debug" and cfg.shard_lost_after == 60
    assert cfg.envserver_image == "awm-envserver:0.1.0" and cfg.catalog_image == "awm-catalog:0.1.0"
    assert cfg.catalog_path == "/catalog" and cfg.catalog_pull_policy == "IfNotPresent"
    assert not cfg.endpoint_annotations  # a test-only switch the chart never sets
    assert cfg.envserver_resources["requests"] == {"cpu": "100m", "memory": "256Mi"}
    # Replicas of one Deployment get the same variables, yet need distinct kopf priorities
    # (equal ones make kopf pause them all): the chart sets none, each process draws its own.
    assert "AWM_PRIORITY" not in env
    assert len({config.OperatorConfig.from_env(env).priority for _ in range(8)}) == 8


def test_watch_namespaces(helm: str) -> None:
    docs = render(helm, "operator.watchNamespaces={team-a,team-b}")
    for ns in ("team-a", "team-b"):
        for kind, name in (("Role", "awm-operator"), ("RoleBinding", "awm-operator"), ("KopfPeering", "awm"),
                           ("NetworkPolicy", "awm-envserver"), ("Secret", "awm-database")):
            one(docs, kind, name, ns)
        binding = one(docs, "RoleBinding", "awm-operator", ns)
        assert binding["subjects"][0]["namespace"] == "awm-system"  # the operator's own namespace
    # The operator, its Postgres and the admin password stay in the release namespace.
    assert one(docs, "Deployment", "awm-operator")["metadata"]["namespace"] == "awm-system"
    assert not [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "awm-system"]
    dsns = {base64.b64decode(one(docs, "Secret", "awm-database", ns)["data"]["dsn"]) for ns in ("team-a", "team-b")}
    assert len(dsns) == 1  # one password, copied to each namespace
    assert all("postgres-password" not in one(docs, "Secret", "awm-database", ns)["data"] for ns in ("team-a", "team-b"))
    pg_policy = one(docs, "NetworkPolicy", "awm-postgres")
    allowed = [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
               for p in pg_policy["spec"]["ingress"][0]["from"]]
    assert allowed == ["awm-system", "team-a", "team-b"]  # the operator, then env pods per namespace


def test_database_secret_modes(helm: str) -> None:
    docs = render(helm)
    data = one(docs, "Secret", "awm-database")["data"]
    password = base64.b64decode(data["postgres-password"]).decode()
    assert len(password) == 32
    assert base64.b64decode(data["dsn"]).decode() == \
        f"postgresql://postgres:{password}@awm-postgres.awm-system.svc:5432/postgres"
    pg = one(docs, "StatefulSet", "awm-postgres")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "POSTGRES_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "awm-database", "key": "postgres-password"}}} in pg["env"]

    docs = render(helm, *EXTERNAL)
    assert not by_kind(docs, "StatefulSet") and ("Service", "awm-postgres") not in {(d["kind"], d["metadata"]["name"]) for d in docs}
    data = one(docs, "Secret", "awm-database")["data"]
    assert set(data) == {"dsn"}
    assert base64.b64decode(data["dsn"]).decode() == EXTERNAL[1].split("=", 1)[1]
    assert not [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "awm-postgres"]

    docs = render(helm, "postgres.enabled=false", "externalDatabase.secretName=my-db")
    assert not by_kind(docs, "Secret") and not by_kind(docs, "StatefulSet")

    # external shards, with or without a `dsn` (keys dsn-<name>: what the operator reads as shards)
    docs = render(helm, *EXTERNAL, "externalDatabase.shards.east=postgresql://awm:pw@east:5432/postgres")
    data = one(docs, "Secret", "awm-database")["data"]
    assert set(data) == {"dsn", "dsn-east"}
    docs = render(helm, "postgres.enabled=false", "externalDatabase.shards.a=postgresql://a/p",
                  "externalDatabase.shards.b=postgresql://b/p")
    assert set(one(docs, "Secret", "awm-database")["data"]) == {"dsn-a", "dsn-b"}


def test_postgres_shards(helm: str) -> None:
    """postgres.shards=3: three servers of one StatefulSet, each behind a Service of its own pod,
    and one Secret key per shard; the first keeps key `dsn` (pods made before shards use it)."""
    from awm_operator.databases import shard_keys
    docs = render(helm, "postgres.shards=3")
    assert one(docs, "StatefulSet", "awm-postgres")["spec"]["replicas"] == 3
    data = one(docs, "Secret", "awm-database")["data"]
    password = base64.b64decode(data["postgres-password"]).decode()
    assert shard_keys(data) == {"default": "dsn", "1": "dsn-1", "2": "dsn-2"}
    for i, key in enumerate(("dsn", "dsn-1", "dsn-2")):
        assert base64.b64decode(data[key]).decode() == \
            f"postgresql://postgres:{password}@awm-postgres-{i}.awm-system.svc:5432/postgres"
        svc = one(docs, "Service", f"awm-postgres-{i}")["spec"]
        assert svc["selector"]["statefulset.kubernetes.io/pod-name"] == f"awm-postgres-{i}"
    # one shard: no per-shard Services, the one Service as before
    docs = render(helm)
    assert one(docs, "StatefulSet", "awm-postgres")["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].startswith("awm-postgres-")]


def test_postgres_persistence(helm: str) -> None:
    sts = one(render(helm), "StatefulSet", "awm-postgres")["spec"]
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Delete", "whenScaled": "Retain"}
    assert sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"
    sts = one(render(helm, "postgres.persistence.enabled=false"), "StatefulSet", "awm-postgres")["spec"]
    assert "volumeClaimTemplates" not in sts and "persistentVolumeClaimRetentionPolicy" not in sts
    assert {"name": "data", "emptyDir": {}} in sts["template"]["spec"]["volumes"]
    args = one(render(helm, "postgres.maxConnections=3000"), "StatefulSet", "awm-postgres")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["-c", "max_connections=3000"]


def _ports(rule: dict) -> set[tuple[int, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def test_envserver_network_policy(helm: str) -> None:
    policy = one(render(helm), "NetworkPolicy", "awm-envserver")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "awm-envserver"}}
    assert sorted(policy["policyTypes"]) == ["Egress", "Ingress"]
    egress = policy["egress"]
    # Nothing but Postgres and DNS; every rule names its destinations (an empty `to` = anywhere).
    assert len(egress) == 2 and all(rule.get("to") for rule in egress)
    pg, dns = egress
    assert pg["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "awm-system"}},
                         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "awm-postgres",
                                                         "app.kubernetes.io/instance": RELEASE}}}]
    assert _ports(pg) == {(5432, "TCP")}
    assert dns["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                          "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}]
    assert _ports(dns) == {(53, "UDP"), (53, "TCP")}
    # Ingress: MCP and control, from the operator and the trainer's pods only.
    (ingress,) = policy["ingress"]
    assert _ports(ingress) == {(8000, "TCP"), (8001, "TCP")}
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "awm-system"}},
         "podSelector": {"matchLabels": {"app.kubernetes.io/name": "awm-operator", "app.kubernetes.io/instance": RELEASE}}},
        {"podSelector": {"matchLabels": {"awm.dev/client": "true"}}}]
    # The chart's Postgres takes connections from env pods and the operator only.
    pg_policy = one(render(helm), "NetworkPolicy", "awm-postgres")["spec"]
    assert pg_policy["policyTypes"] == ["Ingress"] and _ports(pg_policy["ingress"][0]) == {(5432, "TCP")}


def test_operator_api_answers_only_clients_of_the_served_namespaces(helm: str) -> None:
    policy = one(render(helm, "operator.watchNamespaces={team-a,team-b}", "ui.enabled=true",
                        'networkPolicy.clients:=[{"podSelector": {"matchLabels": {"awm.dev/client": "true"}}},'
                        ' {"namespaceSelector": {"matchLabels": {"role": "trainers"}}}]'),
                 "NetworkPolicy", "awm-operator")["spec"]
    assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "awm-operator"
    api, metrics = policy["ingress"]
    assert _ports(api) == {(8080, "TCP")} and _ports(metrics) == {(9090, "TCP")} and "from" not in metrics
    clients = {"podSelector": {"matchLabels": {"awm.dev/client": "true"}}}
    ui = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "awm-system"}},
          "podSelector": {"matchLabels": {"app.kubernetes.io/name": "awm-ui", "app.kubernetes.io/instance": RELEASE}}}
    assert api["from"] == [
        ui,  # the chart's web view (it lists campaigns)
        {**clients, "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}},
        {"namespaceSelector": {"matchLabels": {"role": "trainers"}}},  # a peer that names its namespaces
        {**clients, "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-b"}}},
        {"namespaceSelector": {"matchLabels": {"role": "trainers"}}}]


def test_no_clients_means_no_one_reaches_the_operator_api(helm: str) -> None:
    """An empty ``from`` in a NetworkPolicy rule admits every peer: with no clients (and no UI)
    the chart leaves the 8080 rule out (the API answers no pod), and env pods answer only the
    operator. With the UI, its pods alone reach the API."""
    docs = render(helm, "networkPolicy.clients:=[]", "ui.enabled=true")
    (ui, _) = one(docs, "NetworkPolicy", "awm-operator")["spec"]["ingress"]
    assert ui["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "awm-system"}},
                           "podSelector": {"matchLabels": {"app.kubernetes.io/name": "awm-ui",
                                                           "app.kubernetes.io/instance": RELEASE}}}]
    docs = render(helm, "networkPolicy.clients:=[]", "ui.enabled=false")
    (metrics,) = one(docs, "NetworkPolicy", "awm-operator")["spec"]["ingress"]
    assert _ports(metrics) == {(9090, "TCP")}
    env_ingress = one(docs, "NetworkPolicy", "awm-envserver")["spec"]["ingress"]
    assert all(rule.get("from") for rule in env_ingress)
    assert [peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in env_ingress[0]["from"]] \
        == ["awm-operator"]


def test_ui_component(helm: str) -> None:
    """The web view next to the operator: it reads the Campaigns and EnvFleets of every served namespace
    through the operator's API (its own ServiceAccount, a Role per namespace), shows the runs of a
    claim mounted read-only, answers to its Service's names and the Ingress host only, and is
    gone when disabled."""
    docs = render(helm, "ui.enabled=true", "operator.watchNamespaces={team-a,team-b}", "ui.runsClaim=runs",
                  "ui.ingress.enabled=true", "ui.ingress.host=awm.example.org", "ui.allowedHosts={ui.internal}")
    pod = one(docs, "Deployment", "awm-ui")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "awm-envserver:0.1.0" and c["command"] == ["awm", "ui"]
    assert c["args"] == ["--host=0.0.0.0", "--port=8090", "--operator-url=http://awm-operator.awm-system.svc:8080",
                         "--namespace=team-a", "--namespace=team-b", "--runs=/runs",
                         "--allowed-host=awm-ui", "--allowed-host=awm-ui.awm-system",
                         "--allowed-host=awm-ui.awm-system.svc", "--allowed-host=awm.example.org",
                         "--allowed-host=ui.internal"]
    assert {"name": "runs", "mountPath": "/runs", "readOnly": True} in c["volumeMounts"]
    assert {"name": "runs", "persistentVolumeClaim": {"claimName": "runs", "readOnly": True}} in pod["volumes"]
    assert {r["metadata"]["namespace"] for r in by_kind(docs, "Role") if r["metadata"]["name"] == "awm-ui"} \
        == {"team-a", "team-b"}
    ingress = one(docs, "Ingress", "awm-ui")["spec"]["rules"][0]
    assert ingress["host"] == "awm.example.org"
    assert ingress["http"]["paths"][0]["backend"]["service"] == {"name": "awm-ui", "port": {"name": "http"}}
    assert not [d for d in render(helm, "ui.enabled=false") if d["metadata"]["name"].startswith("awm-ui")]
    # its image is the env server's (one override for both), unless it has its own
    image = lambda *sets: one(render(helm, "ui.enabled=true", *sets), "Deployment", "awm-ui")["spec"]["template"]["spec"]["containers"][0]
    assert image("envserver.image.repository=reg.example/env", "envserver.image.tag=1.2")["image"] == "reg.example/env:1.2"
    own = image("ui.image.repository=reg.example/ui", "ui.image.tag=v3", "ui.image.pullPolicy=Always")
    assert (own["image"], own["imagePullPolicy"]) == ("reg.example/ui:v3", "Always")
    r = subprocess.run([helm, "template", RELEASE, str(CHART), "--set", "ui.enabled=true", "--set", "ui.ingress.enabled=true"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "ui.ingress.host is required" in r.stderr


def test_ui_playground_in_the_cluster(helm: str) -> None:
    """``ui.playground``: the UI claims for the person at the browser (--playground-claims) and env
    pods admit it on MCP and control; without it, they admit only the operator and the clients."""
    ui_peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "awm-system"}},
               "podSelector": {"matchLabels": {"app.kubernetes.io/name": "awm-ui", "app.kubernetes.io/instance": RELEASE}}}

    def peers(*sets: str) -> tuple[list[str], list[dict[str, Any]]]:
        docs = render(helm, "ui.enabled=true", *sets)
        args = one(docs, "Deployment", "awm-ui")["spec"]["template"]["spec"]["containers"][0]["args"]
        ingress = one(docs, "NetworkPolicy", "awm-envserver")["spec"]["ingress"][0]
        assert _ports(ingress) == {(8000, "TCP"), (8001, "TCP")}
        return args, ingress["from"]

    args, allowed = peers("ui.playground=true")
    assert "--playground-claims" in args and ui_peer in allowed
    args, allowed = peers()
    assert "--playground-claims" not in args and ui_peer not in allowed


def test_envserver_network_policy_external_database(helm: str) -> None:
    egress = one(render(helm, *EXTERNAL), "NetworkPolicy", "awm-envserver")["spec"]["egress"]
    assert "to" not in egress[0] and _ports(egress[0]) == {(5432, "TCP")}  # any host, Postgres port only
    egress = one(render(helm, *EXTERNAL, "externalDatabase.egressTo[0].ipBlock.cidr=10.1.2.3/32",
                        "externalDatabase.port=6432", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs"),
                 "NetworkPolicy", "awm-envserver")["spec"]
    assert egress["egress"][0] == {"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}], "ports": [{"port": 6432, "protocol": "TCP"}]}
    assert egress["ingress"][1] == {"from": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
                                    "ports": [{"port": 8001, "protocol": "TCP"}]}
    assert not [d for d in render(helm, "networkPolicy.enabled=false") if d["kind"] == "NetworkPolicy"]


def _known_metrics() -> set[str]:
    from prometheus_client import CollectorRegistry

    from awm.envserver.metrics import Metrics

    names = set()
    registry: CollectorRegistry = Metrics("env", "instance").registry
    for family in registry.collect():
        names.add(family.name)
    operator_metrics = {"awm_fleet_instances", "awm_claims", "awm_claim_latency_seconds", "awm_reconcile_seconds"}
    source = "\n".join(p.read_text() for p in (ROOT / "operator" / "awm_operator").glob("*.py"))
    if "awm_fleet_instances" in source:  # the operator's metrics module exists: take names from it
        operator_metrics = set(re.findall(r"[\"'](awm_[a-z_]+)[\"']", source))
    return names | {m.removesuffix("_total") for m in operator_metrics}


def test_metrics_service_monitors_and_dashboard(helm: str) -> None:
    docs = render(helm)
    svc = one(docs, "Service", "awm-operator-metrics")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["metadata"]["annotations"] == {"prometheus.io/scrape": "true", "prometheus.io/port": "9090",
                                              "prometheus.io/path": "/metrics"}
    assert svc["spec"]["selector"] == one(docs, "Deployment", "awm-operator")["spec"]["selector"]["matchLabels"]
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PodMonitor")

    docs = render(helm, "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
                  "metrics.serviceMonitor.labels.release=prom")
    sm = one(docs, "ServiceMonitor", "awm-operator")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True  # fleet metrics keep their fleet's namespace
    assert sm["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
    pm = one(docs, "PodMonitor", "awm-envserver")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "control"
    assert pm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "awm-envserver"

    cm = one(render(helm), "ConfigMap", "awm-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm["data"]["awm-dashboard.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {re.sub(r"_(bucket|count|sum)$", "", m) for e in exprs for m in re.findall(r"\bawm_[a-z_]+", e)}
    used = {m.removesuffix("_total") for m in used}
    assert used <= _known_metrics(), used - _known_metrics()
    for needed in ("awm_fleet_instances", "awm_claims", "awm_claim_latency_seconds", "awm_reset_seconds",
                   "awm_tool_calls", "awm_episodes", "awm_reconcile_seconds"):
        assert needed in used, needed
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    assert not [d for d in render(helm, "metrics.grafanaDashboard.enabled=false") if d["kind"] == "ConfigMap"]


# --------------------------------------------------------------------------- CRDs and examples


def _operator_crds():
    from awm_operator import crds
    return crds


EXAMPLE_FILES = ("envfleet.yaml", "envfleet-pinned.yaml", "envclaim.yaml", "grpo-claim.yaml", "campaign-training.yaml",
                 "campaign-evaluation.yaml", "campaign-qwen3-4b-8gpu.yaml", "campaign-qwen3-4b-nodes.yaml")


def test_crds_in_sync_with_models() -> None:
    files = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] == "CustomResourceDefinition", path
                files[doc["metadata"]["name"]] = doc
    expected = {crd["metadata"]["name"]: crd for crd in _operator_crds().definitions()}
    assert {n: files.get(n) for n in expected} == expected, "regenerate charts/awm/crds (awm operator crds)"
    assert set(files) == set(expected) | {"kopfpeerings.kopf.dev", "clusterkopfpeerings.kopf.dev"}
    assert files["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    assert files["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"


def test_examples_match_the_models() -> None:
    crds = _operator_crds()
    models = {"EnvFleet": crds.EnvFleetSpec, "EnvClaim": crds.EnvClaimSpec, "Campaign": crds.CampaignSpec}
    kinds = []
    for name in EXAMPLE_FILES:
        doc = yaml.safe_load((EXAMPLES / name).read_text())
        assert doc["apiVersion"] == "awm.dev/v1alpha1"
        models[doc["kind"]].model_validate(doc["spec"])
        kinds.append(doc["kind"])
    assert kinds == ["EnvFleet", "EnvFleet", "EnvClaim", "EnvClaim", "Campaign", "Campaign", "Campaign", "Campaign"]
    # The default fleet binds late (a catalog image, no binding given); the pinned one says so.
    def fleet_of(name: str) -> Any:
        return crds.EnvFleetSpec.model_validate(yaml.safe_load((EXAMPLES / name).read_text())["spec"])

    assert fleet_of("envfleet.yaml").late and not fleet_of("envfleet-pinned.yaml").late
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(EXAMPLE_FILES)
    grpo = yaml.safe_load((EXAMPLES / "grpo-claim.yaml").read_text())["spec"]
    assert grpo["count"] % grpo["groupSize"] == 0
    fleet = yaml.safe_load((EXAMPLES / "envfleet.yaml").read_text())["spec"]
    assert fleet["database"]["secretName"] == "awm-database"  # what `helm install awm` creates


# --------------------------------------------------------------------------- on a real API server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require(harness.binaries_present(), f"Kubernetes test binaries missing in {BIN}: run k8s/build.sh")
    cp = harness.ControlPlane(nodes=2)
    cp.start(tmp_path_factory.mktemp("k8s"))
    yield cp
    cp.stop()


NS = "awm-test"


def kubectl(cp, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    r = cp.kubectl(*args, check=False, input=input)
    if check and r.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
    return r


def names(cp, kind: str, selector: str, namespace: str | None = NS) -> list[str]:
    scope = ["-n", namespace] if namespace else []
    out = kubectl(cp, "get", kind, *scope, "-l", selector, "-o", "name").stdout
    return sorted(out.split())


def wait_for(what: str, ok, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


RELEASE_SELECTOR = f"app.kubernetes.io/instance={RELEASE}"


@pytest.mark.slow
def test_install_validate_uninstall(cluster, helm: str) -> None:
    cp = cluster
    env = cp.env()
    r = run(helm, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace", env=env, timeout=180)
    assert "STATUS: deployed" in r.stdout and "charts/awm/examples/envfleet.yaml" in r.stdout
    assert 'Fleets name the database Secret "awm-database"' in r.stdout  # NOTES.txt
    r = run(helm, "install", "other", str(CHART), "--namespace", NS, "--dry-run=server", "--set", "postgres.enabled=false",
            "--set", "externalDatabase.secretName=my-db", env=env)
    assert 'Fleets name the database Secret "my-db"' in r.stdout

    # CRDs from crds/ are served.
    kubectl(cp, "wait", "--for=condition=Established", "--timeout=60s", "crd/envfleets.awm.dev",
            "crd/envclaims.awm.dev", "crd/campaigns.awm.dev", "crd/kopfpeerings.kopf.dev",
            "crd/clusterkopfpeerings.kopf.dev")

    # Workloads: the operator's pod runs (kwok plays the kubelet); Postgres' claims its volume.
    kubectl(cp, "-n", NS, "rollout", "status", "deployment/awm-operator", "--timeout=90s")
    wait_for("the Postgres pod", lambda: names(cp, "pods", "app.kubernetes.io/name=awm-postgres") == ["pod/awm-postgres-0"])
    assert names(cp, "pvc", "app.kubernetes.io/name=awm-postgres") == ["persistentvolumeclaim/data-awm-postgres-0"]
    assert kubectl(cp, "-n", NS, "get", "kopfpeering", "awm", "-o", "name").stdout.strip() == "kopfpeering.kopf.dev/awm"

    # The operator's ServiceAccount may do what the operator does, and nothing else.
    sa = f"system:serviceaccount:{NS}:awm-operator"
    allowed = [("create", "pods"), ("delete", "pods"), ("watch", "pods"), ("get", "secrets"),
               ("patch", "envfleets.awm.dev"), ("patch", "envfleets.awm.dev/status"), ("list", "envclaims.awm.dev"),
               ("update", "envfleets.awm.dev/finalizers"), ("create", "events"), ("patch", "kopfpeerings.kopf.dev"),
               ("watch", "campaigns.awm.dev"), ("patch", "campaigns.awm.dev/status"), ("create", "jobs.batch"),
               ("watch", "jobs.batch"), ("create", "envfleets.awm.dev"), ("delete", "envfleets.awm.dev"),
               ("create", "serviceaccounts"), ("create", "rolebindings.rbac.authorization.k8s.io"),
               ("create", "envclaims.awm.dev")]
    denied = [("list", "secrets"), ("create", "secrets"), ("delete", "serviceaccounts"),
              ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
              ("create", "deployments.apps"), ("create", "pods/exec"), ("patch", "campaigns.awm.dev"),
              ("create", "campaigns.awm.dev"), ("delete", "jobs.batch"), ("patch", "jobs.batch"),
              ("delete", "configmaps"), ("patch", "envclaims.awm.dev")]
    for verb, resource in allowed + denied:
        resource, _, sub = resource.partition("/")
        r = kubectl(cp, "auth", "can-i", verb, resource, *(["--subresource", sub] if sub else []),
                    "-n", NS, "--as", sa, check=False)
        resource = f"{resource}/{sub}" if sub else resource
        assert r.stdout.strip() == ("yes" if (verb, resource) in allowed else "no"), (verb, resource, r.stdout, r.stderr)
    assert kubectl(cp, "auth", "can-i", "create", "pods", "-n", "default", "--as", sa, check=False).stdout.strip() == "no"
    assert kubectl(cp, "auth", "can-i", "watch", "customresourcedefinitions", "--as", sa,
                   check=False).stdout.strip() == "yes"

    # The examples pass the API server's schema validation; an out-of-range fleet does not.
    for example in EXAMPLE_FILES:
        kubectl(cp, "-n", NS, "apply", "-f", str(EXAMPLES / example))
    fleet = json.loads(kubectl(cp, "-n", NS, "get", "envfleet", "demo", "-o", "json").stdout)
    assert fleet["spec"]["replicas"] == 6 and fleet["spec"]["environments"] == ["bike_shop", "crm", "project_tracker"]
    bad = yaml.safe_load((EXAMPLES / "envfleet.yaml").read_text())
    bad["metadata"]["name"] = "too-big"
    bad["spec"]["replicas"] = 5000
    r = kubectl(cp, "-n", NS, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert r.returncode != 0 and "spec.replicas" in r.stderr and "4096" in r.stderr, r.stderr
    bad["spec"]["replicas"], bad["spec"]["bogus"] = 2, True
    r = kubectl(cp, "-n", NS, "apply", "--validate=strict", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert r.returncode != 0 and "bogus" in r.stderr, r.stderr
    r = kubectl(cp, "-n", NS, "get", "envfleet", "too-big", check=False)
    assert r.returncode != 0  # nothing was stored
    # A campaign whose sizes break the CRD's rule is refused by the API server (CEL).
    bad = yaml.safe_load((EXAMPLES / "campaign-evaluation.yaml").read_text())
    bad["metadata"]["name"] = "too-many"
    bad["spec"]["groupsPerEnvironment"] = 400  # 3 environments x 400 x k=4 > 4096
    r = kubectl(cp, "-n", NS, "apply", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert r.returncode != 0 and "at most 4096" in r.stderr, r.stderr
    kubectl(cp, "-n", NS, "delete", *(a for name in reversed(EXAMPLE_FILES) for a in ("-f", str(EXAMPLES / name))),
            "--wait=true", "--timeout=60s")

    # Uninstall: nothing of the release is left (pods, services, secrets, RBAC, volumes...).
    run(helm, "uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "120s", env=env, timeout=180)
    namespaced = ["pods", "services", "secrets", "configmaps", "serviceaccounts", "roles", "rolebindings",
                  "networkpolicies", "deployments", "statefulsets", "replicasets", "persistentvolumeclaims",
                  "kopfpeerings"]
    wait_for("the release's objects to be gone",
             lambda: not any(names(cp, kind, RELEASE_SELECTOR) for kind in namespaced), timeout=90)
    for kind in ("clusterroles", "clusterrolebindings"):
        assert names(cp, kind, RELEASE_SELECTOR, namespace=None) == [], kind
    assert names(cp, "secrets", f"owner=helm,name={RELEASE}") == []  # Helm's release records
    left = kubectl(cp, "-n", NS, "get", "all,secrets,configmaps,pvc,networkpolicies,roles,rolebindings",
                   "-o", "name").stdout.split()
    assert [n for n in left if "awm" in n] == [], left
    # CRDs stay (Helm never deletes crds/ objects); removing them is a deliberate step.
    kubectl(cp, "get", "crd", "envfleets.awm.dev", "envclaims.awm.dev", "campaigns.awm.dev")
    kubectl(cp, "delete", "crd", "envfleets.awm.dev", "envclaims.awm.dev", "campaigns.awm.dev", "--wait=true")


@pytest.mark.slow
def test_the_operator_works_under_the_charts_rbac(cluster, helm: str, admin_dsn: str, tmp_path: Path) -> None:
    """The operator with the chart's ServiceAccount token (not cluster admin) and the settings of
    the chart's Deployment: a fleet gets its pods and its Ready status, a claim binds and is
    released, the fleet's deletion removes pods, ledger and finalizer. A verb the Role lacks, or
    one it grants that this needs, shows here (kwok plays the kubelet; the operator runs here)."""
    from awm_operator.config import OperatorConfig
    from awm_operator.main import InThread

    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    cp, env, ns = cluster, cluster.env(), "awm-rbac"
    db = conninfo_to_dict(admin_dsn)  # the chart takes a URL
    url = (f"postgresql://{db['user']}:{quote(db['password'], safe='')}@/{db['dbname']}"
           f"?host={quote(db['host'], safe='')}&port={db.get('port', 5432)}")
    run(helm, "install", RELEASE, str(CHART), "--namespace", ns, "--create-namespace", "--set", "postgres.enabled=false",
        "--set-string", f"externalDatabase.dsn={url}", env=env, timeout=180)
    try:
        kubeconfig = yaml.safe_load(Path(cp.kubeconfig).read_text())
        token = kubectl(cp, "-n", ns, "create", "token", "awm-operator").stdout.strip()
        kubeconfig["users"] = [{"name": "awm-operator", "user": {"token": token}}]
        for context in kubeconfig["contexts"]:
            context["context"]["user"] = "awm-operator"
        as_operator = tmp_path / "operator.kubeconfig"
        as_operator.write_text(yaml.safe_dump(kubeconfig))
        manifest = yaml.safe_load_all(run(helm, "get", "manifest", RELEASE, "--namespace", ns, env=env).stdout)
        deployment = next(d for d in manifest if d and d["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        cfg = OperatorConfig.from_env({e["name"]: e["value"] for e in container["env"] if "value" in e})
        cfg.api_host, cfg.api_port, cfg.metrics_port, cfg.reset_timeout = "127.0.0.1", 0, 0, 2.0
        assert cfg.namespaces == [ns] and cfg.peering == RELEASE

        def status(kind: str, name: str) -> dict[str, Any]:
            r = kubectl(cp, "-n", ns, "get", kind, name, "-o", "json", check=False)
            return json.loads(r.stdout).get("status", {}) if r.returncode == 0 else {}

        with InThread(cfg, str(as_operator)):
            fleet = {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": "rbac"},
                     "spec": {"environments": ["crm"], "replicas": 2, "catalog": {},
                              "database": {"secretName": "awm-database"}}}
            kubectl(cp, "-n", ns, "apply", "-f", "-", input=json.dumps(fleet))
            wait_for("the fleet Ready", lambda: status("envfleet", "rbac").get("ready") == 2, timeout=90)
            claim = {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvClaim", "metadata": {"name": "one"},
                     "spec": {"fleet": "rbac", "count": 1}}
            kubectl(cp, "-n", ns, "apply", "-f", "-", input=json.dumps(claim))
            wait_for("the claim Bound", lambda: status("envclaim", "one").get("phase") == "Bound", timeout=60)
            wait_for("the fleet's status to count it", lambda: status("envfleet", "rbac").get("allocated") == 1)
            kubectl(cp, "-n", ns, "delete", "envclaim", "one", "--wait=true", "--timeout=60s")
            wait_for("the instance back (reset, or replaced)", lambda: status("envfleet", "rbac").get("allocated") == 0
                     and status("envfleet", "rbac").get("ready") == 2, timeout=90)
            kubectl(cp, "-n", ns, "delete", "envfleet", "rbac", "--wait=true", "--timeout=90s")
            wait_for("its pods gone", lambda: not names(cp, "pods", "awm.dev/fleet=rbac", namespace=ns), timeout=60)
    finally:
        run(helm, "uninstall", RELEASE, "--namespace", ns, "--wait", "--timeout", "120s", env=env, timeout=180)
        kubectl(cp, "delete", "namespace", ns, "--wait=false", check=False)


def test_operator_env_configures_campaigns(helm: str) -> None:
    """Campaign Jobs reach the allocation API at the operator's Service, and run the chart's
    trainer image unless the campaign names one (read by campaign_manifests.CampaignSettings)."""
    from awm_operator.campaign_manifests import CampaignSettings

    docs = render(helm, "imageRegistry=registry.example/awm", "trainer.image.pullPolicy=Always")
    c = one(docs, "Deployment", "awm-operator")["spec"]["template"]["spec"]["containers"][0]
    settings = CampaignSettings.from_env({e["name"]: e["value"] for e in c["env"] if "value" in e})
    svc = one(docs, "Service", "awm-operator")
    assert settings.operator_url == f"http://{svc['metadata']['name']}.awm-system.svc:{svc['spec']['ports'][0]['port']}"
    assert settings.trainer_image == "registry.example/awm/awm-trainer:0.1.0"
    assert settings.trainer_pull_policy == "Always"
    assert settings.image_for("evaluation") == settings.image_for("training")  # no evalImage: the trainer's
    # trainer.evalImage: evaluation campaigns get the image without torch, training keeps the trainer's.
    docs = render(helm, "imageRegistry=registry.example/awm", "trainer.evalImage.repository=awm-trainer-eval",
                  "trainer.evalImage.tag=0.1.0", "trainer.evalImage.pullPolicy=Never")
    c = one(docs, "Deployment", "awm-operator")["spec"]["template"]["spec"]["containers"][0]
    settings = CampaignSettings.from_env({e["name"]: e["value"] for e in c["env"] if "value" in e})
    assert settings.image_for("evaluation") == ("registry.example/awm/awm-trainer-eval:0.1.0", "Never")
    assert settings.image_for("training") == ("registry.example/awm/awm-trainer:0.1.0", "IfNotPresent")
