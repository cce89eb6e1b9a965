"""Campaigns, the pure parts: the Campaign spec's rules, the manifests the operator creates (the
EnvFleet, the training config, the Job), how a Job's status maps to the campaign's phase, the
progress API's coalescing of status writes, and the trainer's side of the contract (the Job's
environment read by trainer/k8s_source.py, the Job's arguments parsed by the real `awm` CLI).

On a real control plane: test_campaign_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer
import yaml
from pydantic import ValidationError

from awm_operator import campaign_manifests as cm
from awm_operator import campaigns as cp
from awm_operator.config import OperatorConfig
from awm_operator.crds import MAX_REPLICAS, CampaignSpec, CampaignStatus, definitions
from awm_operator.kube import ApiError
from awm_operator.metrics import Metrics
from awm.trainer.config import TrainConfig
from awm.trainer.k8s_source import KubernetesSettings, ProgressReporter

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "charts" / "awm" / "examples"


def training(**extra: Any) -> CampaignSpec:
    return CampaignSpec.model_validate({
        "mode": "training", "environments": ["crm", "bike_shop"], "groupsPerEnvironment": 2,
        "catalog": {}, "database": {"secretName": "awm-database"},
        "training": {"groupSize": 8, "config": {"steps": 50, "rollout": {"max_staleness": 2, "group_size": 3},
                                                "policy": {"kind": "tiny"}, "catalog": "ignored"}},
        **extra})


def evaluation(**extra: Any) -> CampaignSpec:
    return CampaignSpec.model_validate({
        "mode": "evaluation", "environments": ["crm"], "catalog": {"url": "http://store/cat"},
        "database": {"secretName": "db"},
        "evaluation": {"baseUrl": "http://vllm:8000/v1", "model": "qwen", "k": 4, "tasks": ["t1", "t2"],
                       "apiKeySecret": {"name": "llm", "key": "token"}},
        **extra})


# --------------------------------------------------------------------------- the spec


def test_spec_sizes_the_fleet_from_groups() -> None:
    spec = training()
    assert (spec.group_size, spec.instances_per_environment, spec.instances) == (8, 16, 32)
    assert evaluation().instances == 4  # k instances: one task's samples at once
    assert spec.cleanup.delete_fleet is True and spec.job.backoff_limit == 0


@pytest.mark.parametrize("change, message", [
    ({"mode": "evaluation"}, "mode evaluation needs spec.evaluation"),
    ({"evaluation": {"baseUrl": "http://x/v1", "model": "m"}}, "no spec.evaluation"),
    ({"groupsPerEnvironment": MAX_REPLICAS // 16 + 1}, f"at most {MAX_REPLICAS}"),
    ({"environments": []}, "at least 1"),
    ({"job": {"backoffLimit": -1}}, "greater than or equal to 0"),
    ({"bogus": 1}, "Extra inputs are not permitted"),
])
def test_spec_rejects_impossible_campaigns(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        training(**change)


def test_crd_carries_the_rules_the_api_server_checks() -> None:
    crd = next(c for c in definitions() if c["spec"]["names"]["kind"] == "Campaign")
    version = crd["spec"]["versions"][0]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("self.environments.size() * self.groupsPerEnvironment" in r and str(MAX_REPLICAS) in r for r in rules)
    assert spec["properties"]["training"]["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Mode", "Phase", "Step", "Reward", "Fleet", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["passRates"]["additionalProperties"] == {"type": "number"}
    assert status["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed"]


def test_qwen3_campaign_examples_split_gpus_between_vllm_and_a_sharded_learner() -> None:
    """The Qwen3-4B examples as the operator renders them: one node (vLLM sidecar + 4 learner
    processes) and two nodes (an Indexed Job of 16 processes, vLLM a Deployment elsewhere);
    each one's `awm train` config is accepted by the trainer's own parser."""
    one = CampaignSpec.model_validate(yaml.safe_load((EXAMPLES / "campaign-qwen3-4b-8gpu.yaml").read_text())["spec"])
    assert one.training is not None and one.training.vllm is not None and one.training.learner.processes == 4
    gpus = int(one.job.resources["limits"]["nvidia.com/gpu"]) + int(one.training.vllm.resources["limits"]["nvidia.com/gpu"])
    assert gpus == 8
    cfg = TrainConfig.from_dict(cm.train_config(one))
    assert cfg.learner.distributed and cfg.policy.base_url == "http://127.0.0.1:8000/v1"
    assert cfg.policy.sync_dir == cm.WEIGHTS_DIR and cfg.policy.path == "/models/Qwen3-4B"
    pod = cm.job_manifest("q", "rl", "u", one, OperatorConfig(), cm.CampaignSettings(), "http://op:8080")["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    assert trainer["command"] == ["torchrun", "--standalone", "--nproc-per-node", "4", "--no-python", "awm"]
    vllm = pod["initContainers"][1]
    assert vllm["restartPolicy"] == "Always" and "127.0.0.1:8000/health" in vllm["startupProbe"]["exec"]["command"][-1]
    assert vllm["args"][vllm["args"].index("--host") + 1] == "127.0.0.1"  # the reload endpoints stay in the pod
    assert vllm["args"][:4] == ["--model", "/models/Qwen3-4B", "--served-model-name", "policy"]
    assert "--enable-lora" in vllm["args"] and vllm["args"][vllm["args"].index("--max-lora-rank") + 1] == "32"
    shared = {m["mountPath"] for m in trainer["volumeMounts"]} & {m["mountPath"] for m in vllm["volumeMounts"]}
    assert {cm.WEIGHTS_DIR, "/models"} <= shared  # the weight-sync path and the model, at the same paths

    two = CampaignSpec.model_validate(yaml.safe_load((EXAMPLES / "campaign-qwen3-4b-nodes.yaml").read_text())["spec"])
    assert two.training is not None and two.training.vllm is None and two.training.learner.processes == 16
    cfg = TrainConfig.from_dict(cm.train_config(two))
    assert cfg.learner.distributed and cfg.policy.weight_sync == "full" and cfg.policy.sync_dir.startswith("/shared/")
    job = cm.job_manifest("q", "rl", "u", two, OperatorConfig(), cm.CampaignSettings(), "http://op:8080")
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == "q-workers" and len(pod["initContainers"]) == 1
    (trainer,) = pod["containers"]
    assert trainer["command"] == ["torchrun", "--nnodes", "2", "--node-rank", "$(NODE_RANK)", "--master-addr",
                                  "q-0.q-workers", "--master-port", "29500", "--nproc-per-node", "8", "--no-python", "awm"]
    assert container_env(job)["NODE_RANK"]["fieldRef"]["fieldPath"].endswith("['batch.kubernetes.io/job-completion-index']")
    service = cm.workers_service_manifest("q", "rl", "u", two)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": "q"}
    assert trainer["args"] == ["train", "--config", "/etc/awm/train.yaml"]  # awm's arguments after torchrun's


@pytest.mark.parametrize("change, message", [
    ({"learner": {"nodes": 2}, "vllm": {"image": "v"}}, "with several nodes run vLLM as its own Deployment"),
    ({"vllm": {"image": "v"}}, "policy.kind vllm"),
    ({"learner": {"processesPerNode": 0}}, "greater than or equal to 1"),
])
def test_training_processes_and_sidecar_rules(change: dict[str, Any], message: str) -> None:
    base = training().training.model_dump(by_alias=True)
    with pytest.raises(ValidationError, match=message):
        training(training={**base, **change})


def test_single_process_training_has_no_launcher() -> None:
    spec = training()
    pod = cm.job_manifest("r", "rl", "u", spec, OperatorConfig(), cm.CampaignSettings(), "http://op")["spec"]["template"]["spec"]
    assert pod["containers"][0]["command"] == ["awm"] and "subdomain" not in pod
    assert "learner" not in cm.train_config(spec)


def test_examples_are_valid_campaigns() -> None:
    for name, mode in (("campaign-training.yaml", "training"), ("campaign-evaluation.yaml", "evaluation")):
        doc = yaml.safe_load((EXAMPLES / name).read_text())
        assert doc["apiVersion"] == "awm.dev/v1alpha1" and doc["kind"] == "Campaign"
        spec = CampaignSpec.model_validate(doc["spec"])
        assert spec.mode == mode and spec.database.secret_name == "awm-database"
    gpu = CampaignSpec.model_validate(yaml.safe_load((EXAMPLES / "campaign-training.yaml").read_text())["spec"])
    assert gpu.job.resources and "nvidia.com/gpu" in gpu.job.resources["limits"]
    TrainConfig.from_dict(cm.train_config(gpu))  # its inline config is one `awm train` accepts


# --------------------------------------------------------------------------- manifests


def test_fleet_manifest_is_owned_autoscaled_and_sized_to_demand() -> None:
    spec = training(fleetTemplate={"annotations": {"awm.dev/control-url": "http://x"}, "resources": {"limits": {"cpu": "2"}}})
    fleet = cm.fleet_manifest("run-1", "rl", "uid-1", spec)
    assert fleet["metadata"]["name"] == "run-1" and fleet["metadata"]["namespace"] == "rl"
    assert fleet["metadata"]["ownerReferences"] == [{"apiVersion": "awm.dev/v1alpha1", "kind": "Campaign", "name": "run-1",
                                                     "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    s = fleet["spec"]
    assert (s["replicas"], s["buffer"], s["maxReplicas"], s["minReplicas"], s["autoscale"]) == (32, 32, 32, 0, True)
    assert s["environments"] == ["crm", "bike_shop"] and s["database"] == {"secretName": "awm-database"}
    assert s["template"] == {"resources": {"limits": {"cpu": "2"}}, "annotations": {"awm.dev/control-url": "http://x"}}
    from awm_operator.crds import EnvFleetSpec
    EnvFleetSpec.model_validate(s)  # what the EnvFleet CRD and the operator accept


def test_train_config_is_what_the_fleet_holds() -> None:
    spec = training()
    cfg = cm.train_config(spec)
    assert cfg["catalog"] == cm.CATALOG_DIR and cfg["envs"] == ["crm", "bike_shop"] and cfg["replicas"] == 16
    assert cfg["rollout"] == {"max_staleness": 2, "group_size": 8, "max_inflight_groups": 4}
    assert cfg["steps"] == 50 and cfg["run_dir"] == "/tmp/run"
    assert spec.training is not None and spec.training.config["rollout"]["group_size"] == 3  # the spec is untouched
    config_map = cm.config_map_manifest("run-1", "rl", "uid-1", spec)
    assert config_map["metadata"]["name"] == "run-1-train-config" and \
        config_map["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    parsed = TrainConfig.from_dict(yaml.safe_load(config_map["data"][cm.CONFIG_FILE]))  # the trainer's own parser
    assert (parsed.catalog, parsed.replicas, parsed.rollout.group_size) == (cm.CATALOG_DIR, 16, 8)


def container_env(job: dict[str, Any]) -> dict[str, Any]:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_training_job_manifest() -> None:
    spec = training(job={"image": "reg/awm-trainer:2", "resources": {"limits": {"nvidia.com/gpu": 1}},
                         "nodeSelector": {"gpu": "a100"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
                         "backoffLimit": 2, "env": [{"name": "HF_HOME", "value": "/models"}],
                         "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "m"}}],
                         "volumeMounts": [{"name": "models", "mountPath": "/models"}], "labels": {"team": "rl"}})
    cfg = OperatorConfig(image_pull_secrets=[{"name": "regcred"}])
    settings = cm.CampaignSettings(trainer_image="default/trainer:1")
    job = cm.job_manifest("run-1", "rl", "uid-1", spec, cfg, settings, "http://awm-operator.awm.svc:8080")
    meta, js = job["metadata"], job["spec"]
    assert (job["apiVersion"], job["kind"], meta["name"]) == ("batch/v1", "Job", "run-1")
    assert meta["ownerReferences"][0]["kind"] == "Campaign" and meta["labels"]["app.kubernetes.io/name"] == "awm-campaign"
    assert cm.owning_campaign(job) == "run-1"
    assert js["backoffLimit"] == 2
    pod = js["template"]["spec"]
    assert js["template"]["metadata"]["labels"]["awm.dev/client"] == "true"  # let in by the env pods' NetworkPolicy
    assert js["template"]["metadata"]["labels"]["team"] == "rl"
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is True  # its API credential
    assert pod["securityContext"]["runAsNonRoot"] and pod["nodeSelector"] == {"gpu": "a100"}
    assert pod["tolerations"][0]["key"] == "gpu" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = pod["containers"]
    assert c["image"] == "reg/awm-trainer:2" and c["command"] == ["awm"]
    assert c["args"] == ["train", "--config", "/etc/awm/train.yaml"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {cm.CATALOG_DIR: "catalog", "/tmp": "tmp", "/etc/awm": "config", "/models": "models"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == "run-1-train-config" and "persistentVolumeClaim" in volumes["models"]
    (init,) = pod["initContainers"]
    assert init["image"] == cfg.catalog_image
    assert init["command"] == ["cp", "/catalog/crm.json", "/catalog/bike_shop.json", f"{cm.CATALOG_DIR}/"]
    env = container_env(job)
    assert env["HF_HOME"] == "/models"
    # The trainer reads exactly these variables.
    settings_seen = KubernetesSettings.from_env({k: v for k, v in env.items() if isinstance(v, str)})
    assert settings_seen == KubernetesSettings("http://awm-operator.awm.svc:8080", "rl", "run-1", "run-1")
    assert KubernetesSettings.from_env({}) is None  # outside a campaign: a local fleet
    # Prometheus scrapes the trainer's metrics through the pod's annotations.
    annotations = js["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9400"
    assert c["ports"] == [{"name": "metrics", "containerPort": 9400}]
    parsed = TrainConfig.from_dict(yaml.safe_load(cm.config_map_manifest("run-1", "rl", "u", spec)["data"][cm.CONFIG_FILE]))
    assert (parsed.metrics_port, parsed.metrics_host) == (9400, "0.0.0.0")


async def test_a_failed_progress_report_is_retried_with_the_newest_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator that fails (restarting, overloaded): nothing reported is lost, newer numbers
    win, and closing the reporter retries until the status has them."""
    bodies: list[dict[str, Any]] = []
    answers = iter([500, 500, 202, 202])

    def handle(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(next(answers), json={})

    monkeypatch.setattr(ProgressReporter, "close_retries", (0.01,) * 5)
    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    reporter = ProgressReporter(KubernetesSettings("http://op:8080", "rl", "f", "c"), client)
    reporter.report(step=1, reward_mean=0.1, pass_rates={"crm": 0.5})
    await reporter.flush()
    reporter.report(step=2, reward_mean=0.2)
    await reporter.flush()
    assert reporter.pending and reporter.failed == 2
    await reporter.aclose()
    assert not reporter.pending and reporter.sent == 1
    assert bodies[-1] == {"step": 2, "rewardMean": 0.2, "passRates": {"crm": 0.5}}
    await client.aclose()


async def test_progress_reaches_the_active_replica_behind_a_service() -> None:
    """Two operator replicas behind one Service, which balances per connection (kube-proxy): the
    standby answers 503. The reporter asks again on a new connection, so its reports reach the
    active replica instead of the standby its pooled connection first landed on (a reporter that
    kept its connection got 1 of 3 reports through here, after 7 failed attempts)."""
    from aiohttp import web

    received: list[dict[str, Any]] = []

    async def standby(request: web.Request) -> web.Response:
        return web.json_response({"error": "standby replica"}, status=503)

    async def active(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.json_response({"accepted": True}, status=202)

    runners, ports = [], []
    for handler in (standby, active):
        app = web.Application()
        app.router.add_post("/v1/namespaces/{ns}/campaigns/{name}/progress", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    service, connections = await _per_connection_balancer(ports)
    try:
        port = service.sockets[0].getsockname()[1]
        reporter = ProgressReporter(KubernetesSettings(f"http://127.0.0.1:{port}", "rl", "f", "c"))
        for step in (1, 2, 3):
            reporter.report(step=step, pass_rates={"crm": step / 4})
            await reporter.flush()
        await reporter.aclose()
        assert (reporter.sent, reporter.failed) == (3, 0) and received[-1] == {"step": 3, "passRates": {"crm": 0.75}}
        assert connections[0] == ports[0]  # the first connection did land on the standby
    finally:
        service.close()
        for runner in runners:
            await runner.cleanup()


async def _per_connection_balancer(ports: list[int]) -> tuple[asyncio.Server, list[int]]:
    """A TCP proxy on 127.0.0.1 sending each new connection to the next port in turn, as a
    Service's ClusterIP does (kube-proxy picks a backend per connection). -> (the proxy, the
    backend port of every connection so far)."""
    chosen: list[int] = []

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        finally:
            dst.close()

    async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chosen.append(ports[len(chosen) % len(ports)])
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", chosen[-1])
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    return await asyncio.start_server(connect, "127.0.0.1", 0), chosen


def test_evaluation_job_runs_awm_eval_with_arguments_it_accepts() -> None:
    spec = evaluation()
    job = cm.job_manifest("ev", "rl", "u", spec, OperatorConfig(), cm.CampaignSettings(), "http://op:8080")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "evaluator" and c["image"] == "awm-trainer:0.1.0"
    env = container_env(job)
    assert env["AWM_POLICY_API_KEY"] == {"secretKeyRef": {"name": "llm", "key": "token"}}
    # The real `awm eval` command parses the arguments (a typo in an option would fail here).
    from awm.cli import app
    command = typer.main.get_command(app)
    ctx = command.make_context("awm", list(c["args"]), resilient_parsing=False)
    sub = command.get_command(ctx, c["args"][0])
    params = sub.make_context("eval", list(c["args"][1:])).params
    assert (params["base_url"], params["model"], params["k"], params["replicas"]) == ("http://vllm:8000/v1", "qwen", 4, 4)
    assert params["env"] == ["crm"] and params["task"] == ["t1", "t2"] and params["catalog"] == cm.CATALOG_DIR
    assert str(params["out"]) == "/tmp/eval"  # scratch unless evaluation.output points into a volume
    kept = evaluation(evaluation={**spec.evaluation.model_dump(by_alias=True), "output": "/results/ev"})
    (c,) = cm.job_manifest("ev", "rl", "u", kept, OperatorConfig(), cm.CampaignSettings(),
                           "http://op:8080")["spec"]["template"]["spec"]["containers"]
    assert c["args"][c["args"].index("--out") + 1] == "/results/ev" and "ports" not in c
    init = job["spec"]["template"]["spec"]["initContainers"][0]
    assert init["image"] == c["image"] and init["command"][:2] == ["python", "-c"]
    assert init["command"][3:] == ["http://store/cat", cm.CATALOG_DIR, "crm"]
    assert "volumes" in job["spec"]["template"]["spec"] and all(v["name"] != "config"
                                                                for v in job["spec"]["template"]["spec"]["volumes"])


def test_evaluation_jobs_take_the_evaluation_image_when_the_chart_names_one() -> None:
    """An evaluation of an endpoint needs no torch: with AWM_EVAL_IMAGE set (the chart's
    trainer.evalImage) its Job and the Job's catalog download run that image; training keeps the
    trainer image, and a campaign's own job.image wins over both."""
    settings = cm.CampaignSettings.from_env({"AWM_TRAINER_IMAGE": "reg/awm-trainer:1",
                                             "AWM_EVAL_IMAGE": "reg/awm-trainer-eval:1",
                                             "AWM_EVAL_IMAGE_PULL_POLICY": "Never"})

    def pod(spec: Any) -> dict[str, Any]:
        return cm.job_manifest("c", "rl", "u", spec, OperatorConfig(), settings, "http://op:8080")["spec"]["template"]["spec"]

    ev = pod(evaluation())
    assert [(c["image"], c["imagePullPolicy"]) for c in ev["initContainers"] + ev["containers"]] == \
        [("reg/awm-trainer-eval:1", "Never")] * 2
    (trainer,) = pod(training())["containers"]
    assert (trainer["image"], trainer["imagePullPolicy"]) == ("reg/awm-trainer:1", "IfNotPresent")
    (own,) = pod(evaluation(job={"image": "mine:2"}))["containers"]
    assert (own["image"], own["imagePullPolicy"]) == ("mine:2", "Never")


def test_child_names_fit() -> None:
    assert cm.Names.of("run") == cm.Names("run", "run", "run-train-config", "run-trainer", "run-workers")
    long = "a" * 200
    names = cm.Names.of(long)
    assert len(names.job) <= cm.NAME_LIMIT and len(names.config) <= cm.NAME_LIMIT
    assert len(names.account) <= cm.NAME_LIMIT and names.account.endswith("-trainer")
    assert names.config.endswith("-train-config") and names.job != cm.Names.of("a" * 199).job


# --------------------------------------------------------------------------- Job -> phase


def job(conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j"}, "status": {**status, "conditions": conditions or []}}


def test_job_state_maps_to_phases() -> None:
    assert cm.job_state({"metadata": {}}).phase == "Pending"
    assert cm.job_state(job(active=1, ready=0, startTime="t0")).phase == "Pending"  # pulling the image
    running = cm.job_state(job(active=1, ready=1, startTime="t0"))
    assert (running.phase, running.started_at) == ("Running", "t0")
    # FailureTarget / SuccessCriteriaMet come first; only the final conditions end a campaign.
    assert cm.job_state(job([{"type": "FailureTarget", "status": "True"}], ready=1)).phase == "Running"
    assert cm.job_state(job([{"type": "SuccessCriteriaMet", "status": "True"}])).phase == "Pending"
    done = cm.job_state(job([{"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"}],
                            startTime="t0", completionTime="t1"))
    assert (done.phase, done.started_at, done.finished_at) == ("Succeeded", "t0", "t1")
    failed = cm.job_state(job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                "message": "Job has reached the specified backoff limit",
                                "lastTransitionTime": "t2"}]))
    assert (failed.phase, failed.reason, failed.finished_at) == ("Failed", "BackoffLimitExceeded", "t2")
    assert "backoff limit" in failed.message
    assert cm.job_state(job([{"type": "Complete", "status": "False"}], ready=1)).phase == "Running"


def test_phases_only_move_forward() -> None:
    from awm_operator.phases import campaign_advances as advances

    assert advances("", "Pending") and advances("Pending", "Running") and advances("Running", "Failed")
    assert advances("Pending", "Succeeded") and advances(None, "Pending")
    assert not advances("Running", "Pending") and not advances("Succeeded", "Running")
    assert not advances("Failed", "Succeeded") and not advances("Running", "Running")


def test_settings_from_env() -> None:
    s = cm.CampaignSettings.from_env({"AWM_OPERATOR_URL": "http://awm-operator.awm.svc:8080",
                                      "AWM_TRAINER_IMAGE": "r/t:9", "AWM_CAMPAIGN_STATUS_INTERVAL": "5"})
    assert (s.operator_url, s.trainer_image, s.status_interval) == ("http://awm-operator.awm.svc:8080", "r/t:9", 5.0)
    assert cm.CampaignSettings.from_env({}) == cm.CampaignSettings()


# --------------------------------------------------------------------------- progress


def test_progress_reports() -> None:
    r = cp.ProgressReport.model_validate({"step": 3, "rewardMean": 0.5, "passRates": {"crm": 0.25}})
    assert r.status() == {"step": 3, "rewardMean": 0.5, "passRates": {"crm": 0.25}}
    with pytest.raises(ValidationError):
        cp.ProgressReport.model_validate({"step": -1})
    with pytest.raises(ValidationError):
        cp.ProgressReport.model_validate({"loss": 1.0})
    assert ProgressReporter.payload(step=2, reward_mean=None, pass_rates={"a": 1.0}) == {"step": 2, "passRates": {"a": 1.0}}
    assert ProgressReporter.payload(pass_at_k={"a": 1.0}) == {"passAtK": {"a": 1.0}}
    status = CampaignStatus.model_validate({"phase": "Running", "step": 3, "rewardMean": 0.5, "passRates": {"crm": 0.25}})
    assert status.pass_rates == {"crm": 0.25}


class RecordingKube:
    """Records status patches: the API server's side of the operator's writes."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.gone = False

    async def patch_status(self, plural: str, namespace: str, name: str, status: Any) -> dict[str, Any]:
        if self.gone:
            raise ApiError(404, '{"message": "not found"}')
        self.patches.append(status.patch())  # the merge patch the real client sends
        return {}


class FakeContext:
    def __init__(self) -> None:
        self.kube = RecordingKube()
        self.config = OperatorConfig()
        self.metrics = Metrics()
        self.campaigns = None


async def test_progress_is_coalesced_into_few_status_writes() -> None:
    ctx = FakeContext()
    registry = cp.Campaigns(ctx, cm.CampaignSettings(status_interval=3600))  # type: ignore[arg-type]
    state = registry.observe({"metadata": {"namespace": "rl", "name": "run", "uid": "u1"},
                              "status": {"phase": "Pending"}, "spec": {}})
    registry.report(state, {"step": 1, "rewardMean": 0.1})
    while not ctx.kube.patches:  # the first report is written at once
        await asyncio.sleep(0.01)
    first = ctx.kube.patches[0]
    assert first["step"] == 1 and first["phase"] == "Running" and first["startedAt"]
    for step in range(2, 50):
        registry.report(state, {"step": step, "rewardMean": step / 100})
    registry.report(state, {"passRates": {"crm": 0.5}})
    await asyncio.sleep(0.05)
    assert len(ctx.kube.patches) == 1  # the rest waits for the interval...
    await registry.flush(state)         # ...and goes out as one patch with the newest values
    assert ctx.kube.patches[1] == {"step": 49, "rewardMean": 0.49, "passRates": {"crm": 0.5}}
    assert state.phase == "Running"
    sample = ctx.metrics.registry.get_sample_value
    labels = {"namespace": "rl", "campaign": "run"}
    assert sample("awm_campaign_step", labels) == 49 and sample("awm_campaign_pass_rate", {**labels, "env": "crm"}) == 0.5
    assert sample("awm_campaign_phase", {**labels, "phase": "Running"}) == 1
    ctx.kube.gone = True                 # a deleted campaign is forgotten, not retried
    registry.report(state, {"step": 50})
    await registry.flush(state)
    assert registry.get("rl", "run") is None
    assert sample("awm_campaign_step", labels) is None  # and its gauges go with it
    registry.close()


async def test_the_first_report_goes_out_at_once_on_a_fresh_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """time.monotonic() counts from boot: on a machine up for less than status_interval, "never
    flushed" must still mean "flush now" (it once meant waiting out the rest of the hour)."""
    import time as _time
    from types import SimpleNamespace

    # the campaigns module's clock only (the event loop keeps its own)
    monkeypatch.setattr(cp, "time", SimpleNamespace(monotonic=lambda: 5.0, time=_time.time))
    ctx = FakeContext()
    registry = cp.Campaigns(ctx, cm.CampaignSettings(status_interval=3600))  # type: ignore[arg-type]
    state = registry.observe({"metadata": {"namespace": "rl", "name": "run", "uid": "u1"},
                              "status": {"phase": "Pending"}, "spec": {}})
    registry.report(state, {"step": 1})
    for _ in range(100):
        if ctx.kube.patches:
            break
        await asyncio.sleep(0.01)
    assert ctx.kube.patches and ctx.kube.patches[0]["step"] == 1
    registry.close()


async def test_a_replica_that_does_not_follow_the_campaign_answers_503() -> None:
    """Progress sent to a standby replica (no campaigns: kopf pauses its handlers; no fleets
    either, so it cannot tell itself a standby) gets 503, which the reporter asks again past; only
    a campaign the API server does not know gets 404."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from awm_operator.state import Fleets

    class Campaigns(RecordingKube):
        async def get_object(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
            assert plural == cm.PLURAL
            return {"metadata": {"namespace": namespace, "name": name}} if name == "run" else None

    ctx = FakeContext()
    ctx.kube = Campaigns()
    routes = web.RouteTableDef()
    cp.add_campaign_routes(routes, ctx, Fleets())  # type: ignore[arg-type]
    app = web.Application()
    app.add_routes(routes)
    async with TestClient(TestServer(app)) as client:
        standby = await client.post("/v1/namespaces/rl/campaigns/run/progress", json={"step": 1})
        missing = await client.post("/v1/namespaces/rl/campaigns/nowhere/progress", json={"step": 1})
        assert (standby.status, missing.status) == (503, 404)
        registry = cp.campaigns_of(ctx)  # type: ignore[arg-type]
        registry.observe({"metadata": {"namespace": "rl", "name": "run", "uid": "u1"}, "status": {}, "spec": {}})
        followed = await client.post("/v1/namespaces/rl/campaigns/run/progress", json={"step": 1})
        assert followed.status == 202
        registry.close()


def test_observe_never_goes_back() -> None:
    registry = cp.Campaigns(FakeContext(), cm.CampaignSettings())  # type: ignore[arg-type]
    obj = {"metadata": {"namespace": "rl", "name": "run", "uid": "u1"}, "status": {"phase": "Succeeded"}, "spec": {}}
    state = registry.observe(obj)
    assert registry.observe({**obj, "status": {"phase": "Running"}}).phase == "Succeeded"
    fresh = registry.observe({**obj, "metadata": {**obj["metadata"], "uid": "u2"}, "status": {}})
    assert fresh is not state and fresh.phase == ""  # same name, new campaign


def test_concurrent_groups_size_a_campaign_by_episodes_not_environments() -> None:
    envs = [f"env_{i:04d}" for i in range(526)]
    base = {"mode": "training", "environments": envs, "catalog": {}, "database": {"secretName": "awm-db"},
            "training": {"groupSize": 16, "config": {"steps": 1}}}
    with pytest.raises(ValidationError, match="concurrentGroups"):
        CampaignSpec.model_validate(base)  # 526 x 16 = 8,416 instances
    spec = CampaignSpec.model_validate({**base, "concurrentGroups": 64})
    assert spec.late and spec.instances == 1024
    fleet = cm.fleet_manifest("paper", "rl", "u", spec)["spec"]
    assert fleet["binding"] == "late" and fleet["replicas"] == fleet["maxReplicas"] == 1024
    assert "cacheEnvironments" not in fleet  # the EnvFleet's default
    cached = CampaignSpec.model_validate({**base, "concurrentGroups": 64, "cacheEnvironments": 8})
    assert cm.fleet_manifest("paper", "rl", "u", cached)["spec"]["cacheEnvironments"] == 8
    cfg = TrainConfig.from_dict(cm.train_config(spec))
    assert cfg.instances == 1024 and cfg.rollout.max_inflight_groups == 64
    for bad, message in (({"concurrentGroups": 300}, "at most"), ({"concurrentGroups": 4, "groupsPerEnvironment": 2},
                                                                 "not both"),
                         ({"concurrentGroups": 4, "catalog": {"url": "http://c/"}}, "image catalog"),
                         ({"cacheEnvironments": 8}, "set concurrentGroups"),
                         ({"concurrentGroups": 4, "cacheEnvironments": 65}, "less than or equal")):
        with pytest.raises(ValidationError, match=message):
            CampaignSpec.model_validate({**base, **bad})
    evaluation = CampaignSpec.model_validate({**base, "mode": "evaluation", "training": None, "concurrentGroups": 8,
                                              "evaluation": {"baseUrl": "http://x/v1", "model": "m", "k": 4}})
    args = cm.eval_args(evaluation)
    assert args[args.index("--instances") + 1] == "32" and "--replicas" not in args
