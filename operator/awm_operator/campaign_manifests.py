"""A campaign's children, as pure functions: the manifests the operator creates for a Campaign
(its EnvFleet, the ``awm train`` configuration, the Job, the trainer's access), the settings
they take from the operator's environment, and what a Job's status means for the campaign's
phase. No API calls: ``campaigns.py`` creates, follows and finishes; tests/test_campaign.py
checks these against the API server's schemas.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from awm import settings as awm_settings
from awm_operator import conditions
from awm_operator.config import OperatorConfig
from awm_operator.crds import GROUP, VERSION, CampaignSpec
from awm_operator.phases import CampaignPhase, CampaignReason
from awm_operator.pods import label_value

PLURAL = "campaigns"
APP_NAME = "awm-campaign"
L_NAME = "app.kubernetes.io/name"
L_COMPONENT = "app.kubernetes.io/component"
L_CAMPAIGN = "awm.dev/campaign"
L_CLIENT = "awm.dev/client"            # the env pods' NetworkPolicy admits pods with this label
A_CAMPAIGN = "awm.dev/campaign"        # the full name (label values stop at 63 characters)
JOB_SELECTOR = f"{L_NAME}={APP_NAME}"

# What the Job's container gets; awm.episode.allocation.OperatorSettings reads the same names.
ENV_OPERATOR_URL = awm_settings.names.AWM_OPERATOR_URL
ENV_NAMESPACE = awm_settings.names.AWM_NAMESPACE
ENV_FLEET = awm_settings.names.AWM_FLEET
ENV_CAMPAIGN = awm_settings.names.AWM_CAMPAIGN
_env = awm_settings.var  # the declarations (defaults included) of the variables CampaignSettings reads

CATALOG_DIR = "/campaign/catalog"
WEIGHTS_DIR = "/weights"  # the weight-sync path of a vLLM sidecar: an emptyDir both containers mount
CONFIG_DIR = "/etc/awm"
# Paths inside the Job's containers (never this machine's): the trainer's run directory and the
# vLLM sidecar's cache, both on the container's own /tmp (the images' scratch space).
POD_SCRATCH = "/tmp"
RUN_DIR = f"{POD_SCRATCH}/run"
VLLM_CACHE_DIR = f"{POD_SCRATCH}/vllm"
CONFIG_FILE = "train.yaml"
TRAINER_METRICS_PORT = 9400
UID = 10001  # the trainer image's user
NAME_LIMIT = 52  # Job names end up in pod labels (63 characters) with a suffix



# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class CampaignSettings:
    """Campaign settings from the operator's environment (the chart sets them). Kept out of
    OperatorConfig: nothing but campaigns needs them."""

    operator_url: str | None = _env.AWM_OPERATOR_URL.default  # the allocation API as the Job's pod sees it
    trainer_image: str = _env.AWM_TRAINER_IMAGE.default
    trainer_pull_policy: str = _env.AWM_TRAINER_IMAGE_PULL_POLICY.default
    eval_image: str | None = _env.AWM_EVAL_IMAGE.default  # evaluations' image (no torch); unset: trainer_image
    eval_pull_policy: str | None = _env.AWM_EVAL_IMAGE_PULL_POLICY.default
    status_interval: float = _env.AWM_CAMPAIGN_STATUS_INTERVAL.default  # progress -> status patches at most this often

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "CampaignSettings":
        return cls(operator_url=_env.AWM_OPERATOR_URL.get(env),
                   trainer_image=_env.AWM_TRAINER_IMAGE.get(env),
                   trainer_pull_policy=_env.AWM_TRAINER_IMAGE_PULL_POLICY.get(env),
                   eval_image=_env.AWM_EVAL_IMAGE.get(env),
                   eval_pull_policy=_env.AWM_EVAL_IMAGE_PULL_POLICY.get(env),
                   status_interval=_env.AWM_CAMPAIGN_STATUS_INTERVAL.get(env))

    def image_for(self, mode: str) -> tuple[str, str]:
        """(image, pull policy) of a campaign's Job unless its spec names one. An evaluation of an
        endpoint needs no torch, so it gets the evaluation image when the chart names one (a
        fraction of the trainer image's size: a faster pull on every node a Job lands on)."""
        if mode == "evaluation" and self.eval_image:
            return self.eval_image, self.eval_pull_policy or self.trainer_pull_policy
        return self.trainer_image, self.trainer_pull_policy


# --------------------------------------------------------------------------- manifests (pure)


def child_name(campaign: str, suffix: str = "") -> str:
    """``<campaign><suffix>``, shortened with a hash of the whole when it would not fit."""
    name = f"{campaign}{suffix}"
    if len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{campaign[:NAME_LIMIT - len(suffix) - 9].rstrip('-.')}-{digest}{suffix}"


@dataclass(frozen=True)
class Names:
    """The children of one campaign. The fleet and the Job share the campaign's name (they are
    different kinds); the ConfigMap is suffixed so it never meets the fleet's own ConfigMaps."""

    fleet: str
    job: str
    config: str
    account: str  # the Job's ServiceAccount, Role and RoleBinding (its access to the allocation API)
    workers: str  # the headless Service a learner on several nodes meets through

    @classmethod
    def of(cls, campaign: str) -> "Names":
        return cls(fleet=child_name(campaign), job=child_name(campaign), config=child_name(campaign, "-train-config"),
                   account=child_name(campaign, "-trainer"), workers=child_name(campaign, "-workers"))


def trainer_access(campaign: str, namespace: str, uid: str) -> list[tuple[str, dict[str, Any]]]:
    """The Job's identity for the operator's API (auth.py): a ServiceAccount whose Role allows
    exactly what a campaign's trainer does - claim, read, renew and release instances, and report
    progress - in the campaign's namespace. (collection, manifest) pairs, all owned by the campaign."""
    name = Names.of(campaign).account
    meta = {"name": name, "namespace": namespace, "labels": labels(campaign, "trainer"),
            "annotations": {A_CAMPAIGN: campaign}, "ownerReferences": [owner_reference(campaign, uid)]}
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    return [
        (f"/api/v1/namespaces/{namespace}/serviceaccounts",
         {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}),
        (f"{rbac}/roles", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [
            {"apiGroups": [GROUP], "resources": ["envclaims"], "verbs": ["create", "get", "update", "delete"]},
            {"apiGroups": [GROUP], "resources": ["campaigns/status"], "verbs": ["update"],
             "resourceNames": [campaign]}]}),
        (f"{rbac}/rolebindings", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
                                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                                  "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}),
    ]


def owner_reference(campaign: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Campaign", "name": campaign, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def labels(campaign: str, mode: str) -> dict[str, str]:
    return {L_NAME: APP_NAME, L_COMPONENT: mode, L_CAMPAIGN: label_value(campaign)}


def fleet_manifest(campaign: str, namespace: str, uid: str, spec: CampaignSpec) -> dict[str, Any]:
    """The campaign's EnvFleet: autoscaled, with the whole demand as its warm buffer (the Job's
    claims then bind at once instead of waiting for pods to start) and as its ceiling."""
    demand = spec.instances
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "EnvFleet",
        "metadata": {"name": Names.of(campaign).fleet, "namespace": namespace,
                     "labels": labels(campaign, spec.mode), "annotations": {A_CAMPAIGN: campaign},
                     "ownerReferences": [owner_reference(campaign, uid)]},
        "spec": {"environments": list(spec.environments), "replicas": demand, "buffer": demand,
                 "binding": "late" if spec.late else "pinned",
                 "minReplicas": 0, "maxReplicas": demand, "autoscale": True,
                 "catalog": spec.catalog.model_dump(by_alias=True, exclude_none=True),
                 "database": spec.database.model_dump(by_alias=True, exclude_none=True),
                 "template": spec.fleet_template.model_dump(by_alias=True, exclude_none=True),
                 "serving": spec.serving.model_dump(by_alias=True, exclude_none=True),
                 **({"cacheEnvironments": spec.cache_environments} if spec.cache_environments else {})},
    }


def train_config(spec: CampaignSpec) -> dict[str, Any]:
    """The ``awm train`` configuration of a training campaign: the spec's inline config, with
    what the campaign decides put in (the Job's catalog copy, the environments, instances per
    environment, the GRPO group size) so the trainer claims exactly what the fleet holds."""
    assert spec.training is not None
    cfg = copy.deepcopy(spec.training.config)
    cfg["catalog"] = CATALOG_DIR
    cfg["envs"] = list(spec.environments)
    rollout = dict(cfg.get("rollout") or {})
    rollout["group_size"] = spec.training.group_size
    if spec.concurrent_groups is not None:  # late binding: a claim per group, of its environment
        cfg["instances"] = spec.instances
        cfg.pop("replicas", None)
        rollout.setdefault("max_inflight_groups", spec.concurrent_groups)
    else:
        cfg["replicas"] = spec.instances_per_environment
        rollout.setdefault("max_inflight_groups", spec.groups_per_environment * len(spec.environments))
    cfg["rollout"] = rollout
    cfg["allow_ungated"] = spec.serving.allow_ungated  # the trainer picks tasks as the fleet serves them
    cfg["verifier_kind"] = spec.serving.verifier_kind
    cfg.setdefault("run_dir", RUN_DIR)
    cfg.setdefault("metrics_port", TRAINER_METRICS_PORT)  # scraped through the pod's annotations
    cfg.setdefault("metrics_host", "0.0.0.0")
    if spec.training.learner.processes > 1:
        cfg["learner"] = {**(cfg.get("learner") or {}), "distributed": True}
    if spec.training.vllm is not None:  # the server beside the trainer, weights through the shared emptyDir
        policy = dict(cfg.get("policy") or {})
        policy["base_url"] = f"http://127.0.0.1:{spec.training.vllm.port}/v1"
        policy.setdefault("sync_dir", WEIGHTS_DIR)
        cfg["policy"] = policy
    return cfg


def torchrun_args(campaign: str, spec: CampaignSpec) -> list[str]:
    """``torchrun`` before ``awm train`` when the learner has several processes (none otherwise):
    one pod standalone; several pods meet at the first (``<job>-0.<workers service>``), each
    pod's node rank its Job completion index."""
    assert spec.training is not None
    learner = spec.training.learner
    if learner.processes == 1:
        return []
    names = Names.of(campaign)
    if learner.nodes == 1:
        rendezvous = ["--standalone"]
    else:
        rendezvous = ["--nnodes", str(learner.nodes), "--node-rank", "$(NODE_RANK)",
                      "--master-addr", f"{names.job}-0.{names.workers}", "--master-port", str(learner.port)]
    return ["torchrun", *rendezvous, "--nproc-per-node", str(learner.processes_per_node), "--no-python"]


def workers_service_manifest(campaign: str, namespace: str, uid: str, spec: CampaignSpec) -> dict[str, Any]:
    """The headless Service that gives a multi-node learner's pods their DNS names (the Job's
    pods set it as their subdomain); addresses are published before the pods are ready, since
    torchrun's rendezvous comes first."""
    names = Names.of(campaign)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": names.workers, "namespace": namespace, "labels": labels(campaign, spec.mode),
                     "annotations": {A_CAMPAIGN: campaign}, "ownerReferences": [owner_reference(campaign, uid)]},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {"batch.kubernetes.io/job-name": names.job}},
    }


def vllm_sidecar(spec: CampaignSpec, security: dict[str, Any], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """The vLLM server as a native sidecar (an init container that keeps running): the trainer
    starts once its /health answers and the Job ends when the trainer does. Its flags are what
    the policy's weight sync relies on (the same as trainer/vllm_server.py gives a local server)."""
    assert spec.training is not None and spec.training.vllm is not None
    sidecar, policy = spec.training.vllm, spec.training.config.get("policy") or {}
    args = ["--model", str(policy.get("path") or ""), "--served-model-name", str(policy.get("served_model") or "policy"),
            "--host", "127.0.0.1", "--port", str(sidecar.port), "--enable-auto-tool-choice",
            "--tool-call-parser", "hermes", "--logprobs-mode", "processed_logprobs"]
    if policy.get("weight_sync", "lora") == "lora":
        rank = int((policy.get("lora") or {}).get("rank") or 16)
        args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "2"]
    env = [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}, {"name": "VLLM_SERVER_DEV_MODE", "value": "1"},
           {"name": "HF_HUB_OFFLINE", "value": "1"}, {"name": "HOME", "value": POD_SCRATCH},
           {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_DIR}, {"name": "VLLM_NO_USAGE_STATS", "value": "1"}]
    # Bound to 127.0.0.1 (its reload and adapter endpoints are for the trainer beside it only), so
    # the kubelet, which probes the pod's IP, checks /health from inside the container.
    health = {"exec": {"command": ["python3", "-c", "import urllib.request; urllib.request.urlopen("
                                   f"'http://127.0.0.1:{sidecar.port}/health', timeout=5)"]}, "timeoutSeconds": 10}
    return {"name": "vllm", "image": sidecar.image, "restartPolicy": "Always",
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"], "args": args + list(sidecar.args or []),
            "env": env + list(sidecar.env or []), "resources": sidecar.resources or {},
            "securityContext": security, "volumeMounts": mounts,
            "startupProbe": {**health, "periodSeconds": 5, "failureThreshold": 360},  # up to 30 min to load
            "livenessProbe": {**health, "periodSeconds": 30, "failureThreshold": 4}}


def config_map_manifest(campaign: str, namespace: str, uid: str, spec: CampaignSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": Names.of(campaign).config, "namespace": namespace,
                     "labels": labels(campaign, spec.mode), "annotations": {A_CAMPAIGN: campaign},
                     "ownerReferences": [owner_reference(campaign, uid)]},
        "data": {CONFIG_FILE: yaml.safe_dump(train_config(spec), sort_keys=False)},
    }


def eval_args(spec: CampaignSpec) -> list[str]:
    """``awm eval`` arguments of an evaluation campaign (``--replicas``: instances claimed per
    environment, which bounds how many tasks run at once)."""
    ev = spec.evaluation
    assert ev is not None
    args = ["eval", "--base-url", ev.base_url, "--model", ev.model, "--catalog", CATALOG_DIR,
            "-k", str(ev.k), *(["--instances", str(spec.instances)] if spec.late else
                               ["--replicas", str(spec.instances_per_environment)]), "--max-turns", str(ev.max_turns),
            "--tool-format", ev.tool_format, "--temperature", str(ev.temperature), "--out", ev.output]
    for env in spec.environments:
        args += ["--env", env]
    for task in ev.tasks or []:
        args += ["--task", task]
    if spec.serving.allow_ungated:
        args.append("--allow-ungated")
    if spec.serving.verifier_kind:
        args += ["--verifier-kind", spec.serving.verifier_kind]
    return args


def _catalog_container(spec: CampaignSpec, cfg: OperatorConfig, image: str, pull_policy: str,
                       security: dict[str, Any]) -> dict[str, Any]:
    """Copy the campaign's bundles into the pod (the trainer reads tasks and scenarios from
    them): out of the catalog image like env pods do, or downloaded from ``catalog.url``."""
    c = spec.catalog
    if c.url:
        script = ("import shutil, sys, urllib.parse, urllib.request\n"
                  "base, out = sys.argv[1].rstrip('/'), sys.argv[2]\n"
                  "for env in sys.argv[3:]:\n"
                  "    url = base + '/' + urllib.parse.quote(env) + '.json'\n"
                  "    with urllib.request.urlopen(url, timeout=60) as r, open(f'{out}/{env}.json', 'wb') as f:\n"
                  "        shutil.copyfileobj(r, f)\n")
        cat_image, policy, command = image, pull_policy, ["python", "-c", script, c.url, CATALOG_DIR,
                                                          *spec.environments]
    else:
        cat_image = c.image or cfg.catalog_image
        path = (c.path if c.image else cfg.catalog_path).rstrip("/")
        policy, command = "IfNotPresent", ["cp", *(f"{path}/{env}.json" for env in spec.environments), f"{CATALOG_DIR}/"]
    return {"name": "catalog", "image": cat_image, "imagePullPolicy": policy, "command": command,
            "volumeMounts": [{"name": "catalog", "mountPath": CATALOG_DIR}], "securityContext": security,
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}}


def job_manifest(campaign: str, namespace: str, uid: str, spec: CampaignSpec, cfg: OperatorConfig,
                 settings: CampaignSettings, operator_url: str) -> dict[str, Any]:
    """The Job running the trainer or evaluator. Its pod is labelled ``awm.dev/client`` (the env
    pods' NetworkPolicy lets it in), runs as the campaign's ServiceAccount (its token is its
    credential for the operator's API; the account may do nothing else: trainer_access), runs
    non-root on a read-only root filesystem, and gets the campaign's bundles from an init container."""
    j, names = spec.job, Names.of(campaign)
    default_image, default_pull_policy = settings.image_for(spec.mode)
    image = j.image or default_image
    pull_policy = j.image_pull_policy or default_pull_policy
    security = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                "capabilities": {"drop": ["ALL"]}}
    env: list[dict[str, Any]] = [
        {"name": ENV_OPERATOR_URL, "value": operator_url},
        {"name": ENV_NAMESPACE, "value": namespace},
        {"name": ENV_FLEET, "value": names.fleet},
        {"name": ENV_CAMPAIGN, "value": campaign},
    ]
    volumes: list[dict[str, Any]] = [{"name": "catalog", "emptyDir": {"sizeLimit": "1Gi"}},
                                     {"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "catalog", "mountPath": CATALOG_DIR, "readOnly": True},
                                    {"name": "tmp", "mountPath": "/tmp"}]
    scrape: dict[str, str] = {}
    ports: list[dict[str, Any]] = []
    launcher: list[str] = []
    if spec.mode == "training":
        args = ["train", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"]
        launcher = torchrun_args(campaign, spec)
        port = int(train_config(spec)["metrics_port"] or 0)
        if port:
            scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}
            ports = [{"name": "metrics", "containerPort": port}]
        volumes.append({"name": "config", "configMap": {"name": names.config}})
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        if spec.training is not None and spec.training.vllm is not None:
            volumes.append({"name": "weights", "emptyDir": {}})
            mounts.append({"name": "weights", "mountPath": WEIGHTS_DIR})
        if spec.training is not None and spec.training.learner.nodes > 1:  # torchrun's --node-rank
            env.append({"name": "NODE_RANK", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}})
    elif spec.mode == "external":
        args = []  # the user's command, with its own args (job.command, job.args)
    else:
        args = eval_args(spec)
        ev = spec.evaluation
        if ev is not None and ev.api_key_secret is not None:
            env.append({"name": awm_settings.names.AWM_POLICY_API_KEY, "valueFrom": {"secretKeyRef": {
                "name": ev.api_key_secret.name, "key": ev.api_key_secret.key}}})
    container: dict[str, Any] = {
        "name": {"training": "trainer", "evaluation": "evaluator"}.get(spec.mode, "external"),
        "image": image, "imagePullPolicy": pull_policy,
        "command": j.command or (launcher + ["awm"] if launcher else ["awm"]),
        "args": j.args if j.args is not None else args,
        "env": env + list(j.env or []),
        "resources": j.resources or {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}},
        "securityContext": security,
        "volumeMounts": mounts + list(j.volume_mounts or []),
    }
    if ports:
        container["ports"] = ports
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # Its ServiceAccount token is its credential for the operator's API (trainer_access).
        "automountServiceAccountToken": True,
        "serviceAccountName": j.service_account_name or names.account,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [_catalog_container(spec, cfg, image, pull_policy, security)] + (
            [vllm_sidecar(spec, security, [{"name": "tmp", "mountPath": "/tmp"}, {"name": "weights", "mountPath": WEIGHTS_DIR},
                                           *(j.volume_mounts or [])])]
            if spec.training is not None and spec.training.vllm is not None else []),
        "containers": [container],
        "volumes": volumes + list(j.volumes or []),
    }
    if j.node_selector:
        pod_spec["nodeSelector"] = j.node_selector
    if j.tolerations:
        pod_spec["tolerations"] = j.tolerations
    if cfg.image_pull_secrets:
        pod_spec["imagePullSecrets"] = cfg.image_pull_secrets
    job_labels = labels(campaign, spec.mode)
    template_meta: dict[str, Any] = {"labels": {**(j.labels or {}), **job_labels, L_CLIENT: "true"},
                                     "annotations": {**scrape, **(j.annotations or {}), A_CAMPAIGN: campaign}}
    job_spec: dict[str, Any] = {"backoffLimit": j.backoff_limit,
                                "template": {"metadata": template_meta, "spec": pod_spec}}
    nodes = spec.training.learner.nodes if spec.training is not None else 1
    if nodes > 1:  # one pod per node, named <job>-<index>.<workers> (torchrun meets at index 0)
        job_spec.update({"completionMode": "Indexed", "completions": nodes, "parallelism": nodes})
        pod_spec["subdomain"] = names.workers
    if j.active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = j.active_deadline_seconds
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": names.job, "namespace": namespace, "labels": job_labels,
                     "annotations": {A_CAMPAIGN: campaign}, "ownerReferences": [owner_reference(campaign, uid)]},
        "spec": job_spec,
    }


# --------------------------------------------------------------------------- Job -> phase (pure)


@dataclass(frozen=True)
class JobState:
    phase: CampaignPhase
    reason: str  # a CampaignReason, or the Job's own
    message: str
    started_at: str | None = None
    finished_at: str | None = None


def job_state(job: dict[str, Any]) -> JobState:
    """The campaign phase a Job's status means. Only the Job's final conditions (Complete,
    Failed) end a campaign: FailureTarget and SuccessCriteriaMet come while pods may still be
    terminating. Running needs a ready pod, so pulling a large image still reads Pending."""
    status = job.get("status") or {}
    started = status.get("startTime")
    true = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in true:
        c = true["Complete"]
        return JobState(CampaignPhase.SUCCEEDED, c.get("reason") or CampaignReason.COMPLETED,
                        c.get("message") or "the Job completed",
                        started, status.get("completionTime") or c.get("lastTransitionTime") or conditions.now())
    if "Failed" in true:
        c = true["Failed"]
        reason = c.get("reason") or CampaignReason.JOB_FAILED
        return JobState(CampaignPhase.FAILED, reason, c.get("message") or f"the Job failed ({reason})", started,
                        c.get("lastTransitionTime") or conditions.now())
    if (status.get("ready") or 0) > 0:
        return JobState(CampaignPhase.RUNNING, CampaignReason.POD_READY, "the Job's pod is running", started)
    return JobState(CampaignPhase.PENDING, CampaignReason.WAITING, "waiting for the Job's pod", started)


def owning_campaign(obj: dict[str, Any]) -> str | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Campaign" and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return str(ref["name"])
    return None
