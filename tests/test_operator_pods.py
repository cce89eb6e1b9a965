"""The operator's pods (awm_operator/pods.py): the manifest of a pinned and of a late-binding
fleet's pod, its security settings and names, the spread of replicas over environments, and what
a pod's status says (PodInfo)."""

from __future__ import annotations

import json

import pytest

from awm.postgres import provision
from awm_operator.config import OperatorConfig
from awm_operator.pods import (A_CONTROL_URL, A_ENV, PROVISIONER_SOCKET, PodInfo, label_value, pod_manifest, pod_prefix,
                               spread)
from tests.operator_fakes import fleet_spec, pod


def test_pod_manifest_follows_the_contract() -> None:
    cfg = OperatorConfig(release="rel", envserver_image="reg/awm-envserver:1", catalog_image="reg/awm-catalog:1")
    spec = fleet_spec(template={"labels": {"team": "rl"}, "annotations": {"note": "x"},
                                "nodeSelector": {"pool": "envs"}, "tolerations": [{"key": "k", "operator": "Exists"}]})
    pod = pod_manifest("train", "ns", "uid-1", spec, "bike_shop", cfg)
    meta, ps = pod["metadata"], pod["spec"]
    assert meta["generateName"] == "train-bike-shop-"
    assert meta["labels"] == {"team": "rl", "app.kubernetes.io/name": "awm-envserver", "app.kubernetes.io/instance": "rel",
                              "awm.dev/fleet": "train", "awm.dev/environment": "bike_shop", "awm.dev/db-shard": "default"}
    assert meta["annotations"] == {"note": "x", A_ENV: "bike_shop",
                                   "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert meta["ownerReferences"] == [{"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "name": "train",
                                        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert ps["nodeSelector"] == {"pool": "envs"} and ps["tolerations"][0]["key"] == "k"
    assert ps["securityContext"]["runAsNonRoot"] and ps["securityContext"]["runAsUser"] == 10001
    assert ps["automountServiceAccountToken"] is False
    bundle, prov = ps["initContainers"]
    assert bundle["image"] == "reg/awm-catalog:1"
    assert bundle["command"] == ["cp", "/catalog/bike_shop.json", "/bundle/env.json"]
    assert prov["command"][:3] == ["python", "-m", "awm.postgres.provision"]
    assert "--dsn-file" in prov["command"] and "/run/awm/instance.dsn" in prov["command"]
    env = {e["name"]: e for e in prov["env"]}
    assert env["AWM_ADMIN_DSN"]["valueFrom"]["secretKeyRef"] == {"name": "awm-database", "key": "dsn"}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (server,) = ps["containers"]
    assert server["name"] == "envserver" and server["image"] == "reg/awm-envserver:1"
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {"mcp": 8000, "control": 8001}
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "control"}
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "control"}
    # Ready a probe period after the server listens: no startup probe in front of readiness;
    # liveness tolerates a crowded node's slow start (5 minutes) instead
    assert "startupProbe" not in server and server["readinessProbe"]["periodSeconds"] == 1
    live = server["livenessProbe"]
    assert "initialDelaySeconds" not in live and live["periodSeconds"] * live["failureThreshold"] >= 300
    # The env server reads its DSN from a file and never sees the admin Secret.
    assert {e["name"] for e in server["env"]} == {"POD_NAME", "AWM_INSTANCE_DSN_FILE", "AWM_ALLOWED_HOSTS"}
    # It answers to Services in its namespace (and to its pod IP by itself), to nothing else.
    assert {e["name"]: e.get("value") for e in server["env"]}["AWM_ALLOWED_HOSTS"] == \
        f"*.{meta['namespace']}.svc,*.{meta['namespace']}.svc.cluster.local"
    assert "secretKeyRef" not in json.dumps(server)
    for c in (bundle, prov, server):
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in server["volumeMounts"]}
    assert mounts == {"/bundle": True, "/run/awm": True, "/tmp": False}
    assert server["resources"] == cfg.envserver_resources


def test_pod_manifest_carries_the_judge_and_the_gates() -> None:
    """A fleet's judge reaches its env servers as AWM_JUDGE_* (the key from its Secret, never a
    literal), with the verifier kind and the ungated switch; and the env server reads them back."""
    from awm.judge import JudgeSettings

    spec = fleet_spec(serving={"judge": {"baseUrl": "http://vllm.llm.svc:8000/v1", "model": "qwen3-8b", "votes": 3,
                                         "apiKeySecret": {"name": "judge", "key": "token"}},
                               "verifierKind": "judge", "allowUngated": True})
    (server,) = pod_manifest("train", "ns", "uid-1", spec, "crm", OperatorConfig())["spec"]["containers"]
    env = {e["name"]: e for e in server["env"]}
    assert env["AWM_JUDGE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "judge", "key": "token"}
    assert (env["AWM_VERIFIER_KIND"]["value"], env["AWM_ALLOW_UNGATED"]["value"]) == ("judge", "1")
    settings = JudgeSettings.from_env({k: v["value"] for k, v in env.items() if "value" in v})
    assert (settings.base_url, settings.model, settings.votes, settings.temperature) == (
        "http://vllm.llm.svc:8000/v1", "qwen3-8b", 3, 0.0)
    plain = pod_manifest("train", "ns", "uid-1", fleet_spec(), "crm", OperatorConfig())["spec"]["containers"][0]
    assert not [e for e in plain["env"] if e["name"].startswith(("AWM_JUDGE", "AWM_ALLOW_UNGATED"))]


def test_pod_manifest_catalog_sources() -> None:
    cfg = OperatorConfig()
    by_image = pod_manifest("f", "ns", "u", fleet_spec(catalog={"image": "my/cat:2", "path": "/data/"}), "crm", cfg)
    assert by_image["spec"]["initContainers"][0]["image"] == "my/cat:2"
    assert by_image["spec"]["initContainers"][0]["command"] == ["cp", "/data/crm.json", "/bundle/env.json"]
    by_url = pod_manifest("f", "ns", "u", fleet_spec(catalog={"url": "http://store/cat"}, template={"image": "e:3"}), "crm", cfg)
    init = by_url["spec"]["initContainers"][0]
    assert init["image"] == "e:3" and init["command"][:2] == ["python", "-c"]
    assert init["command"][3:] == ["http://store/cat", "crm", "/bundle/env.json"]
    chart_catalog = pod_manifest("f", "ns", "u", fleet_spec(), "crm", OperatorConfig(catalog_pull_policy="Always"))
    assert chart_catalog["spec"]["initContainers"][0]["imagePullPolicy"] == "Always"


def test_pod_templates_cannot_redirect_resets() -> None:
    """awm.dev/control-url and mcp-url on a pod point the operator's resets and the trainers at
    that URL: only a test operator (AWM_ENDPOINT_ANNOTATIONS) takes them from a fleet's template."""
    from awm_operator.pods import A_MCP_URL

    spec = fleet_spec(template={"annotations": {A_CONTROL_URL: "http://evil:1", A_MCP_URL: "http://evil:2/mcp",
                                                "team": "rl"}})
    ann = pod_manifest("f", "ns", "u", spec, "crm", OperatorConfig())["metadata"]["annotations"]
    assert A_CONTROL_URL not in ann and A_MCP_URL not in ann and ann["team"] == "rl"
    assert OperatorConfig.from_env({}).endpoint_annotations is False
    test_cfg = OperatorConfig.from_env({"AWM_ENDPOINT_ANNOTATIONS": "1"})
    assert pod_manifest("f", "ns", "u", spec, "crm", test_cfg)["metadata"]["annotations"][A_CONTROL_URL] == "http://evil:1"


def test_names_stay_within_kubernetes_limits() -> None:
    prefix = pod_prefix("a-very-long-fleet-name-that-goes-on-and-on", "Some_Environment.With.Odd_Chars" * 3)
    assert len(prefix) + 5 <= 63 and prefix.endswith("-") and prefix == prefix.lower()
    assert label_value("bike_shop") == "bike_shop"
    odd = label_value("x" * 80)
    assert len(odd) <= 63 and odd != label_value("x" * 81)
    assert len(provision.pod_instance_name("p" * 63)) <= 63
    assert provision.pod_instance_name("train-crm-abcde") == "awm_i_train_crm_abcde"


def test_spread() -> None:
    assert spread(10, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert spread(0, ["a"]) == {"a": 0}
    assert sum(spread(1024, [f"e{i}" for i in range(7)]).values()) == 1024
    # floors first, then the rest from the lowest up
    assert spread(18, ["a", "b", "c"], {"a": 8, "b": 4, "c": 4}) == {"a": 8, "b": 5, "c": 5}
    assert spread(10, ["a", "b", "c"], {"a": 7}) == {"a": 7, "b": 2, "c": 1}
    assert spread(3, ["a", "b"], {"a": 5}) == {"a": 5, "b": 0}  # allocated instances stay
    # the remainder goes where pods already are
    assert spread(4, ["a", "b", "c"], current={"c": 2, "b": 1}) == {"a": 1, "b": 1, "c": 2}


def test_stuck_pods_say_why() -> None:
    stuck = pod("s", ready=False)
    stuck["status"]["initContainerStatuses"] = [
        {"name": "bundle", "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
         "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                      "message": "cp: can't stat '/catalog/crmm.json': No such file or directory\n"}}},
        {"name": "provision", "state": {"waiting": {"reason": "PodInitializing"}}}]
    assert PodInfo.from_pod(stuck).problem == \
        "bundle: CrashLoopBackOff: cp: can't stat '/catalog/crmm.json': No such file or directory"
    pulling = pod("p", ready=False)
    pulling["status"]["containerStatuses"] = [{"name": "envserver", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image \"reg/awm-envserver:9\""}}}]
    assert PodInfo.from_pod(pulling).problem == 'envserver: ImagePullBackOff: Back-off pulling image "reg/awm-envserver:9"'
    starting = pod("q", ready=False)
    starting["status"]["initContainerStatuses"] = [
        {"name": "bundle", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "provision", "state": {"waiting": {"reason": "PodInitializing"}}}]
    assert PodInfo.from_pod(starting).problem is None  # on its way
    assert PodInfo.from_pod(pod("r", ready=True)).problem is None


def test_pod_info() -> None:
    info = PodInfo.from_pod(pod("a", ready=True))
    assert info.allocatable and info.mcp_url == "http://10.0.0.1:8000/mcp" and info.control_url == "http://10.0.0.1:8001"
    assert not PodInfo.from_pod(pod("c", ready=False)).allocatable
    override = PodInfo.from_pod(pod("e", **{A_CONTROL_URL: "http://127.0.0.1:9"}))
    assert override.control_url == "http://127.0.0.1:9"


def test_a_late_binding_pod_carries_the_catalog_and_a_provisioner_sidecar() -> None:
    cfg = OperatorConfig(release="rel", envserver_image="reg/awm-envserver:1", catalog_image="reg/awm-catalog:1")
    pod = pod_manifest("train", "ns", "uid-1", fleet_spec(binding="late"), "crm", cfg)
    bundle, sidecar = pod["spec"]["initContainers"]
    assert bundle["command"] == ["cp", "-r", "/catalog/.", "/bundle/"]  # the whole catalog
    # A native sidecar: it keeps running beside the env server and alone holds the admin DSN.
    assert sidecar["name"] == "provisioner" and sidecar["restartPolicy"] == "Always"
    assert sidecar["command"][:3] == ["python", "-m", "awm.postgres.provisioner"]
    assert PROVISIONER_SOCKET in sidecar["command"]
    # An abstract socket name, not a file in a shared volume (under gVisor each container sees a
    # volume through a file proxy of its own, and a socket file there is not shared).
    assert PROVISIONER_SOCKET.startswith("@")
    assert "/run/awm" not in {m["mountPath"] for m in sidecar["volumeMounts"]}
    meta = json.loads(sidecar["command"][sidecar["command"].index("--meta") + 1])
    assert meta == {"pod": "$(POD_NAME)", "fleet": "train", "namespace": "ns"}  # the orphan sweep finds them
    assert sidecar["command"][sidecar["command"].index("--spares") + 1] == "64"  # spareDatabases' default
    spareless = pod_manifest("train", "ns", "uid-1", fleet_spec(binding="late", spareDatabases=0), "crm", cfg)
    command = spareless["spec"]["initContainers"][1]["command"]
    assert command[command.index("--spares") + 1] == "0"
    assert [e["name"] for e in sidecar["env"]] == ["AWM_ADMIN_DSN", "POD_NAME"]
    assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    server = pod["spec"]["containers"][0]
    command = server["command"]
    assert command[command.index("--catalog") + 1] == "/bundle" and command[command.index("--env") + 1] == "crm"
    assert command[command.index("--provisioner") + 1] == PROVISIONER_SOCKET
    names = [e["name"] for e in server["env"]]
    assert "AWM_ADMIN_DSN" not in names and "AWM_INSTANCE_DSN_FILE" not in names
    assert all("secretKeyRef" not in json.dumps(e) for e in server["env"])  # no credential in the env server
    # A pinned fleet's pods are as they were.
    pinned = pod_manifest("train", "ns", "uid-1", fleet_spec(), "crm", cfg)
    assert [c["name"] for c in pinned["spec"]["initContainers"]] == ["bundle", "provision"]
    with pytest.raises(ValueError, match="image catalog"):
        fleet_spec(binding="late", catalog={"url": "http://catalog.example/"})


def test_fleet_security_runtime_class_and_weakening_annotations() -> None:
    """A template that unconfines the env server is refused unless the fleet says so explicitly;
    that explicit choice reaches the env server (it then accepts a node without Landlock or
    seccomp); a RuntimeClass (gVisor, Kata) comes from the chart or the fleet."""
    from awm_operator.config import OperatorConfig
    from awm_operator.crds import EnvFleetSpec
    from awm_operator.pods import pod_manifest

    base = {"environments": ["crm"], "catalog": {"image": "cat:1"}, "database": {"secretName": "db"}}
    unconfined = {"annotations": {"container.apparmor.security.beta.kubernetes.io/envserver": "unconfined"}}
    with pytest.raises(ValueError, match="allowWeakerIsolation"):
        EnvFleetSpec.model_validate({**base, "template": unconfined})
    spec = EnvFleetSpec.model_validate({**base, "template": unconfined, "security": {"allowWeakerIsolation": True}})
    cfg = OperatorConfig.from_env({"AWM_ENVSERVER_RUNTIME_CLASS": "gvisor"})
    pod = pod_manifest("f", "ns", "uid", spec, "crm", cfg)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["AWM_ALLOW_WEAK_ISOLATION"] == "1" and pod["spec"]["runtimeClassName"] == "gvisor"
    strict = EnvFleetSpec.model_validate({**base, "template": {"runtimeClassName": "kata"}})
    pod = pod_manifest("f", "ns", "uid", strict, "crm", OperatorConfig.from_env({}))
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert "AWM_ALLOW_WEAK_ISOLATION" not in env and pod["spec"]["runtimeClassName"] == "kata"
    security = pod["spec"]["containers"][0]["securityContext"]
    assert security == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                        "capabilities": {"drop": ["ALL"]}}
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
