"""Env pods: the manifest of one instance's pod, and what the operator reads back from pods.

Pure functions (no API calls), so the pod contract of docs/kubernetes.md is unit-tested here:
names, labels, owner reference, init containers (bundle, provision), the env-server container
with its probes, and the non-root, read-only-root security context.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from awm import settings as awm_settings
from awm_operator.config import OperatorConfig
from awm_operator.crds import GROUP, VERSION, EnvFleetSpec
from awm_operator.databases import DEFAULT_SHARD

APP_NAME = "awm-envserver"
L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_FLEET = "awm.dev/fleet"
L_ENV = "awm.dev/environment"
L_SHARD = "awm.dev/db-shard"           # the Postgres shard its databases live on (databases.py)
A_ENV = "awm.dev/environment"          # the full environment name (labels are limited to 63 chars)
A_CONTROL_URL = "awm.dev/control-url"
A_MCP_URL = "awm.dev/mcp-url"
A_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

MCP_PORT, CONTROL_PORT = 8000, 8001
DSN_FILE = "/run/awm/instance.dsn"
BUNDLE_FILE = "/bundle/env.json"
UID = 10001  # the env-server image's user

_names = awm_settings.names  # the variables env servers and their init containers read (awm/settings.py)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else a readable, unique stand-in."""
    if _LABEL_VALUE.match(text):
        return text
    head = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:48].strip("-_.") or "x"
    return f"{head}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def dns_part(text: str, limit: int) -> str:
    """A DNS-1123 label fragment: lowercase alphanumerics and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")[:limit].strip("-") or "env"


def pod_prefix(fleet: str, env: str) -> str:
    """``<fleet>-<env>-``: generateName; the API server appends 5 random characters."""
    head = dns_part(fleet, 30)
    return f"{head}-{dns_part(env, 56 - len(head))}-"


def selector(fleet: str) -> str:
    return f"{L_NAME}={APP_NAME},{L_FLEET}={label_value(fleet)}"


def spread(replicas: int, environments: list[str], floors: Mapping[str, int] | None = None,
           current: Mapping[str, int] | None = None) -> dict[str, int]:
    """Instances per environment: each at least its floor (what it must hold: its allocated
    instances and what waiting claims ask of it), the rest filled in from the lowest up so the
    counts stay as even as possible; among equals the remainder goes to those that hold the most
    pods now (``current``: no pod is replaced by one of another environment for nothing), then
    to the first ones."""
    out = {env: (floors or {}).get(env, 0) for env in environments}
    have = current or {}
    left = replicas - sum(out.values())
    while left > 0 and out:
        low = min(out.values())
        lows = sorted((env for env in environments if out[env] == low), key=lambda e: -have.get(e, 0))
        step = min((v for v in out.values() if v > low), default=low + left) - low
        if step * len(lows) >= left:
            base, extra = divmod(left, len(lows))
            for i, env in enumerate(lows):
                out[env] += base + (1 if i < extra else 0)
            break
        for env in lows:
            out[env] += step
        left -= step * len(lows)
    return out


def pod_manifest(fleet: str, namespace: str, fleet_uid: str, spec: EnvFleetSpec, env: str,
                 cfg: OperatorConfig, shard: str = DEFAULT_SHARD, dsn_key: str = "dsn") -> dict[str, Any]:
    """One instance's pod: init containers fetch the bundle and provision the database (on
    ``shard``, whose admin DSN is key ``dsn_key`` of the fleet's Secret), then the env server runs
    from /bundle/env.json with its DSN in a file it alone reads."""
    t = spec.template
    image = t.image or cfg.envserver_image
    labels = {**(t.labels or {}), L_NAME: APP_NAME, L_INSTANCE: cfg.release,
              L_FLEET: label_value(fleet), L_ENV: label_value(env), L_SHARD: label_value(shard)}
    # Like Agones' game servers: a node drain or the cluster autoscaler would kill an episode in
    # flight (the operator scales fleets itself). A template may say "true" for cheaper nodes.
    annotations = {A_SAFE_TO_EVICT: "false", **(t.annotations or {}), A_ENV: env}
    if not cfg.endpoint_annotations:
        for key in (A_CONTROL_URL, A_MCP_URL):
            annotations.pop(key, None)
    pod_name = {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
    container_security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                          "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    bundle_mount = {"name": "bundle", "mountPath": "/bundle"}
    run_mount = {"name": "run", "mountPath": "/run/awm"}
    tmp_mount = {"name": "tmp", "mountPath": "/tmp"}
    # Init containers run one at a time before the server: a pod's request is the larger of theirs
    # and its containers' sum, so theirs stays below any sensible server request (a 50m one kept
    # a 2-CPU node at 40 env pods whatever the fleet asked for). They burst to their limit.
    small = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": pod_prefix(fleet, env), "namespace": namespace,
            "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "EnvFleet", "name": fleet,
                                 "uid": fleet_uid, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,  # thousands of Service env vars are of no use to tools
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 10,
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [
                _bundle_container(spec, env, cfg, image, container_security, bundle_mount, small),
                {
                    "name": "provision", "image": image, "imagePullPolicy": cfg.envserver_pull_policy,
                    "command": ["python", "-m", "awm.postgres.provision", "--bundle", BUNDLE_FILE,
                                "--name", "$(POD_NAME)", "--dsn-file", DSN_FILE],
                    "env": [
                        {"name": _names.AWM_ADMIN_DSN, "valueFrom": {"secretKeyRef": {
                            "name": spec.database.secret_name, "key": dsn_key}}},
                        pod_name,
                        {"name": _names.AWM_FLEET, "value": fleet},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    ],
                    "volumeMounts": [{**bundle_mount, "readOnly": True}, run_mount, tmp_mount],
                    "securityContext": container_security, "resources": small,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                },
            ],
            "containers": [{
                "name": "envserver", "image": image, "imagePullPolicy": cfg.envserver_pull_policy,
                "command": ["python", "-m", "awm.envserver", "--bundle", BUNDLE_FILE, "--name", "$(POD_NAME)",
                            "--host", "0.0.0.0", "--mcp-port", str(MCP_PORT), "--control-port", str(CONTROL_PORT)],
                "env": [pod_name, {"name": _names.AWM_INSTANCE_DSN_FILE, "value": DSN_FILE},
                        # Host names besides its pod IP (DNS-rebinding guard): any Service in its namespace.
                        {"name": _names.AWM_ALLOWED_HOSTS,
                         "value": f"*.{namespace}.svc,*.{namespace}.svc.cluster.local"}],
                "ports": [{"name": "mcp", "containerPort": MCP_PORT, "protocol": "TCP"},
                          {"name": "control", "containerPort": CONTROL_PORT, "protocol": "TCP"}],
                # Every second: a pod is Ready within a second of its server listening (a
                # 2 s period cost a second on average per start); the probe is one local GET.
                # An instance that stops answering leaves the pool after two failures.
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": "control"},
                                   "periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 2},
                # No startup probe: readiness is probed only after a startup probe has passed, on
                # the next period, which added a second to every start (measured: started 3.3 s,
                # Ready 4.1 s). Liveness instead tolerates 5 minutes of failures: dozens of pods
                # starting together on a small node take that long, and killing a slow start
                # starts it again. A server that hangs later is out of the pool at once (readiness)
                # and restarted after those 5 minutes; one that fails exits by itself.
                "livenessProbe": {"httpGet": {"path": "/healthz", "port": "control"},
                                  "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 30},
                "resources": t.resources or cfg.envserver_resources,
                "securityContext": container_security,
                "terminationMessagePolicy": "FallbackToLogsOnError",  # its last words, in the fleet's status
                "volumeMounts": [{**bundle_mount, "readOnly": True}, {**run_mount, "readOnly": True}, tmp_mount],
            }],
            "volumes": [
                {"name": "bundle", "emptyDir": {"sizeLimit": "64Mi"}},
                {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            ],
        },
    }
    runtime_class = t.runtime_class_name or cfg.envserver_runtime_class
    if spec.late:
        _late_binding(pod, fleet, namespace, spec, env, cfg, image, container_security, small)
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    pod["spec"]["containers"][0]["env"] += spec.serving.env()  # judge endpoint (+ key from a Secret), gates
    if spec.security.allow_weaker_isolation:  # said explicitly in the fleet: the env server accepts it
        pod["spec"]["containers"][0]["env"].append({"name": _names.AWM_ALLOW_WEAK_ISOLATION, "value": "1"})
    if t.node_selector:
        pod["spec"]["nodeSelector"] = t.node_selector
    if t.tolerations:
        pod["spec"]["tolerations"] = t.tolerations
    if cfg.image_pull_secrets:
        pod["spec"]["imagePullSecrets"] = cfg.image_pull_secrets
    return pod


# An abstract Unix socket name (awm.postgres.provisioner.socket_address): the pod's containers share
# its network namespace under runc and gVisor alike; a socket file in a shared volume is not shared
# under gVisor.
PROVISIONER_SOCKET = "@awm-provisioner"
CATALOG_DIR = "/bundle"


def _late_binding(pod: dict[str, Any], fleet: str, namespace: str, spec: EnvFleetSpec, env: str,
                  cfg: OperatorConfig, image: str, security: dict[str, Any], resources: dict[str, Any]) -> None:
    """A late-binding pod (``binding: late``): the whole catalog in /bundle instead of one bundle;
    instead of the provision init container, a provisioner sidecar (a native sidecar: an init
    container that keeps running) that holds the admin DSN and hands the env server a fresh
    database of each environment it is switched to, over an abstract Unix socket of the pod;
    the env server starts on ``env`` and switches on POST /bind."""
    inits = pod["spec"]["initContainers"]
    c = spec.catalog
    path = (c.path if c.image else cfg.catalog_path).rstrip("/")
    inits[0]["command"] = ["cp", "-r", f"{path}/.", CATALOG_DIR + "/"]
    provision = inits[1]
    meta = json.dumps({"pod": "$(POD_NAME)", "fleet": fleet, "namespace": namespace})
    inits[1] = {
        "name": "provisioner", "image": image, "imagePullPolicy": cfg.envserver_pull_policy,
        "restartPolicy": "Always",
        "command": ["python", "-m", "awm.postgres.provisioner", "--catalog", CATALOG_DIR,
                    "--socket", PROVISIONER_SOCKET, "--prefix", "$(POD_NAME)", "--meta", meta,
                    "--spares", str(spec.spare_databases)],
        "env": [e for e in provision["env"] if e["name"] in (_names.AWM_ADMIN_DSN, "POD_NAME")],
        "volumeMounts": [{"name": "bundle", "mountPath": CATALOG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": security, "resources": resources,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    server = pod["spec"]["containers"][0]
    server["command"] = ["python", "-m", "awm.envserver", "--catalog", CATALOG_DIR, "--env", env,
                         "--provisioner", PROVISIONER_SOCKET, "--cache-envs", str(spec.cache_environments),
                         "--name", "$(POD_NAME)", "--host", "0.0.0.0",
                         "--mcp-port", str(MCP_PORT), "--control-port", str(CONTROL_PORT)]
    server["env"] = [e for e in server["env"] if e["name"] != _names.AWM_INSTANCE_DSN_FILE]
    for volume in pod["spec"]["volumes"]:
        if volume["name"] == "bundle":
            volume["emptyDir"]["sizeLimit"] = "1Gi"  # a catalog, not one bundle


def _bundle_container(spec: EnvFleetSpec, env: str, cfg: OperatorConfig, envserver_image: str,
                      security: dict[str, Any], mount: dict[str, str], resources: dict[str, Any]) -> dict[str, Any]:
    """Copy ``<path>/<env>.json`` out of the catalog image (shared by every pod on the node), or
    download ``<url>/<env>.json`` with the env-server image's Python."""
    c = spec.catalog
    if c.url:
        script = ("import shutil, sys, urllib.parse, urllib.request\n"
                  "url = sys.argv[1].rstrip('/') + '/' + urllib.parse.quote(sys.argv[2]) + '.json'\n"
                  "with urllib.request.urlopen(url, timeout=60) as r, open(sys.argv[3], 'wb') as f:\n"
                  "    shutil.copyfileobj(r, f)\n")
        image, command = envserver_image, ["python", "-c", script, c.url, env, BUNDLE_FILE]
        policy = cfg.envserver_pull_policy
    else:
        image = c.image or cfg.catalog_image
        path = (c.path if c.image else cfg.catalog_path).rstrip("/")
        command = ["cp", f"{path}/{env}.json", BUNDLE_FILE]
        # a fleet's own catalog image: pulled if absent; the chart's: as catalog.image.pullPolicy says
        policy = "IfNotPresent" if c.image else cfg.catalog_pull_policy
    return {"name": "bundle", "image": image, "imagePullPolicy": policy, "command": command,
            "volumeMounts": [mount], "securityContext": security, "resources": resources,
            "terminationMessagePolicy": "FallbackToLogsOnError"}


# Waiting reasons that will not clear up by themselves (ContainerCreating, PodInitializing will).
STUCK = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError"}


def pod_problem(status: dict[str, Any]) -> str | None:
    """Why a pod that is not ready is stuck, from its containers' states: the first init or
    main container that waits for a reason that does not clear up by itself, or whose last run
    failed, with the reason and (FallbackToLogsOnError) the end of its output."""
    for c in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state, last = c.get("state") or {}, c.get("lastState") or {}
        waiting = state.get("waiting") or {}
        failed = state.get("terminated") or last.get("terminated") or {}
        if failed and failed.get("exitCode", 0) == 0:
            failed = {}
        if waiting.get("reason") in STUCK or failed:
            reason = waiting.get("reason") if waiting.get("reason") in STUCK else failed.get("reason") or "Error"
            words = (failed.get("message") or waiting.get("message") or "").strip().splitlines()
            return f"{c.get('name')}: {reason}" + (f": {words[-1][:200]}" if words else "")
    return None


def _int_rv(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


@dataclass
class PodInfo:
    """What the operator needs of a pod, parsed once per watch event. Which claim holds the pod
    is not on the pod: it is in the fleet's ledger (ledger.py)."""

    name: str
    env: str
    ready: bool                # the pod's Ready condition
    phase: str
    ip: str | None
    deleting: bool
    rv: int
    mcp_url: str | None
    control_url: str | None
    problem: str | None = None  # why it cannot start, e.g. "bundle: CrashLoopBackOff: cp: can't stat ..."
    shard: str = DEFAULT_SHARD  # the Postgres shard of its databases (pods of before shards: the default)

    @classmethod
    def from_pod(cls, pod: dict[str, Any]) -> "PodInfo":
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels, ann = meta.get("labels") or {}, meta.get("annotations") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        ip = status.get("podIP")
        return cls(
            name=meta["name"], env=ann.get(A_ENV) or labels.get(L_ENV, ""),
            ready=ready, phase=status.get("phase", "Pending"), ip=ip,
            deleting=bool(meta.get("deletionTimestamp")), rv=_int_rv(meta.get("resourceVersion")),
            mcp_url=ann.get(A_MCP_URL) or (f"http://{ip}:{MCP_PORT}/mcp" if ip else None),
            control_url=ann.get(A_CONTROL_URL) or (f"http://{ip}:{CONTROL_PORT}" if ip else None),
            problem=None if ready else pod_problem(status),
            shard=labels.get(L_SHARD) or DEFAULT_SHARD,
        )

    @property
    def failed(self) -> bool:
        """Exited for good (restartPolicy Always makes this rare: evictions, node loss)."""
        return self.phase in ("Failed", "Succeeded")

    @property
    def allocatable(self) -> bool:
        """Ready to serve episodes (whether a claim holds it is the fleet's business)."""
        return self.ready and not self.deleting and not self.failed and self.control_url is not None
