"""Campaigns end to end, on a real control plane (k8s/harness.py: etcd, kube-apiserver,
controller-manager with its Job and garbage-collector controllers, scheduler; kwok plays the
kubelet). The operator runs in-process (kopf in a thread) against the harness kubeconfig.

kwok runs nothing, so the test plays the Job's trainer itself, with the trainer's own code and
the environment the operator put in the Job: ``KubernetesSource`` claims the campaign's
instances from the operator's allocation API (the fleet's pods point at a real env server, the
notes environment on the real PostgreSQL), one episode runs, ``ProgressReporter`` posts the
step to the operator, the claims are released. The Job's pod is kept Pending by a nodeSelector
that no node matches; labelling a node lets it be scheduled, and kwok's pod-complete stage
(k8s/build.sh writes it) makes it succeed. A failing pod is a status patch to phase Failed.

Skipped without the harness binaries (k8s/build.sh), except under CI=true.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import time
import urllib.error
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from awm.postgres import provision
from awm.episode.allocation import bearer
from awm_operator.main import InThread
from awm_operator.pods import A_CONTROL_URL, A_MCP_URL
from awm.trainer.agent import AgentConfig
from awm.trainer.config import TrainConfig
from awm.trainer.k8s_source import KubernetesSettings, KubernetesSource, ProgressReporter
from awm.trainer.policy import ReplayPolicy
from awm.episode.reward import RewardConfig
from awm.trainer.rollout import RolloutConfig, RolloutService, TaskRef
from tests.k8s_e2e import api_url, apply_crds, metric, operator_config, setup_namespace, wait_for
from tests.test_ui_browser import browser, shots  # noqa: F401 (fixtures: a real browser, the screenshots' directory)

pytestmark = pytest.mark.slow

NS = "awm-campaigns"
API = "/apis/awm.dev/v1alpha1"
NODE_LABEL = "awm.dev/e2e-campaign-node"


class Cluster:
    """The calls the tests make, as the admin user."""

    def __init__(self, cp: Any, namespace: str) -> None:
        self.cp, self.ns = cp, namespace

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.cp.api("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def campaign(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{API}/namespaces/{self.ns}/campaigns/{name}")

    def status(self, name: str) -> dict[str, Any]:
        return (self.campaign(name) or {}).get("status") or {}

    def fleet(self, name: str) -> dict[str, Any] | None:
        return self.get(f"{API}/namespaces/{self.ns}/envfleets/{name}")

    def job(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/apis/batch/v1/namespaces/{self.ns}/jobs/{name}")

    def config_map(self, name: str) -> dict[str, Any] | None:
        return self.get(f"/api/v1/namespaces/{self.ns}/configmaps/{name}")

    def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "awm.dev/v1alpha1", "kind": "Campaign", "metadata": {"name": name}, "spec": spec}
        return self.cp.api("POST", f"{API}/namespaces/{self.ns}/campaigns", body)

    def delete(self, name: str) -> None:
        self.cp.api("DELETE", f"{API}/namespaces/{self.ns}/campaigns/{name}")

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items = self.cp.api("GET", f"/api/v1/namespaces/{self.ns}/pods?labelSelector={selector}")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def fleet_pods(self, fleet: str) -> list[dict[str, Any]]:
        return self.pods(f"awm.dev/fleet={fleet}")

    def job_pods(self, job: str) -> list[dict[str, Any]]:
        return self.pods(f"batch.kubernetes.io/job-name={job}")


@pytest.fixture(scope="module")
def cluster(control_plane: Any, admin_dsn: str) -> Cluster:
    cp = control_plane
    apply_crds(cp)
    setup_namespace(cp, NS, admin_dsn)
    return Cluster(cp, NS)


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Any:
    with InThread(operator_config(NS), cluster.cp.kubeconfig) as op:
        yield op


@pytest.fixture(scope="module")
def env_urls(notes_fleet: Any) -> dict[str, str]:
    """Fleet pods' endpoints, overridden to a real env server (notes on the real PostgreSQL)."""
    inst = notes_fleet.instances[0]
    return {A_CONTROL_URL: inst.control_url, A_MCP_URL: inst.mcp_url}


def container_env(job: dict[str, Any]) -> dict[str, str]:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in c["env"] if "value" in e}


def set_node_label(cluster: Cluster, value: str | None) -> None:
    arg = f"{NODE_LABEL}={value}" if value is not None else f"{NODE_LABEL}-"
    cluster.cp.kubectl("label", "node", "kwok-node-0", "--overwrite", arg)


# --------------------------------------------------------------------------- the whole life of a training run


def test_training_campaign_runs_reports_and_cleans_up(cluster: Cluster, operator: InThread, env_urls: dict[str, str],
                                                      notes_bundle: Any, admin_dsn: str) -> None:
    name = f"train-{uuid.uuid4().hex[:5]}"
    node = uuid.uuid4().hex[:8]
    created = cluster.create(name, {
        "mode": "training", "environments": ["notes"], "catalog": {}, "database": {"secretName": "awm-db"},
        "training": {"groupSize": 2, "config": {"steps": 1, "agent": {"max_turns": 5}}},
        "fleetTemplate": {"annotations": env_urls},
        "job": {"nodeSelector": {NODE_LABEL: node}}})
    uid = created["metadata"]["uid"]

    # The operator makes the fleet, the training config and the Job, all owned by the campaign.
    status = wait_for("the campaign's children in its status",
                      lambda: (s := cluster.status(name)).get("job") == name and s)
    assert status["phase"] == "Pending" and status["fleet"] == name and status["instances"] == 2
    fleet, job, cm = cluster.fleet(name), cluster.job(name), cluster.config_map(f"{name}-train-config")
    assert fleet and job and cm
    for child in (fleet, job, cm):
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("Campaign", name, uid, True)
    assert fleet["spec"]["autoscale"] is True and fleet["spec"]["maxReplicas"] == 2 and fleet["spec"]["buffer"] == 2
    train_cfg = TrainConfig.from_dict(yaml.safe_load(cm["data"]["train.yaml"]))
    assert (train_cfg.envs, train_cfg.replicas, train_cfg.rollout.group_size, train_cfg.steps) == (["notes"], 2, 2, 1)
    assert job["spec"]["template"]["metadata"]["labels"]["awm.dev/client"] == "true"
    pods = wait_for("2 ready env pods", lambda: ((cluster.fleet(name) or {}).get("status") or {}).get("ready") == 2
                    and cluster.fleet_pods(name))
    template = provision.ensure_template(admin_dsn, notes_bundle)
    dbs = []
    for p in pods:  # what each pod's provisioning init container does (kwok runs none)
        dbs.append(provision.pod_instance_name(p["metadata"]["name"]))
        provision.create_instance(admin_dsn, template, dbs[-1], meta={"pod": p["metadata"]["name"], "fleet": name,
                                                                      "namespace": NS})
    wait_for("the Job's pod (Pending: no node matches it yet)", lambda: cluster.job_pods(name))
    assert cluster.status(name)["phase"] == "Pending"

    # The trainer's side, with exactly the environment the Job's container gets.
    settings = KubernetesSettings.from_env(container_env(job))
    assert settings == KubernetesSettings(api_url(operator), NS, name, name)

    async def trainer() -> Any:
        scenarios = {"notes": notes_bundle.scenario.description}
        async with KubernetesSource(settings, ["notes"], per_env=2, group_size=2, scenarios=scenarios) as source:
            assert len(source.claims) == 1
            assert sorted(lease.name for lease in source._all) == sorted(p["metadata"]["name"] for p in pods)
            await asyncio.to_thread(wait_for, "both instances allocated in the fleet's status",
                                    lambda: cluster.fleet(name)["status"].get("allocated") == 2)
            service = RolloutService(source, ReplayPolicy([notes_bundle]), [TaskRef("notes", "add_note")],
                                     AgentConfig(max_turns=5), RewardConfig(), RolloutConfig(group_size=1))
            (group,) = await service.collect(1)
            reporter = ProgressReporter(settings)
            reporter.report(step=1, reward_mean=group.trajectories[0].reward, rollouts_per_s=2.5)
            await reporter.aclose()
            assert (reporter.sent, reporter.failed) == (1, 0)
            return group.trajectories[0]

    traj = asyncio.run(trainer())
    assert traj.verdict["verdict"] == "complete" and traj.reward == 1.0
    running = wait_for("the progress in the campaign's status", lambda: (s := cluster.status(name)).get("step") == 1 and s)
    assert running["phase"] == "Running" and running["rewardMean"] == 1.0 and running["rolloutsPerS"] == 2.5
    assert metric(operator, "awm_campaign_step", campaign=name) == 1
    assert metric(operator, "awm_campaign_phase", campaign=name, phase="Running") == 1
    assert metric(operator, "awm_campaign_rollouts_per_second", campaign=name) == 2.5
    assert running["startedAt"]
    wait_for("the instances released", lambda: (cluster.fleet(name) or {}).get("status", {}).get("allocated") == 0)

    # The Job finishes: the campaign succeeds and its fleet goes, with pods and databases.
    set_node_label(cluster, node)
    try:
        done = wait_for("the campaign Succeeded", lambda: (s := cluster.status(name)).get("phase") == "Succeeded" and s)
    finally:
        set_node_label(cluster, None)
    assert done["finishedAt"] and done["step"] == 1 and done["rewardMean"] == 1.0
    conditions = {c["type"]: c for c in done["conditions"]}
    assert conditions["Complete"]["status"] == "True" and conditions["FleetDeleted"]["status"] == "True"
    wait_for("the fleet and its pods gone", lambda: cluster.fleet(name) is None and not cluster.fleet_pods(name))
    wait_for("the fleet's databases dropped", lambda: not set(dbs) & set(provision.list_instances(admin_dsn)))
    assert cluster.job(name) is not None  # the Job stays with the campaign (its logs)

    cluster.delete(name)
    wait_for("the Job and ConfigMap collected with the campaign",
             lambda: cluster.job(name) is None and cluster.config_map(f"{name}-train-config") is None)


# --------------------------------------------------------------------------- an external trainer


EXTERNAL_TRAINER = """
import asyncio, os
from awm.episode.allocation import AllocationClient

async def main():
    async with AllocationClient(os.environ["AWM_OPERATOR_URL"], os.environ["AWM_NAMESPACE"],
                                os.environ["AWM_FLEET"]) as alloc:
        claim = await alloc.claim(count=2, group_size=2, holder="external")
        print("claimed", len(claim.instances), claim.instances[0].control_url is not None, flush=True)
        await alloc.release(claim.id)
        print("released", flush=True)

asyncio.run(main())
"""


def test_an_external_trainer_runs_with_the_fleet_injected(cluster: Cluster, operator: InThread,
                                                          env_urls: dict[str, str]) -> None:
    """mode external: the user's trainer image and command run as the campaign's Job, with the
    fleet's allocation endpoint and the Job's own credentials injected; here a trivial trainer
    (run with exactly the Job container's environment and the Job's ServiceAccount token, since
    kwok runs no container) claims a GRPO group and releases it; the Job completing completes
    the campaign."""
    import subprocess
    import sys

    name = f"ext-{uuid.uuid4().hex[:5]}"
    node = uuid.uuid4().hex[:8]
    refused = cluster.cp.kubectl("-n", NS, "apply", "-f", "-", check=False, input=json.dumps({
        "apiVersion": "awm.dev/v1alpha1", "kind": "Campaign", "metadata": {"name": f"{name}-bad"},
        "spec": {"mode": "external", "environments": ["notes"], "catalog": {}, "database": {"secretName": "awm-db"},
                 "external": {}}}))
    assert refused.returncode != 0 and "mode external needs job.command" in refused.stderr
    cluster.create(name, {
        "mode": "external", "environments": ["notes"], "catalog": {}, "database": {"secretName": "awm-db"},
        "external": {"groupSize": 2}, "fleetTemplate": {"annotations": env_urls},
        "job": {"image": "example.com/my-trl-trainer:1", "command": ["python", "-c", EXTERNAL_TRAINER],
                "nodeSelector": {NODE_LABEL: node}}})
    status = wait_for("the campaign's children", lambda: (s := cluster.status(name)).get("job") == name and s)
    assert status["instances"] == 2
    job = cluster.job(name)
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert (c["name"], c["image"], c["command"][:2], c.get("args", [])) == ("external", "example.com/my-trl-trainer:1",
                                                                     ["python", "-c"], [])
    wait_for("2 ready env pods", lambda: ((cluster.fleet(name) or {}).get("status") or {}).get("ready") == 2)
    (pod,) = wait_for("the Job's pod", lambda: cluster.job_pods(name))
    account = pod["spec"]["serviceAccountName"]
    token = cluster.cp.api("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": 600}})["status"]["token"]
    env = {**container_env(job), "AWM_API_TOKEN": token, "PATH": os.environ["PATH"],
           "PYTHONPATH": os.pathsep.join(sys.path)}
    ran = subprocess.run([sys.executable, "-c", EXTERNAL_TRAINER], env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.split() == ["claimed", "2", "True", "released"]
    wait_for("the instances back", lambda: (cluster.fleet(name) or {}).get("status", {}).get("allocated") == 0)
    set_node_label(cluster, node)
    try:
        wait_for("the campaign Succeeded", lambda: cluster.status(name).get("phase") == "Succeeded")
    finally:
        set_node_label(cluster, None)
    cluster.delete(name)


# --------------------------------------------------------------------------- failure, keeping the fleet


def test_failing_job_fails_the_campaign(cluster: Cluster, operator: InThread) -> None:
    name = f"eval-{uuid.uuid4().hex[:5]}"
    cluster.create(name, {
        "mode": "evaluation", "environments": ["crm", "bike_shop"], "catalog": {}, "database": {"secretName": "awm-db"},
        "evaluation": {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "k": 2},
        "job": {"nodeSelector": {NODE_LABEL: "never"}, "backoffLimit": 0},
        "cleanup": {"deleteFleet": False}})
    wait_for("the campaign's children", lambda: cluster.status(name).get("job") == name)
    (c,) = cluster.job(name)["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "eval" and c["args"][c["args"].index("--replicas") + 1] == "2"
    assert cluster.fleet(name)["spec"]["replicas"] == 4  # 2 environments x k=2
    (pod,) = wait_for("the Job's pod", lambda: cluster.job_pods(name))

    # The progress API: known campaigns only, valid reports only.
    base = f"{api_url(operator)}/v1/namespaces/{NS}/campaigns"
    assert httpx.post(f"{base}/no-such-campaign/progress", json={"step": 1}, headers=bearer()).status_code == 404
    assert httpx.post(f"{base}/{name}/progress", json={"step": 1}).status_code == 401  # who is asking?
    assert httpx.post(f"{base}/{name}/progress", json={"step": "many"}, headers=bearer()).status_code == 400
    r = httpx.post(f"{base}/{name}/progress", json={"step": 1, "passRates": {"crm": 0.5}, "passAtK": {"crm": 0.75}},
                   headers=bearer())
    assert r.status_code == 202, r.text
    # The Job's own identity (its ServiceAccount, made by the operator) may report and claim here.
    account = pod["spec"]["serviceAccountName"]
    token = cluster.cp.api("POST", f"/api/v1/namespaces/{NS}/serviceaccounts/{account}/token",
                           {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                            "spec": {"expirationSeconds": 600}})["status"]["token"]
    as_job = {"Authorization": f"Bearer {token}"}
    # (RBAC bindings reach the API server's authorizer a moment after they are made)
    wait_for("the Job's identity allowed", lambda: httpx.post(f"{base}/{name}/progress", json={"step": 1},
                                                              headers=as_job).status_code == 202, timeout=30)
    other = httpx.post(f"{base}/no-such-campaign/progress", json={"step": 1}, headers=as_job)
    assert other.status_code == 403, other.text  # its Role names its own campaign only
    wait_for("the pass rates in the status", lambda: cluster.status(name).get("passRates") == {"crm": 0.5})
    assert cluster.status(name)["passAtK"] == {"crm": 0.75}
    assert metric(operator, "awm_campaign_pass_at_k", campaign=name, env="crm") == 0.75

    # The pod fails (what a crashed evaluator's pod does): with backoffLimit 0 the Job fails.
    r = cluster.cp.kubectl("-n", NS, "patch", "pod", pod["metadata"]["name"], "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": {"phase": "Failed", "reason": "Error"}}), check=False)
    assert r.returncode == 0, r.stderr
    failed = wait_for("the campaign Failed", lambda: (s := cluster.status(name)).get("phase") == "Failed" and s)
    conditions = {c["type"]: c for c in failed["conditions"]}
    assert conditions["Failed"]["reason"] == "BackoffLimitExceeded" and failed["finishedAt"]
    assert conditions["FleetDeleted"]["status"] == "False"  # cleanup.deleteFleet: false keeps it
    assert failed["passRates"] == {"crm": 0.5}
    assert cluster.fleet(name) is not None

    # Deleting the campaign collects what it owns; the fleet's finalizer removes its pods.
    cluster.delete(name)
    wait_for("fleet, pods and Job gone", lambda: cluster.fleet(name) is None and not cluster.fleet_pods(name)
             and cluster.job(name) is None, timeout=120)


# --------------------------------------------------------------------------- the API server refuses impossible ones


def test_the_web_view_lists_campaigns_through_the_operator(cluster: Cluster, operator: InThread,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What the chart's UI runs (`awm ui --operator-url ... --namespace NS`): the operator lists
    the namespace's Campaigns (from the API server, with progress and its fleet's counts) and
    EnvFleets to an identity that RBAC lets list them, and to no other; the UI's fleet view shows
    them."""
    from awm.ui.fleet import FleetView

    name = f"view-{uuid.uuid4().hex[:5]}"
    cluster.create(name, {
        "mode": "evaluation", "environments": ["crm"], "catalog": {}, "database": {"secretName": "awm-db"},
        "evaluation": {"baseUrl": "http://127.0.0.1:9/v1", "model": "the-model", "k": 2},
        "job": {"nodeSelector": {NODE_LABEL: "never"}}})
    wait_for("the campaign's children", lambda: cluster.status(name).get("job") == name)
    url = f"{api_url(operator)}/v1/namespaces/{NS}/campaigns"
    assert httpx.get(url).status_code == 401
    refused = httpx.get(url, headers=bearer())  # the trainer's identity: claims and progress only
    assert refused.status_code == 403 and "list campaigns" in refused.json()["error"]
    refused = httpx.get(url.replace("/campaigns", "/envfleets"), headers=bearer())
    assert refused.status_code == 403 and "list envfleets" in refused.json()["error"]

    viewer = viewer_token(cluster)

    def listed() -> dict[str, Any] | None:
        r = httpx.get(url, headers={"Authorization": f"Bearer {viewer}"})
        rows = [c for c in r.json()["campaigns"] if c["name"] == name] if r.status_code == 200 else []
        return rows[0] if rows and rows[0]["fleetCounts"] else None

    async def look() -> dict[str, Any]:
        view = FleetView(operator_url=api_url(operator), namespaces=[NS, "awm-no-such-namespace"])
        try:
            return await view.snapshot()
        finally:
            await view.close()

    try:
        # (a refusal is cached for 2 s; the fleet's counts come once the operator follows it)
        row = wait_for("the campaign listed to the viewer, with its fleet's counts", listed)
        assert (row["mode"], row["environments"], row["model"], row["fleet"]) == ("evaluation", 1, "the-model", name)
        assert row["status"]["phase"] == "Pending" and row["status"]["job"] == name
        assert row["status"]["instances"] == 2 and row["fleetCounts"]["replicas"] == 2  # the operator's own fleet

        monkeypatch.setenv("AWM_API_TOKEN", viewer)
        ours, other = asyncio.run(look())["namespaces"]
        assert name in [c["name"] for c in ours["campaigns"]] and ours["error"] is None
        (fleet,) = [f for f in ours["fleets"] if f["fleet"] == name]  # the campaign's fleet, live
        assert (fleet["replicas"], fleet["binding"], fleet["environments"], fleet["live"]) == (2, "pinned", 1, True)
        assert fleet["condition"]["status"] in ("True", "False") and fleet["condition"]["reason"]
        assert other["campaigns"] == other["fleets"] == [] and "403" in other["error"]  # no Role there
    finally:
        cluster.delete(name)


def test_the_playground_claims_with_the_users_own_token(cluster: Cluster, operator: InThread, env_urls: dict[str, str],
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any,
                                                       shots: Path) -> None:
    """The chart's UI with ``ui.playground`` (``awm ui --playground-claims``): a person claims an
    instance with their own token, which the UI forwards to the operator (401 without one, 403 for
    an identity RBAC does not let create envclaims there); the instance is theirs alone through
    the UI (403 for any other token); they act on it in the browser (reset, a tool call with its
    database change, the verdict), and leaving the page releases the claim in the operator."""
    from selenium.webdriver.support.ui import Select

    from awm.ui.app import UiState
    from awm.ui.fleet import FleetView
    from awm.ui.runs import Runs
    from tests.k8s_e2e import CLIENTS_NS, client_token, grant_claims
    from tests.test_ui_browser import CONTRAST, UNLABELLED, open_page, severe, ui_in_thread
    from tests.test_ui_browser import wait as wait_browser

    name = f"play-{uuid.uuid4().hex[:5]}"
    cluster.cp.api("POST", f"{API}/namespaces/{NS}/envfleets", {
        "apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": name},
        "spec": {"environments": ["notes"], "replicas": 1, "catalog": {}, "database": {"secretName": "awm-db"},
                 "binding": "pinned", "template": {"annotations": env_urls}}})
    player, stranger = client_token(cluster.cp, "player"), client_token(cluster.cp, "stranger")
    grant_claims(cluster.cp, NS, CLIENTS_NS, "player")  # the stranger may not claim in NS
    monkeypatch.setenv("AWM_API_TOKEN", viewer_token(cluster))  # the UI's own identity: list only
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))
    view = FleetView(operator_url=api_url(operator), namespaces=[NS])

    def allocated() -> int:
        return int(((cluster.fleet(name) or {}).get("status") or {}).get("allocated") or 0)

    with ui_in_thread(UiState(Runs([tmp_path]), fleet=view, playground_claims=True)) as url:
        try:
            wait_for("the fleet's instance ready", lambda: ((cluster.fleet(name) or {}).get("status") or {}).get("ready") == 1)
            as_ = lambda token: {"Authorization": f"Bearer {token}"} if token else {}  # noqa: E731
            claim = {"namespace": NS, "fleet": name, "environment": "notes"}
            with httpx.Client(base_url=url, timeout=60) as ui:
                r = ui.post("/api/playground/claim", json=claim)
                assert r.status_code == 401 and "bearer token" in r.json()["error"]
                r = ui.post("/api/playground/claim", json=claim, headers=as_(stranger))
                assert r.status_code == 403 and "create envclaims" in r.json()["error"], r.text
                r = ui.post("/api/playground/claim", json={**claim, "namespace": "kube-system"}, headers=as_(player))
                assert r.status_code == 403 and "not one this UI serves" in r.json()["error"]
                r = ui.post("/api/playground/claim", json=claim, headers=as_(player))
                assert r.status_code == 200, r.text
                instance = r.json()["instance"]
                assert instance.startswith(f"{NS}.{name}-") and allocated() in (0, 1)  # (status follows)
                wait_for("the claim in the fleet's status", lambda: allocated() == 1)
                for token in (None, stranger):  # another person cannot drive it through the UI
                    r = ui.post(f"/api/playground/{instance}/open", headers=as_(token))
                    assert r.status_code == 403 and "another token" in r.json()["error"]
                    r = ui.post(f"/api/playground/{instance}/release", headers=as_(token))
                    assert r.status_code == 403
                opened = ui.post(f"/api/playground/{instance}/open", headers=as_(player)).json()
                assert opened["claimed"] and "add_note" in [t["name"] for t in opened["tools"]]
                r = ui.post(f"/api/playground/{instance}/release", headers=as_(player))
                assert r.status_code == 200
                wait_for("the claim released in the operator", lambda: allocated() == 0)

            # The same in the browser, as the person would: the token typed into the page.
            open_page(browser, url + "/", "#/playground", "playground")
            main = browser.find_element("id", "main")
            form = wait_browser(lambda: main.find_elements("id", "claim"), "the claim form")[0]
            assert browser.execute_script(UNLABELLED) == [] and browser.execute_script(CONTRAST) == []
            Select(form.find_element("name", "fleet")).select_by_value(f"{NS}/{name}")
            Select(form.find_element("name", "environment")).select_by_value("notes")
            form.find_element("name", "token").send_keys(stranger)  # refused: the operator's reason at the form
            form.find_element("xpath", ".//button[text()='Claim an instance']").click()
            refusal = wait_browser(lambda: (e := browser.find_element("id", "claim-error")).is_displayed() and e.text,
                                   "the refusal at the form")
            assert "403" in refusal and "create envclaims" in refusal, refusal
            form.find_element("name", "token").clear()
            form.find_element("name", "token").send_keys(player)
            form.find_element("xpath", ".//button[text()='Claim an instance']").click()
            held = wait_browser(lambda: browser.find_elements("id", "play-held"), "the claimed instance's page")[0]
            assert "claimed from the cluster for you (notes)" in held.text
            wait_for("the browser's claim in the fleet's status", lambda: allocated() == 1)
            main = browser.find_element("id", "main")
            Select(main.find_element("name", "task")).select_by_value("add_note")
            main.find_element("xpath", "//button[text()='Reset']").click()
            wait_browser(lambda: "groceries" in browser.find_element("id", "play-status").text, "the reset")
            tool = main.find_element("css selector", 'details[data-tool="add_note"]')
            tool.find_element("tag name", "summary").click()
            tool.find_element("name", "title").send_keys("groceries")
            tool.find_element("name", "body").send_keys("milk, eggs")
            tool.find_element("xpath", ".//button[text()='Call']").click()
            call = wait_browser(lambda: browser.find_elements("css selector", "#play-log li.call"), "the call")[0]
            assert "ok" in call.text and "groceries" in call.text
            main.find_element("xpath", "//button[text()='Verify']").click()
            verdict = wait_browser(lambda: browser.find_elements("css selector", "#play-log .verify-result"), "the verdict")[0]
            assert "complete" in verdict.text and "1 inserted" in verdict.text
            # (the browser logs the refused claim's 403 itself; nothing else may go wrong)
            assert [e for e in severe(browser) if "/api/playground/claim" not in e["message"]] == []
            browser.save_screenshot(str(shots / "playground-cluster.png"))
            open_page(browser, url + "/", "#/fleet", "fleet")  # leaving the page releases the claim
            wait_for("the browser's claim released in the operator", lambda: allocated() == 0)
        finally:
            cluster.cp.api("DELETE", f"{API}/namespaces/{NS}/envfleets/{name}")


def viewer_token(cluster: Cluster) -> str:
    """A token of ServiceAccount ``awm-test-clients/viewer``, which may list campaigns and fleets in NS."""
    from tests.k8s_e2e import CLIENTS_NS, client_token

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}"
    for path, body in ((f"{rbac}/roles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "viewer"},
            "rules": [{"apiGroups": ["awm.dev"], "resources": ["campaigns", "envfleets"], "verbs": ["list"]}]}),
            (f"{rbac}/rolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "viewer"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "viewer"},
                "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": CLIENTS_NS}]})):
        try:
            cluster.cp.api("POST", path, body)
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # made by an earlier test
                raise
    return client_token(cluster.cp, "viewer")


def test_impossible_campaigns_are_refused(cluster: Cluster) -> None:
    base = {"mode": "evaluation", "environments": ["crm"], "catalog": {}, "database": {"secretName": "awm-db"},
            "evaluation": {"baseUrl": "http://x/v1", "model": "m", "k": 8}}
    for spec, message in (({**base, "groupsPerEnvironment": 600}, "at most 4096"),
                          ({**base, "mode": "training"}, "each mode needs its own section"),
                          ({**base, "cacheEnvironments": 8}, "set concurrentGroups")):
        with pytest.raises(urllib.error.HTTPError) as exc:
            cluster.create(f"bad-{uuid.uuid4().hex[:5]}", spec)
        assert exc.value.code == 422 and message in exc.value.read().decode()


def test_a_paper_shaped_campaign_runs_its_step_on_kwok(cluster: Cluster, operator: InThread,
                                                      env_urls: dict[str, str]) -> None:
    """The AWM paper's step: 64 GRPO groups of 16 over 526 environments. Per environment that is
    8,416 instances (refused: over 4,096); with concurrentGroups the API server accepts it and the
    operator makes a late-binding fleet of 1,024 and the Job's config. Then the campaign runs its
    step's claims as its Job does: the fleet's 1,024 pods Ready, 64 group claims of 16 at once,
    each of another of the 526 environments, through the Job's own claim path (``run_source`` →
    ``OperatorSource``, ``switch: client``), all released (the operator resets every instance),
    and the campaign deleted with its fleet. kwok runs no containers: every pod's control API is
    one real env server (``env_urls``), which takes the releases' resets; the episodes of a step
    run in the scaled-down campaigns (below, and on real pods: tests/test_realnode.py)."""
    import random

    from awm.episode.allocation import OperatorSettings
    from awm.episode.sources import OperatorSource, run_source

    envs = [f"env_{i:04d}" for i in range(526)]
    base = {"mode": "training", "environments": envs, "catalog": {}, "database": {"secretName": "awm-db"},
            "training": {"groupSize": 16, "config": {"steps": 1}}}
    with pytest.raises(urllib.error.HTTPError) as exc:  # today's shape: environments x groups x 16
        cluster.create(f"paper-{uuid.uuid4().hex[:5]}", base)
    assert exc.value.code == 422 and "concurrentGroups" in exc.value.read().decode()
    name = f"paper-{uuid.uuid4().hex[:5]}"
    t0 = time.monotonic()
    cluster.create(name, {**base, "concurrentGroups": 64, "cacheEnvironments": 8,
                          "fleetTemplate": {"annotations": env_urls},
                          "job": {"nodeSelector": {NODE_LABEL: "never"}}})  # kwok would complete the Job: the test plays it
    status = wait_for("the campaign's children", lambda: (s := cluster.status(name)).get("job") == name and s)
    assert status["instances"] == 1024
    fleet = cluster.fleet(name)
    assert fleet is not None and fleet["spec"]["binding"] == "late" and len(fleet["spec"]["environments"]) == 526
    assert fleet["spec"]["replicas"] == fleet["spec"]["maxReplicas"] == 1024 and fleet["spec"]["cacheEnvironments"] == 8
    train_cfg = TrainConfig.from_dict(yaml.safe_load(cluster.config_map(f"{name}-train-config")["data"]["train.yaml"]))
    assert (train_cfg.instances, train_cfg.rollout.group_size, train_cfg.rollout.max_inflight_groups) == (1024, 16, 64)
    job_settings = OperatorSettings.from_env(container_env(cluster.job(name)))
    assert job_settings is not None and job_settings.fleet == name
    wait_for("the fleet's 1,024 pods Ready",
             lambda: ((cluster.fleet(name) or {}).get("status") or {}).get("ready") == 1024, timeout=600, interval=1)
    ready_s = time.monotonic() - t0

    class Named:
        def __init__(self, name: str) -> None:
            self.name, self.scenario = name, type("S", (), {"description": ""})()

    # The Job's settings, with the operator's address as this process reaches it.
    settings = dataclasses.replace(job_settings, operator_url=api_url(operator))
    step = random.Random(0).sample(envs, 64)

    async def one_step() -> tuple[list[list[Any]], float, list[float]]:
        source = run_source([Named(e) for e in envs], 1, 16, settings=settings, instances=train_cfg.instances)
        assert isinstance(source, OperatorSource) and source.envs() == envs
        latencies: list[float] = []

        async def claim(env: str) -> list[Any]:
            t = time.monotonic()
            leases = await source.operator.claim(env, 16, 16)
            latencies.append(time.monotonic() - t)
            return leases

        try:
            t = time.monotonic()
            groups = await asyncio.gather(*(claim(env) for env in step))
            took = time.monotonic() - t
            for leases in groups:
                await source.operator.release(leases[0].claim_id)
        finally:
            await source.close()
        return groups, took, sorted(latencies)

    groups, step_s, latencies = asyncio.run(one_step())
    assert [len(g) for g in groups] == [16] * 64
    assert [{lease.env for lease in g} for g in groups] == [{env} for env in step]  # a group: one environment
    assert len({lease.name for g in groups for lease in g}) == 1024  # every pod of the fleet, once
    assert all(len({lease.claim_id for lease in g}) == 1 for g in groups)  # a group is one claim
    # Pods that served another environment are left to the Job to switch as it connects.
    assert sum(lease.unswitched for g in groups for lease in g) >= 1024 - 2 * 64
    wait_for("the step's instances released", lambda: (cluster.fleet(name) or {}).get("status", {}).get("allocated") == 0
             and cluster.fleet(name)["status"].get("ready") == 1024, timeout=120)
    print(f"paper-shaped campaign on kwok: 1,024 pods Ready {ready_s:.1f} s after the Campaign; "
          f"its step of 64 x 16 bound in {step_s * 1000:.0f} ms (group claims p50 {latencies[31] * 1000:.0f} ms, "
          f"slowest {latencies[-1] * 1000:.0f} ms)")
    cluster.delete(name)
    wait_for("the campaign's fleet and pods gone", lambda: cluster.fleet(name) is None and not cluster.fleet_pods(name),
             timeout=600, interval=2)


# --------------------------------------------------------------------------- the real learner in a campaign's Job


LAMPS = Path(__file__).resolve().parent / "fixtures" / "lamps"
TINY = Path(__file__).resolve().parent.parent / "examples" / "train-tiny.yaml"


PAPER = Path(__file__).resolve().parent.parent / "examples" / "paper"


def test_the_kits_campaigns_validate_on_the_api_server(cluster: Cluster, tmp_path: Path) -> None:
    """docs/reproduce.md's Campaigns (examples/paper/campaign.py over each paper config and a split
    of 526 training environments) pass the API server's validation of the CRDs (a dry-run create)
    and the operator's model, and the config the operator renders for their Job loads as an
    ``awm train`` config: the paper's step, 64 groups of 16 at once on a late-binding fleet."""
    from awm_operator import campaign_manifests
    from awm_operator.crds import CampaignSpec
    from examples.paper import campaign as kit

    split = tmp_path / "split.json"
    split.write_text(json.dumps({"seed": 0, "train": [f"env_{i:04d}" for i in range(526)], "test": ["held_out"]}))
    for config in sorted(PAPER.glob("qwen3-*.yaml")):
        out = tmp_path / f"{config.stem}.yaml"
        with out.open("w") as f, contextlib.redirect_stdout(f):
            assert kit.main(["--config", str(config), "--split", str(split), "--catalog-image", "reg.example/awm1k:v1",
                             "--vllm-image", "reg.example/vllm-openai:v1", "--judge-secret", "openai"]) == 0
        manifest = yaml.safe_load(out.read_text())
        created = cluster.cp.api("POST", f"{API}/namespaces/{NS}/campaigns?dryRun=All", manifest)
        assert created["metadata"]["name"] == f"paper-{config.stem}"
        spec = CampaignSpec.model_validate(manifest["spec"])
        assert (spec.late, spec.instances, spec.training.group_size, len(spec.environments)) == (True, 1024, 16, 526)
        assert spec.training.vllm is not None and spec.training.learner.processes == 4
        assert spec.serving.judge is not None and spec.serving.judge.reasoning is True
        train_cfg = TrainConfig.from_dict(campaign_manifests.train_config(spec))
        assert (train_cfg.instances, train_cfg.rollout.group_size, train_cfg.groups_per_step) == (1024, 16, 64)
        assert train_cfg.policy.kind == "vllm" and train_cfg.policy.thinking and train_cfg.learner.distributed
    assert kit.main(["--config", str(PAPER / "qwen3-8b.yaml"), "--split", str(tmp_path / "none.json")]) == 2


@pytest.mark.timeout(600)
def test_awm_train_in_a_campaign_job_claims_trains_and_reports(cluster: Cluster, operator: InThread, admin_dsn: str,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reproduction kit's Campaign (examples/paper/campaign.py over qwen3-8b.yaml) with the
    tiny CPU model standing in for Qwen3 and the step scaled down to one group of 2 on the lamps
    environment: the operator makes its late-binding fleet, ConfigMap and Job, and
    ``awm.trainer.run.train`` (what the Job's ``awm train`` runs) with exactly the Job's
    environment and the ConfigMap's config claims the fleet's instances through the operator (each
    pod points at its own real env server, switched to lamps at the claim), runs a GRPO step,
    reports it into the Campaign's status and releases."""
    from awm import catalog as catalog_mod
    from awm.fleet import Database, LocalFleet
    from awm.trainer.run import train
    from examples.paper import campaign as kit

    paper, tiny = yaml.safe_load((PAPER / "qwen3-8b.yaml").read_text()), yaml.safe_load(TINY.read_text())
    stand_in = {**paper, "policy": tiny["policy"], "grpo": tiny["grpo"], "tasks": tiny["tasks"],
                "agent": {**paper["agent"], **tiny["agent"]}, "steps": 1, "groups_per_step": 1, "mode": "sync",
                "rollout": {**paper["rollout"], "group_size": 2, "max_inflight_groups": 1}, "learner": {}}
    name = f"tiny-{uuid.uuid4().hex[:5]}"
    manifest = kit.render(stand_in, ["lamps"], name, gpus=1)
    manifest["spec"]["job"]["nodeSelector"] = {NODE_LABEL: "never"}  # kwok would complete it: the test plays it
    manifest["spec"]["database"] = {"secretName": "awm-db"}  # this namespace's (the chart's is awm-database)
    cluster.cp.api("POST", f"{API}/namespaces/{NS}/campaigns", manifest)
    assert wait_for("the campaign's fleet", lambda: cluster.fleet(name))["spec"]["binding"] == "late"
    wait_for("the campaign's children", lambda: cluster.status(name).get("job") == name)
    job, cm = cluster.job(name), cluster.config_map(f"{name}-train-config")
    pods = wait_for("2 ready env pods", lambda: ((cluster.fleet(name) or {}).get("status") or {}).get("ready") == 2
                    and cluster.fleet_pods(name))
    (lamps,) = catalog_mod.load(str(LAMPS))

    async def run() -> Any:
        async with LocalFleet([lamps], replicas=2, database=Database(admin_dsn)) as servers:
            urls = {}
            for pod, inst in zip(pods, servers.instances):  # each pod fronts its own real env server
                pod_name = pod["metadata"]["name"]
                cluster.cp.kubectl("-n", NS, "annotate", "--overwrite", "pod", pod_name,
                                   f"{A_CONTROL_URL}={inst.control_url}", f"{A_MCP_URL}={inst.mcp_url}")
                urls[pod_name] = inst.control_url
            await _until_the_operator_serves(name, urls, operator)
            for key, value in container_env(job).items():
                monkeypatch.setenv(key, value)
            cfg = TrainConfig.from_dict({**yaml.safe_load(cm["data"]["train.yaml"]), "catalog": str(LAMPS),
                                         "run_dir": str(tmp_path / "run"), "metrics_port": 0})  # a pod's port, not ours
            return await train(cfg)

    result = asyncio.run(run())
    assert result.steps == 1 and len(result.records) == 1
    assert (tmp_path / "run" / "metrics.jsonl").exists() and (tmp_path / "run" / "reward_curve.png").exists()
    status = wait_for("the step in the campaign's status", lambda: (s := cluster.status(name)).get("step") == 1 and s)
    assert status["phase"] == "Running" and status["rewardMean"] == result.records[0]["reward_mean"]
    wait_for("the instances released", lambda: (cluster.fleet(name) or {}).get("status", {}).get("allocated") == 0)
    cluster.delete(name)
    wait_for("the campaign's fleet collected", lambda: cluster.fleet(name) is None, timeout=120)


async def _until_the_operator_serves(fleet: str, urls: dict[str, str], operator: InThread) -> None:
    """Claim both instances until the operator hands out the annotated endpoints (its pod watch
    has seen the annotations), then give them back."""
    from awm.episode.allocation import AllocationClient

    async with AllocationClient(api_url(operator), NS, fleet) as alloc:
        for _ in range(100):
            got = await alloc.claim(count=2, wait_seconds=30)
            await alloc.release(got.id)
            if {i.pod: i.control_url for i in got.instances} == urls:
                return
            await asyncio.sleep(0.2)
    raise AssertionError("the operator never served the annotated endpoints")


# --------------------------------------------------------------------------- an operator that was away (last: it stops the module's operator)


def test_campaigns_resume_after_operator_restarts(cluster: Cluster, operator: InThread) -> None:
    """A campaign created while no operator ran gets its fleet and Job when one starts; a Job
    that finished while no operator ran still ends its campaign, and the fleet still goes."""
    operator.stop()
    cfg = dataclasses.replace(operator.cfg, api_port=0, metrics_port=0)
    name = f"resume-{uuid.uuid4().hex[:5]}"
    node = uuid.uuid4().hex[:8]
    cluster.create(name, {"mode": "evaluation", "environments": ["crm"], "catalog": {},
                          "database": {"secretName": "awm-db"},
                          "evaluation": {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "k": 1},
                          "job": {"nodeSelector": {NODE_LABEL: node}}})
    time.sleep(1)
    assert cluster.fleet(name) is None and cluster.job(name) is None  # nobody acted on it

    with InThread(cfg, cluster.cp.kubeconfig):
        wait_for("the children, made on start-up", lambda: cluster.status(name).get("job") == name)
        wait_for("the Job's pod", lambda: cluster.job_pods(name))
    set_node_label(cluster, node)  # the Job completes while no operator runs
    try:
        wait_for("the Job complete", lambda: any(c["type"] == "Complete" and c["status"] == "True"
                                                for c in (cluster.job(name) or {}).get("status", {}).get("conditions", [])))
    finally:
        set_node_label(cluster, None)
    assert cluster.status(name)["phase"] == "Pending" and cluster.fleet(name) is not None

    with InThread(dataclasses.replace(cfg, api_port=0, metrics_port=0), cluster.cp.kubeconfig):
        done = wait_for("the campaign Succeeded", lambda: (s := cluster.status(name)).get("phase") == "Succeeded" and s)
        assert {c["type"]: c["status"] for c in done["conditions"]}["FleetDeleted"] == "True"
        wait_for("the fleet and its pods gone", lambda: cluster.fleet(name) is None and not cluster.fleet_pods(name))
    cluster.delete(name)
