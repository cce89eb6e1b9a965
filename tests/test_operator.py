"""The Kubernetes operator's pure parts (pod builder, allocation planning, autoscaling math,
configuration, CRDs) and the pod-side provisioning command against the real PostgreSQL.

End-to-end tests on a real control plane are in test_operator_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
import psycopg
import pytest
import yaml
from typer.testing import CliRunner

from awm.cli import app
from awm.postgres import provision
from awm_operator import databases
from awm_operator.autoscale import ScaleDownGate, desired_replicas
from awm_operator.config import OperatorConfig
from awm_operator.crds import EnvFleetSpec
from awm_operator.databases import Shard, choose_shard, shard_keys
from awm_operator.kube import ApiError
from awm_operator.ledger import Ledger, LostRace, ledger_name
from awm_operator.shards import CONFIGMAP_LIMIT, SHARD_BYTES, entry_size, place, shard_index, shard_name
from awm_operator.metrics import Metrics
from awm_operator.pods import (A_CONTROL_URL, A_ENV, PROVISIONER_SOCKET, PodInfo, label_value, pod_manifest,
                               pod_prefix, spread)
from awm_operator.state import ClaimRecord, ClaimRequest, Fleet, plan, plan_late

ROOT = Path(__file__).resolve().parent.parent


def fleet_spec(**extra) -> EnvFleetSpec:
    """A pinned fleet unless ``binding`` is given (most of these tests are about pinned pods; the
    default binding has tests of its own)."""
    return EnvFleetSpec.model_validate({"environments": ["crm", "bike_shop"], "replicas": 4, "catalog": {},
                                        "database": {"secretName": "awm-database"}, "binding": "pinned", **extra})


# --------------------------------------------------------------------------- pods


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


def _envs_fleet(envs: list[str], owned: dict[str, str] | None = None) -> Fleet:
    fleet = Fleet("ns", "f")
    for name, env in (owned or {}).items():
        fleet.update_pod(PodInfo.from_pod(pod(name, env)))
        fleet.owner[name] = "c0"
    return fleet


def _spread_then_plan(fleet: Fleet, envs: list[str], replicas: int, req: ClaimRequest) -> list[list[str]] | None:
    """What the reconciler builds for the waiting claim, then whether the claim binds on it."""
    fleet.pending["c1"] = req
    desired = spread(replicas, envs, fleet.floors(envs, replicas))
    held = {e: sum(1 for n in fleet.owner if fleet.pods[n].env == e) for e in envs}
    free = {e: [f"{e}-{i}" for i in range(desired[e] - held[e])] for e in envs}
    return plan(free, req)


def test_waiting_grpo_and_per_environment_claims_shape_the_spread() -> None:
    envs = ["crm", "bike_shop", "notes"]
    grpo = ClaimRequest(count=16, group_size=4)
    # the chart's example: autoscaled to 16 + buffer 2; an even 6/6/6 spread holds only 3 groups
    assert plan({e: [f"{e}-{i}" for i in range(6)] for e in envs}, grpo) is None
    assert len(_spread_then_plan(_envs_fleet(envs), envs, 18, grpo) or []) == 4
    assert _envs_fleet(envs).floors(envs, 18) == {"crm": 0, "bike_shop": 0, "notes": 0}
    one_env = ClaimRequest(count=8, environment="crm")
    assert len(_spread_then_plan(_envs_fleet(envs), envs, 10, one_env) or []) == 1
    # allocated instances count where they are; groups go to the least loaded environments
    busy = _envs_fleet(envs, {f"c{i}": "crm" for i in range(6)})
    busy.pending["c1"] = ClaimRequest(count=8, group_size=4)
    assert busy.floors(envs, 16) == {"crm": 6, "bike_shop": 4, "notes": 4}
    assert len(_spread_then_plan(busy, envs, 16, ClaimRequest(count=8, group_size=4)) or []) == 2
    # within replicas: a fleet that is not autoscaled never grows past them for a claim, and a
    # claim that cannot fit (all-or-nothing) does not strip the other environments
    capped = _envs_fleet(envs)
    capped.pending["c1"] = one_env
    assert capped.floors(envs, 5) == {"crm": 0, "bike_shop": 0, "notes": 0}
    capped.pending["c1"] = ClaimRequest(count=4, environment="crm")
    assert capped.floors(envs, 5) == {"crm": 4, "bike_shop": 0, "notes": 0}
    # groups go where unallocated pods already are: no pod is deleted in one environment to be
    # created in another
    warm = _envs_fleet(envs)
    for i in range(4):
        warm.update_pod(PodInfo.from_pod(pod(f"n{i}", "notes")))
    warm.update_pod(PodInfo.from_pod(pod("b0", "bike_shop")))
    warm.pending["c1"] = ClaimRequest(count=4, group_size=4)
    assert warm.floors(envs, 5) == {"crm": 0, "bike_shop": 0, "notes": 4}
    assert spread(5, envs, warm.floors(envs, 5), {"bike_shop": 1, "notes": 4}) == {"crm": 0, "bike_shop": 1, "notes": 4}
    # an older claim for one environment uses its free pods first: the group goes elsewhere
    full = _envs_fleet(envs)
    for env, n in (("crm", 5), ("bike_shop", 4), ("notes", 4)):
        for i in range(n):
            full.update_pod(PodInfo.from_pod(pod(f"{env}{i}", env)))
    full.pending["c1"] = ClaimRequest(count=4, environment="crm")
    full.pending["c2"] = ClaimRequest(count=4, group_size=4)
    floors = full.floors(envs, 13)
    assert floors["crm"] == 4 and sorted(floors.values()) == [0, 4, 4]
    assert spread(13, envs, floors, {"crm": 5, "bike_shop": 4, "notes": 4}) == {"crm": 5, "bike_shop": 4, "notes": 4}


def pod(name: str, env: str = "crm", ready: bool = True, rv: int = 1, **annotations: str) -> dict:
    ann = {A_ENV: env, **annotations}
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": {}, "annotations": ann},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_environment_selector_chooses_from_the_index() -> None:
    from awm_operator.catalog_index import index_names
    from awm_operator.crds import EnvironmentSelector

    names = index_names({"environments": [{"name": n} for n in ("crm", "bike_shop", "crm_lite", "hotel", "car_shop")]})
    assert EnvironmentSelector().select(names) == ["bike_shop", "car_shop", "crm", "crm_lite", "hotel"]
    sel = EnvironmentSelector.model_validate({"matchNames": ["crm*", "*_shop"], "excludeNames": ["car_*"], "limit": 3})
    assert sel.select(names) == ["bike_shop", "crm", "crm_lite"]
    for bad in ({"environments": "crm"}, {"environments": [{"tasks": 3}]}, ["crm"]):
        with pytest.raises(ValueError, match="not a catalog index"):
            index_names(bad)
    # one way to choose, and a selector needs an index to choose from
    with pytest.raises(ValueError, match="either environments or environmentSelector"):
        fleet_spec(environmentSelector={"matchNames": ["crm*"]}, catalog={"url": "http://c"})
    with pytest.raises(ValueError, match="either environments or environmentSelector"):
        fleet_spec(environments=[])
    with pytest.raises(ValueError, match="needs catalog.url or catalog.indexConfigMap"):
        fleet_spec(environments=[], environmentSelector={})
    with pytest.raises(ValueError, match="minReplicas must not exceed maxReplicas"):
        fleet_spec(minReplicas=5, maxReplicas=4)
    spec = fleet_spec(environments=[], environmentSelector={"matchNames": ["crm*"]}, catalog={"indexConfigMap": "idx"})
    assert ClaimRequest(2, "crm").problem(spec, None) is None  # not resolved yet: no verdict
    assert ClaimRequest(2, "hotel").problem(spec, ["crm", "crm_lite"]) == "environment 'hotel' is not in the fleet"


async def test_an_oversized_or_broken_index_is_refused() -> None:
    """The operator reads a catalog's index.json over HTTP: an answer larger than the cap or not
    an index is an error on the fleet, not a memory blow-up or a crash."""
    import aiohttp
    from aiohttp import web

    from awm_operator import catalog_index
    from awm_operator.crds import CatalogSource

    bodies = {"/big/index.json": b" " * (catalog_index.MAX_INDEX_BYTES + 1),
              "/bad/index.json": b'{"environments": 3}',
              "/ok/index.json": b'{"environments": [{"name": "crm"}]}'}
    app = web.Application()
    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=bodies[request.path]) if request.path in bodies else web.Response(status=404)

    app.router.add_get("/{kind}/index.json", serve)
    runner, url = await serve_app(app)
    try:
        async with aiohttp.ClientSession() as http:
            async def read(kind: str) -> list[str]:
                return await catalog_index.read_index(None, http, "ns", CatalogSource(url=f"{url}/{kind}"))  # type: ignore[arg-type]
            assert await read("ok") == ["crm"]
            with pytest.raises(ValueError, match="larger than 8 MiB"):
                await read("big")
            with pytest.raises(ValueError, match="not a catalog index"):
                await read("bad")
            with pytest.raises(ValueError, match="HTTP 404"):
                await read("none")
    finally:
        await runner.cleanup()


async def test_selector_reads_run_beside_the_reconcile_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index is read in a background task: the pass goes on without it; a selector changed
    mid-read cancels the old read (its answer never lands); an error shows until the selector
    is dropped for a list."""
    from types import SimpleNamespace

    from awm_operator import reconcile
    from awm_operator.reconcile import Context, Reconciler

    gates: dict[str, asyncio.Event] = {}
    answers = {"c": ["crm", "crm_lite", "hotel"], "broken": ValueError("ConfigMap broken is missing")}

    async def fake_read(kube, http, namespace, catalog):  # noqa: ANN001, ANN202
        name = catalog.index_config_map
        gates[name] = gate = asyncio.Event()
        await gate.wait()
        if isinstance(answers[name], Exception):
            raise answers[name]
        return answers[name]

    monkeypatch.setattr(reconcile, "read_index", fake_read)
    ctx = Context(kube=None, allocator=SimpleNamespace(http=None), metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    fleet = Fleet("ns", "f")
    rec = Reconciler(fleet, ctx)

    def use(**spec: object) -> None:
        fleet.spec = fleet_spec(**spec)

    use(environments=[], environmentSelector={"matchNames": ["crm*"]}, catalog={"indexConfigMap": "c"})
    assert await rec.environments(0.0) is None and rec.index_task is not None  # not waited for
    await asyncio.sleep(0)
    old = rec.index_task
    use(environments=[], environmentSelector={"matchNames": ["hotel"]}, catalog={"indexConfigMap": "c"})
    assert await rec.environments(1.0) is None
    await asyncio.sleep(0)
    assert old.cancelled() and rec.index_task is not old
    gates["c"].set()
    await rec.index_task
    assert await rec.environments(2.0) == ["hotel"] and rec.index_task is None  # fresh: no new read
    use(environments=[], environmentSelector={"matchNames": ["hotel"]}, catalog={"indexConfigMap": "broken"})
    assert await rec.environments(3.0) is None  # another catalog: the old choice is not its answer
    await asyncio.sleep(0)
    gates["broken"].set()
    await rec.index_task
    assert rec.index_error == "catalog index: ConfigMap broken is missing" and fleet.selected is None
    use()
    assert await rec.environments(4.0) == ["crm", "bike_shop"]
    assert rec.index_error is None and fleet.selected is None and rec.index_read == ("", 0.0)


async def test_a_pass_replaces_its_wake_up_timer() -> None:
    """Every pass over a fleet holding claims with a TTL asks to be woken at the next expiry: one
    timer, replaced by the next pass, not one more per pass (a busy 4,096-instance fleet makes
    several passes a second, for hours)."""
    from awm_operator.reconcile import Context, Reconciler

    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    fleet = ledger_fleet(2)
    fleet.assign("api_1", ClaimRecord([["p0"]], expires=time.time() + 3600))
    rec = Reconciler(fleet, ctx)
    handles = []
    for i in range(5):
        rec.release_orphans(float(i))
        handles.append(rec.timers["expiry"])
    assert len(rec.timers) == 1 and all(h.cancelled() for h in handles[:-1]) and not handles[-1].cancelled()
    handles[-1].cancel()


async def test_the_operator_connects_to_free_pods_ahead_of_their_claims() -> None:
    """Each free ready pod gets a kept connection before its first claim, in the background (a
    step's first binds would otherwise connect to every pod); pods a claim holds, pods not ready
    and pods that refuse are left, a second round opens nothing more, and a round a pod refused
    holds the next one off for a while (such pods would cost a round every pass)."""
    import socket
    from types import SimpleNamespace

    from awm_operator import reconcile
    from awm_operator.podhttp import PodHttp
    from awm_operator.reconcile import Context, Reconciler

    with socket.socket() as s:  # a port nobody listens on: the pod that refuses
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]
    connections: list[int] = []
    requests: list[bytes] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:  # keep-alive: answer every request on the connection
                head = await reader.readuntil(b"\r\n\r\n")
                requests.append(head.split(b"\r\n", 1)[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    fleet = Fleet("ns", "f", uid="u1")
    for i in range(4):  # one address for all (a benchmark's stub): one connection per free pod
        fleet.update_pod(PodInfo.from_pod(pod(f"p{i}", **{A_CONTROL_URL: url})))
    fleet.update_pod(PodInfo.from_pod(pod("starting", ready=False, **{A_CONTROL_URL: url})))
    fleet.update_pod(PodInfo.from_pod(pod("gone", **{A_CONTROL_URL: f"http://127.0.0.1:{refused}"})))
    fleet.assign("c1", ClaimRecord([["p3"]]))
    http = PodHttp()
    rec = Reconciler(fleet, Context(kube=None, allocator=SimpleNamespace(pods=http), metrics=None,  # type: ignore[arg-type]
                                    config=OperatorConfig()))
    try:
        rec.connect_ahead()
        await asyncio.wait_for(rec.connect_task, 10)  # type: ignore[arg-type]
        assert len(connections) == 3 and http.idle_count(url) == 3
        assert set(requests) == {b"GET /healthz HTTP/1.1"}
        first = rec.connect_task
        rec.connect_ahead()  # the refusing pod backs the rounds off: none for a while
        assert rec.connect_task is first
        rec.connect_quiet_until -= reconcile.CONNECT_AHEAD_BACKOFF_S
        rec.connect_ahead()  # all the others kept: the refusing pod is tried again, only it
        await asyncio.wait_for(rec.connect_task, 10)  # type: ignore[arg-type]
        assert rec.connect_task is not first and len(connections) == 3
        fleet.remove_pod("gone")
        fleet.unassign("c1")  # p3 is free now
        rec.connect_quiet_until -= reconcile.CONNECT_AHEAD_BACKOFF_S  # (the refusing pod's last back-off)
        rec.connect_ahead()
        await asyncio.wait_for(rec.connect_task, 10)  # type: ignore[arg-type]
        assert len(connections) == 4 and http.idle_count(url) == 4
    finally:
        await http.close()
        server.close()


class _Stopped:
    """kopf's DaemonStopped, as much of it as Reconciler.run uses."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self) -> None:
        await self.event.wait()


async def test_a_failed_pass_is_retried_not_the_end_of_the_fleet(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that raises (an API request timing out, a dropped connection) is logged and the
    next pass follows after a back-off; the fleet's daemon keeps running (ending it would leave
    the fleet unattended until kopf restarts the daemon, 60 s later)."""
    from awm_operator import reconcile
    from awm_operator.reconcile import Context, Reconciler

    monkeypatch.setattr(reconcile, "RETRY_BASE_S", 0.05)
    ctx = Context(kube=None, allocator=None, metrics=Metrics(), config=OperatorConfig(reconcile_min_interval=0.0))  # type: ignore[arg-type]
    fleet = Fleet("ns", "f")
    fleet.spec = fleet_spec()
    rec = Reconciler(fleet, ctx)
    passes: list[str] = []
    done = asyncio.Event()

    async def take_over(stopped: object) -> bool:
        return True

    async def flaky_pass() -> bool:
        passes.append("x")
        if len(passes) <= 2:
            raise asyncio.TimeoutError("the API server did not answer")
        done.set()
        return False

    monkeypatch.setattr(rec, "take_over", take_over)
    monkeypatch.setattr(rec, "reconcile", flaky_pass)
    stopped = _Stopped()
    daemon = asyncio.create_task(rec.run(stopped))
    await asyncio.wait_for(done.wait(), 60)  # a watchdog: without the retry this never happens
    assert len(passes) == 3 and not daemon.done()
    stopped.event.set()
    fleet.poke()
    await asyncio.wait_for(daemon, 60)


async def test_the_database_sweep_never_holds_up_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dropping the databases of deleted pods runs beside the pass, one sweep at a time: a
    database server that hangs leaves the fleet's pods and status going."""
    import threading

    from awm_operator import reconcile
    from awm_operator.reconcile import Context, Reconciler

    release = threading.Event()
    sweeps: list[set[str]] = []

    def hanging_drop(dsn: str, namespace: str, fleet_name: str, live: set[str]) -> list[str]:
        sweeps.append(live)
        release.wait(60)
        return ["awm_i_gone"]

    async def shards(kube: object, fleet: object) -> dict[str, Shard]:
        return {"default": Shard("default", "dsn", "host=db")}

    monkeypatch.setattr(reconcile.databases, "drop_orphans", hanging_drop)
    monkeypatch.setattr(reconcile, "read_shards", shards)
    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig(db_sweep_interval=1.0))  # type: ignore[arg-type]
    ctx.started -= 60
    fleet = ledger_fleet(2)
    rec = Reconciler(fleet, ctx)
    rec.last_sweep -= 10
    await rec.sweep_databases(time.monotonic())  # returns while the sweep hangs
    task = rec.sweep_task
    assert task is not None and not task.done()
    rec.last_sweep -= 10
    await rec.sweep_databases(time.monotonic())  # due again, but one is in flight
    assert rec.sweep_task is task
    release.set()
    await asyncio.wait_for(task, 60)
    assert rec.sweep_task is None and sweeps == [{"p0", "p1"}]
    for timer in rec.timers.values():
        timer.cancel()


def test_conditions_keep_their_transition_time_while_their_status_stays() -> None:
    from awm_operator.conditions import claim_conditions, condition

    first = condition("Ready", False, "Reconciling", "0 of 2", generation=3, at="2026-01-01T00:00:00Z")
    assert first.model_dump(by_alias=True) == {
        "type": "Ready", "status": "False", "reason": "Reconciling", "message": "0 of 2",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}
    same = condition("Ready", False, "PodsFailing", "1 of 2", previous=[first], at="2026-01-02T00:00:00Z")
    assert same.last_transition_time == "2026-01-01T00:00:00Z"  # a new reason or message is no transition
    flipped = condition("Ready", True, "AllReady", "2 of 2", previous=[same], at="2026-01-03T00:00:00Z")
    assert flipped.last_transition_time == "2026-01-03T00:00:00Z"
    assert condition("X", None, "Probing", "").status == "Unknown"
    # previous conditions as read from an object count the same; one that is not a condition is ignored
    read = condition("Ready", True, "AllReady", "2 of 2", at="2026-01-04T00:00:00Z", previous=[
        {"type": "Ready", "bogus": 1},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-03T00:00:00Z"}])
    assert read.last_transition_time == "2026-01-03T00:00:00Z"
    # an EnvClaim: Bound while Bound or Degraded (its time kept from Bound), Degraded when instances were lost
    bound = claim_conditions("Bound", "2 instances bound", generation=1)
    assert [(c.type, c.status, c.reason) for c in bound] == [("Bound", "True", "Bound"),
                                                             ("Degraded", "False", "AllInstances")]
    degraded = claim_conditions("Degraded", "1 of 2 instances lost: p", bound)
    assert [(c.type, c.status, c.reason) for c in degraded] == [("Bound", "True", "Bound"),
                                                                ("Degraded", "True", "InstancesLost")]
    assert degraded[0].last_transition_time == bound[0].last_transition_time
    for phase, reason in (("Pending", "Waiting"), ("Failed", "Failed"), ("Expired", "Expired")):
        assert claim_conditions(phase, "")[0].reason == reason and claim_conditions(phase, "")[0].status == "False"


def test_status_is_written_as_the_kinds_typed_status() -> None:
    """Every status write is one of the kinds' status models: only the fields given go into the
    merge patch (a progress report does not reset the phase), by their API names, a None set on
    purpose is written as null (it removes the field), and a value the kind does not have is an
    error in the operator rather than a field the API server silently prunes."""
    from pydantic import ValidationError

    from awm_operator.conditions import condition
    from awm_operator.crds import CampaignStatus, EnvClaimStatus, EnvFleetStatus, ShardStatus

    assert CampaignStatus.model_validate({"step": 3, "rewardMean": 0.5}).patch() == {"step": 3, "rewardMean": 0.5}
    cond = condition("Ready", True, "AllReady", "2 of 2", at="2026-01-01T00:00:00Z")
    fleet = EnvFleetStatus(ready=2, environments=None, conditions=[cond],
                           shards=[ShardStatus(name="default", state="Down", message="refused")])
    assert fleet.patch() == {
        "ready": 2, "environments": None,
        "shards": [{"name": "default", "state": "Down", "instances": 0, "message": "refused"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "2 of 2",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    claim = EnvClaimStatus(phase="Bound", instances=[{"pod": "p", "environment": "crm", "mcpUrl": "http://p/mcp",
                                                      "controlUrl": "http://p:8001"}], latency_ms=1.5)
    assert claim.patch()["instances"][0]["mcpUrl"] == "http://p/mcp" and claim.patch()["latencyMs"] == 1.5
    for bad in ({"phase": "Bond"}, {"boundAt": 3, "phase": "Bound", "lost": "p"}, {"instances": [{"pod": "p"}]},
                {"readyy": 1}):
        with pytest.raises(ValidationError):
            EnvClaimStatus.model_validate(bad)


def test_database_shards_are_the_secrets_dsn_keys() -> None:
    """Key `dsn` is the shard `default` (one server, as before shards); `dsn-<name>` are more;
    other keys (the chart's postgres-password) and names that are no label value are not shards."""
    keys = ["dsn", "dsn-1", "dsn-east-2", "postgres-password", "dsn-", "dsn-UPPER", "dsn-a_b", "dsnx"]
    assert shard_keys(keys) == {"1": "dsn-1", "default": "dsn", "east-2": "dsn-east-2"}


def test_a_new_pod_goes_to_the_up_shard_with_the_most_free_connection_slots() -> None:
    a = Shard("a", "dsn-a", "host=a", up=True, max_connections=100, connections=10)
    b = Shard("b", "dsn-b", "host=b", up=True, max_connections=100, connections=40)
    assert choose_shard([a, b], {}).name == "a"
    # pods placed on a and not Ready yet count as the slots they will take (2 each)
    assert choose_shard([a, b], {"a": 16}).name == "b"
    assert choose_shard([a, b], {"a": 15}).name == "a"
    # a shard that is down, lost or never probed takes none; ties go to the first by name
    b.up = False
    assert choose_shard([a, b], {"a": 44}).name == "a" and choose_shard([a, b], {"a": 45}) is None  # 100-10-90 < 2
    c = Shard("c", "dsn-c", "host=c", up=None)
    assert choose_shard([c], {}) is None and choose_shard([], {}) is None
    d = Shard("d", "dsn-d", "host=d", up=True, max_connections=100, connections=10)
    b.up = True
    b.connections = 10
    assert choose_shard([d, b, a], {}).name == "a"


def test_a_shard_is_lost_after_failing_its_probes_for_long_enough() -> None:
    s = Shard("a", "dsn-a", "host=a")
    assert s.observe((100, 3), now=0.0, lost_after=30) and s.up and s.connections == 3
    assert s.observe(OSError("connection refused"), now=1.0, lost_after=30)  # up -> down
    assert not s.up and not s.lost and "connection refused" in s.error
    assert not s.observe(OSError("refused"), now=20.0, lost_after=30)        # still down
    assert s.observe(OSError("refused"), now=31.0, lost_after=30) and s.lost  # 30 s after the first failure
    assert s.observe((100, 0), now=40.0, lost_after=30)                        # back: up, not lost
    assert s.up and not s.lost and s.down_since is None and s.error == ""


async def test_claims_nudge_the_reconciler_pods_poke_it() -> None:
    """A claim bound or released changes only the status's counts: it wakes the reconciler
    without urgency (a pass within the status interval); a pod event is urgent."""
    fleet = ledger_fleet(2)
    fleet.wake.clear()
    fleet.urgent = False
    fleet.assign("c1", ClaimRecord([["p0"]]))
    fleet.unassign("c1")
    assert fleet.wake.is_set() and not fleet.urgent
    fleet.update_pod(PodInfo.from_pod(pod("p2")))
    assert fleet.urgent


async def test_releasing_a_holders_claims_waits_for_the_ledger() -> None:
    """Until the fleet's claims are read from its ledger, "this holder holds nothing" would be a
    guess that leaves a dead trainer's instances allocated until their TTL: the answer is 503."""
    from aiohttp.test_utils import TestClient, TestServer

    from awm_operator.api import build_api
    from awm_operator.reconcile import Context
    from awm_operator.state import Fleets

    fleets = Fleets()
    fleet = fleets.ensure("ns", "f")
    fleet.spec = fleet_spec()
    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    async with TestClient(TestServer(build_api(ctx, fleets))) as client:
        url = "/v1/namespaces/ns/envfleets/f/claims"
        r = await client.delete(url, params={"holder": "campaign/c"})
        assert r.status == 503 and "not loaded yet" in (await r.json())["error"]
        fleet.active, fleet.ledger = True, object()  # type: ignore[assignment]
        r = await client.delete(url, params={"holder": "campaign/c"})
        assert r.status == 200 and (await r.json())["released"] == []
        r = await client.delete(url)
        assert r.status == 400 and "holder= is required" in (await r.json())["error"]


def operator_fleet():  # type: ignore[no-untyped-def]
    """An in-memory fleet with a ready, a claimed (held by a campaign) and a starting instance."""
    from awm_operator.pods import PodInfo
    from awm_operator.state import ClaimRecord, Fleets

    fleets = Fleets()
    fleet = fleets.ensure("ns", "f")
    fleet.spec = fleet_spec()
    for name, env, ready in (("f-crm-0", "crm", True), ("f-crm-1", "crm", True), ("f-bike-0", "bike_shop", False)):
        fleet.update_pod(PodInfo(name, env, ready, "Running" if ready else "Pending", "10.0.0.1", False, 1,
                                 "http://10.0.0.1:8000/mcp", "http://10.0.0.1:8001",
                                 None if ready else "envserver: CrashLoopBackOff"))
    fleet.assign("api_1", ClaimRecord([["f-crm-1"]], holder="campaign/c", owner="system:serviceaccount:ns:t"))
    return fleets


async def test_the_instance_list_says_state_claim_and_holder() -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from awm_operator.api import build_api
    from awm_operator.reconcile import Context

    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    async with TestClient(TestServer(build_api(ctx, operator_fleet()))) as client:
        body = await (await client.get("/v1/namespaces/ns/envfleets/f/instances")).json()
        assert [(i["pod"], i["environment"], i["state"], i["claim"], i["holder"]) for i in body["instances"]] == [
            ("f-bike-0", "bike_shop", "starting", None, None), ("f-crm-0", "crm", "ready", None, None),
            ("f-crm-1", "crm", "allocated", "api_1", "campaign/c")]
        assert body["instances"][0]["problem"] == "envserver: CrashLoopBackOff"
        (claim,) = body["claims"]
        assert (claim["id"], claim["holder"], claim["instances"], claim["expiresInSeconds"]) == ("api_1", "campaign/c", 1, None)
        assert (await client.get("/v1/namespaces/ns/envfleets/nope/instances")).status == 404


async def test_the_client_asks_again_when_a_standby_answers() -> None:
    """Behind one Service, a standby replica answers 503 and does nothing: the client asks again,
    each time on a connection that closes after its answer, until the active one answers; other
    errors are not retried, and an operator that does not answer is OperatorUnreachable."""
    import socket

    from aiohttp.test_utils import TestServer

    from awm.episode.allocation import AllocationClient, AllocationError, OperatorUnreachable

    seen: list[tuple[str, str | None, str]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.method, request.headers.get("Connection"), request.headers.get("Authorization", "")))
        if len(seen) <= 2:
            return web.json_response({"error": "this operator replica is a standby"}, status=503)
        if request.method == "DELETE":
            return web.json_response({"error": "no such claim"}, status=404)
        return web.json_response({"id": "api_1", "instances": []}, status=201)

    app = web.Application()
    app.router.add_route("*", "/v1/namespaces/ns/envfleets/f/claims", handler)
    app.router.add_route("*", "/v1/namespaces/ns/envfleets/f/claims/{id}", handler)
    async with TestServer(app) as server:
        async with AllocationClient(str(server.make_url("")), "ns", "f", token="t0ken") as alloc:
            assert (await alloc.claim(count=1))["id"] == "api_1"
            assert [(m, c) for m, c, _ in seen] == [("POST", None), ("POST", "close"), ("POST", "close")]
            assert {a for _, _, a in seen} == {"Bearer t0ken"}
            seen.clear()
            seen.extend([("x", None, "")] * 2)  # no more standbys
            with pytest.raises(AllocationError) as err:
                await alloc.release("api_1")
            assert err.value.status == 404 and len(seen) == 3
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused
        async with AllocationClient(f"http://127.0.0.1:{s.getsockname()[1]}", "ns", "f") as alloc:
            with pytest.raises(OperatorUnreachable, match="claims"):
                await alloc.claim(count=1)


async def test_a_standby_answer_cuts_no_other_request_of_a_shared_client() -> None:
    """A trainer's episodes claim at once through one client. One of them meeting a standby must
    not cut the others' requests (an answer lost after the operator bound the claim leaves it held
    by nobody until its TTL): the operator closes the connection it answered 503 on, and the
    client asks again on a new one, leaving the others alone."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from awm.episode.allocation import AllocationClient
    from awm_operator.api import unavailable_closes

    standby_once: list[str] = []

    async def claims(request: web.Request) -> web.Response:
        env = (await request.json())["environment"]
        if env == "slow":
            await asyncio.sleep(0.5)
        elif not standby_once:
            standby_once.append(env)
            raise web.HTTPServiceUnavailable(text='{"error": "this operator replica is a standby"}',
                                             content_type="application/json")
        return web.json_response({"id": f"api_{env}", "instances": []}, status=201)

    app = web.Application(middlewares=[unavailable_closes])
    app.router.add_post("/v1/namespaces/ns/envfleets/f/claims", claims)
    async with TestServer(app) as server:
        async with AllocationClient(str(server.make_url("")), "ns", "f") as alloc:
            slow = asyncio.ensure_future(alloc.claim(environment="slow"))
            await asyncio.sleep(0.1)
            assert (await alloc.claim(environment="fast"))["id"] == "api_fast"
            assert (await slow)["id"] == "api_slow" and standby_once == ["fast"]
        async with aiohttp.ClientSession() as http:  # the standby's answer closes its connection
            standby_once.clear()
            async with http.post(server.make_url("/v1/namespaces/ns/envfleets/f/claims"), json={"environment": "x"}) as r:
                assert r.status == 503 and r.headers.get("Connection", "").lower() == "close"
            async with http.post(server.make_url("/v1/namespaces/ns/envfleets/f/claims"), json={"environment": "x"}) as r:
                assert r.status == 201 and r.headers.get("Connection", "").lower() != "close"


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


def test_fleets_bind_late_by_default_except_over_a_catalog_url() -> None:
    """Late binding is the default path: a fleet that does not say `binding` binds late with a
    catalog image, and is pinned over catalog.url (which late binding does not support yet)."""
    from awm_operator.api import fleet_summary
    from awm_operator.crds import binding_of
    from awm_operator.state import Fleets

    def spec(**extra) -> EnvFleetSpec:
        return EnvFleetSpec.model_validate({"environments": ["crm"], "database": {"secretName": "db"}, **extra})

    assert spec(catalog={}).late and spec(catalog={"image": "reg/cat:1"}).late
    assert not spec(catalog={"url": "http://catalog.example/"}).late
    assert not spec(catalog={}, binding="pinned").late and spec(catalog={}, binding="late").late
    assert [binding_of(b, u) for b, u in ((None, None), (None, "http://c/"), ("pinned", None), ("late", None))] == [
        "late", "pinned", "pinned", "late"]
    cfg = OperatorConfig(release="rel", envserver_image="reg/awm-envserver:1", catalog_image="reg/awm-catalog:1")
    pod = pod_manifest("f", "ns", "uid-1", spec(catalog={}), "crm", cfg)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["bundle", "provisioner"]  # a late pod
    # `GET .../envfleets` reports the binding the fleet has, given or not.
    meta = {"namespace": "ns", "name": "f"}
    rows = [fleet_summary({"metadata": meta, "spec": s}, Fleets()) for s in
            ({"catalog": {}}, {"catalog": {"url": "http://c/"}}, {"catalog": {}, "binding": "pinned"})]
    assert [r["binding"] for r in rows] == ["late", "pinned", "pinned"]


def test_plan_late_prefers_pods_that_serve_the_environment() -> None:
    """A late fleet files its free pods under the environment each serves now (its last switch),
    so that a claim finds the pods that serve it at once, whatever the fleet's size."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "b3"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("c1", ClaimRecord([["a2", "b2"]]))
    fleet.switched("a2", "crm")  # switched while held: filed under crm once free
    fleet.unassign("c1")
    fleet.switched("b2", "crm")  # free already (a claim released while its pods switched)
    assert dict(fleet.available) == {"a": {"a1": None}, "b": {"b1": None, "b3": None},
                                     "crm": {"a2": None, "b2": None}}
    available = fleet.available
    (group,) = plan_late(available, ClaimRequest(2, environment="crm"))
    assert sorted(group) == ["a2", "b2"]  # a repeat claim: no switch
    groups = plan_late(available, ClaimRequest(4, environment="crm", group_size=2))
    assert groups is not None and [len(g) for g in groups] == [2, 2] and {"a2", "b2"} == set(groups[0])
    assert plan_late(available, ClaimRequest(6, environment="crm")) is None  # all or nothing
    assert len(plan_late(available, ClaimRequest(5, environment="zzz"))[0]) == 5  # any pod serves it
    # without an environment: as plan() (groups of one environment each, the one served now)
    assert plan_late(available, ClaimRequest(2, group_size=2)) == plan(available, ClaimRequest(2, group_size=2))
    fleet.reserve(["a2"])
    assert "a2" not in fleet.available["crm"]
    fleet.unreserve(["a2"])
    fleet.remove_pod("a2")  # gone: from under what it served, and its switch forgotten
    assert "a2" not in fleet.available["crm"] and "a2" not in fleet.bound_env


def test_a_claim_lands_on_free_pods_that_keep_its_environment() -> None:
    """A late pod keeps the environments it served (its answers' cached_envs): a claim of one of
    them lands on such a pod, after those that serve it and before any other (a reset there, not
    a new database); pods made ready for another environment stay last. The index follows the
    pods as they are held, released, refiled and removed, and counts toward a preparation."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "c1"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.switched("a1", "a", ["x", "a"])
    fleet.switched("b1", "b", ["y", "x", "b"])
    fleet.switched("b2", "b", ["y", "b"])
    assert {e: set(n) for e, n in fleet.holding.items()} == {"x": {"a1", "b1"}, "y": {"b1", "b2"}}

    def claim(env: str, count: int, group_size: int | None = None) -> list[list[str]] | None:
        return plan_late(fleet.available, ClaimRequest(count, environment=env, group_size=group_size),
                         fleet.prepared, fleet.holding)

    assert sorted(claim("x", 2)[0]) == ["a1", "b1"]
    (group,) = claim("x", 3)
    assert sorted(group[:2]) == ["a1", "b1"] and group[2] in {"a2", "b2", "c1"} and len(set(group)) == 3
    (group,) = claim("b", 3)  # serving it first, then one that keeps... none: any other
    assert set(group[:2]) == {"b1", "b2"} and len(set(group)) == 3
    assert len(set(claim("x", 5)[0])) == 5 and claim("x", 6) is None  # never a pod twice
    fleet.mark_prepared("b1", "z")  # made ready for z: kept for it, last for x
    (group,) = claim("x", 4)
    assert group[0] == "a1" and "b1" not in group
    assert claim("x", 5)[0][-1] == "b1"
    fleet.reserve(["a1"])  # taken: not free, not holding
    assert set(fleet.holding["x"]) == {"b1"} and "a1" not in fleet.available["a"]
    fleet.unreserve(["a1"])
    assert set(fleet.holding["x"]) == {"a1", "b1"}
    fleet.assign("held", ClaimRecord([["a1", "b2"]]))
    assert set(fleet.holding["x"]) == {"b1"} and set(fleet.holding["y"]) == {"b1"}
    fleet.reported("a1", "x", ["a", "x"])  # released: its client had switched it to x
    fleet.unassign("held")
    assert "a1" in fleet.available["x"] and set(fleet.holding["a"]) == {"a1"} and "a1" not in fleet.holding["x"]
    # a free pod that keeps x counts toward x's preparation, and is not taken for another one
    assert fleet.to_prepare({"x": 1}) == {}
    chosen = fleet.to_prepare({"y": 2})  # b2 keeps it (b1 too, but b1 is made ready for z)
    assert len(chosen) == 1 and "b2" not in chosen
    assert "b2" not in fleet.to_prepare({"y": 3, "w": 1})
    fleet.holds("b2", [])
    assert "y" not in fleet.holding or "b2" not in fleet.holding["y"]
    fleet.remove_pod("b1")
    assert "b1" not in fleet.cached and all("b1" not in names for names in fleet.holding.values())


def test_grpo_steps_over_a_catalog_land_more_groups_on_pods_that_keep_their_environment() -> None:
    """bench/late_cache.py in small: GRPO steps of random environments planned by the operator's
    own state, each pod keeping its last 4; planned with the pods' caches, more of the bound pods
    keep their group's environment (a reset) than when any free pod is taken (a new database)."""
    from bench.late_cache import simulate

    shape = dict(pods=128, envs=40, groups=8, group_size=16, cache=4, steps=30, warmup=10, seed=1)
    before = simulate(**shape, cache_aware=False)["share"]
    now = simulate(**shape, cache_aware=True)["share"]
    assert now["cached"] > before["cached"] + 0.1 and now["new"] < before["new"], (before, now)


def test_pods_made_ready_ahead_are_filed_under_that_environment() -> None:
    """The allocation API's prepare: pods that serve or are made ready for an environment count
    toward it; the others come from free pods of environments not wanted, then from held pods;
    a prepared pod is filed under its environment until it is switched to anything."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "c1", "c2"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("held", ClaimRecord([["c1", "c2"]]))
    assert fleet.to_prepare({"a": 2}) == {}  # two free pods serve it already
    # a: one more; b: served already; x: two. No free pod of an environment not wanted is
    # left, so the held pods, as far as they go (a best effort: claims switch otherwise).
    assert fleet.to_prepare({"a": 3, "b": 1, "x": 2}) == {"c1": "a", "c2": "x"}
    fleet = Fleet("ns", "f")
    for name in ("a1", "b1", "b2", "c1"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("held", ClaimRecord([["c1"]]))
    chosen = fleet.to_prepare({"x": 3, "a": 1})
    assert chosen == {"b1": "x", "b2": "x", "c1": "x"}  # b's free pods (b not wanted), then the held one
    for name, env in chosen.items():
        fleet.mark_prepared(name, env)
    assert dict(fleet.available) == {"a": {"a1": None}, "x": {"b1": None, "b2": None}}
    # filed under x (a GRPO group claim naming no environment switches it to x), serving b still
    assert (fleet.key_of("b1"), fleet.env_of("b1")) == ("x", "b")
    assert fleet.to_prepare({"x": 3}) == {}  # two free and one held pod are on it
    assert fleet.to_prepare({"y": 2}) == {"a1": "y"}  # told next: the pods made ready for x keep it
    (group,) = plan_late(fleet.available, ClaimRequest(2, environment="x"), fleet.prepared)
    assert sorted(group) == ["b1", "b2"]  # the claim lands where it is ready
    # a claim of another environment takes pods made ready for nothing first
    assert plan_late(fleet.available, ClaimRequest(1, environment="z"), fleet.prepared) == [["a1"]]
    (group,) = plan_late(fleet.available, ClaimRequest(3, environment="z"), fleet.prepared)
    assert group[0] == "a1" and set(group[1:]) == {"b1", "b2"}
    fleet.unassign("held")
    assert set(fleet.available["x"]) == {"b1", "b2", "c1"}  # released: filed under what it made ready
    fleet.switched("b1", "a")  # claimed for another environment: the preparation is forgotten
    assert "b1" not in fleet.prepared and set(fleet.available["a"]) == {"a1", "b1"}
    fleet.mark_prepared("b2", None)  # the pod failed to make it ready
    assert set(fleet.available["x"]) == {"c1"} and set(fleet.available["b"]) == {"b2"}
    fleet.remove_pod("c1")
    assert "c1" not in fleet.prepared and "x" not in fleet.available


# --------------------------------------------------------------------------- allocation


def test_plan_single_instances_balances_environments() -> None:
    available = {"a": ["a1", "a2", "a3", "a4"], "b": ["b1", "b2"], "c": []}
    (group,) = plan(available, ClaimRequest(4))
    assert len(group) == 4 and len(set(group)) == 4
    assert sum(n.startswith("a") for n in group) == 3  # the fullest environment gives most
    assert plan(available, ClaimRequest(7)) is None     # all or nothing
    assert plan(available, ClaimRequest(2, environment="b")) == [["b1", "b2"]]
    assert plan(available, ClaimRequest(3, environment="b")) is None


def test_plan_grpo_groups_come_from_one_environment() -> None:
    available = {"a": [f"a{i}" for i in range(5)], "b": [f"b{i}" for i in range(4)], "c": ["c0"]}
    groups = plan(available, ClaimRequest(8, group_size=4))
    assert groups is not None and len(groups) == 2
    for g in groups:
        assert len(g) == 4 and len({n[0] for n in g}) == 1
    assert {g[0][0] for g in groups} == {"a", "b"}
    assert plan(available, ClaimRequest(12, group_size=4)) is None  # c cannot hold a group
    assert plan(available, ClaimRequest(4, group_size=2, environment="a")) == [["a0", "a1"], ["a2", "a3"]]


def test_claim_request_problems() -> None:
    spec = fleet_spec(autoscale=True, maxReplicas=10)
    assert ClaimRequest(6, group_size=4).problem(spec) is not None
    assert ClaimRequest(2, environment="nope").problem(spec) is not None
    assert ClaimRequest(11).problem(spec) is not None
    assert ClaimRequest(8, group_size=4, environment="crm").problem(spec) is None


async def test_fleet_cache_reservations_and_stale_events() -> None:
    fleet = Fleet("ns", "f")
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=5)))
    fleet.update_pod(PodInfo.from_pod(pod("b", env="bike_shop", rv=6)))
    assert fleet.available_lists() == {"crm": ["a"], "bike_shop": ["b"]}
    fleet.reserve(["a"])
    assert fleet.available_lists() == {"bike_shop": ["b"]}
    fleet.assign("c1", ClaimRecord([["a"]]))
    fleet.unreserve(["a"])
    assert fleet.available_lists() == {"bike_shop": ["b"]}  # held by c1, whatever pod events say
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=7)))
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=6, ready=False)))  # an older event arriving late is ignored
    assert fleet.pods["a"].ready and [p.name for p in fleet.claim_pods("c1")] == ["a"]
    c = fleet.counts()
    assert (c.replicas, c.ready, c.allocated, c.starting) == (2, 1, 1, 0)
    waiter = asyncio.ensure_future(fleet.wait_capacity(5))
    await asyncio.sleep(0)
    fleet.update_pod(PodInfo.from_pod(pod("c", rv=8)))
    await asyncio.wait_for(waiter, 1)  # new capacity wakes waiting claims
    fleet.doom(fleet.pods["c"])
    fleet.update_pod(PodInfo.from_pod(pod("c", rv=9)))  # still being deleted, whatever the event says
    assert fleet.counts().replicas == 2 and "c" not in fleet.available_lists().get("crm", [])
    fleet.remove_pod("c")
    assert "c" not in fleet.doomed
    # Released: the pod is allocatable again; a claim whose pod vanished reports it lost.
    fleet.unassign("c1")
    assert fleet.available_lists()["crm"] == ["a"]
    fleet.assign("c2", ClaimRecord([["a"], ["b"]]))
    assert fleet.counts().allocated == 2 and fleet.available_lists() == {}
    fleet.remove_pod("b")
    assert fleet.lost_pods("c2") == ["b"] and [p.name for p in fleet.claim_pods("c2")] == ["a"]


def test_claim_record_round_trip() -> None:
    record = ClaimRecord([["p1", "p2"], ["p3", "p4"]], created=100.0, expires=160.5)
    again = ClaimRecord.parse(record.dump())
    assert again == record and again.pods == ["p1", "p2", "p3", "p4"] and again.group_of("p3") == 1
    assert ClaimRecord.parse(ClaimRecord([["x"]]).dump()).expires is None
    held = ClaimRecord([["x"]], created=1.0, holder="campaign/grpo-1")
    assert ClaimRecord.parse(held.dump()) == held and "holder" not in ClaimRecord([["x"]]).dump()
    assert ledger_name("train") == "train-claims" and len(ledger_name("f" * 253)) <= 253


class ConfigMapServer:
    """The API server's ConfigMap semantics that the ledger relies on (list by label, get, create,
    JSON merge patch with a resourceVersion precondition, the 1 MiB data limit), for fast unit
    tests; test_operator_e2e.py runs the same ledger against the real API server."""

    BASE = "/api/v1/namespaces/ns/configmaps"

    def __init__(self) -> None:
        self.objs: dict[str, dict] = {}
        self.version = 0
        self.writes = 0  # patches
        self.gate: asyncio.Event | None = None  # hold writes while set (to pile up a batch)

    @property
    def obj(self) -> dict | None:
        return self.objs.get("f-claims")

    def data(self, name: str) -> dict[str, str]:
        return self.objs[name].get("data") or {}

    def bump(self, name: str) -> None:
        """Another writer changed ``name``."""
        self.version += 1
        self.objs[name]["metadata"]["resourceVersion"] = str(self.version)

    def _check_size(self, data: dict[str, str]) -> None:
        if sum(len(k) + len(v) for k, v in data.items()) > CONFIGMAP_LIMIT:
            raise ApiError(422, '{"message": "data: Too long: must have at most 1048576 bytes"}')

    async def request(self, method: str, path: str, body=None, content_type: str = "", query=None, timeout=0.0):
        await asyncio.sleep(0)
        name = path[len(self.BASE) + 1:]
        if method == "GET" and not name:
            wanted = dict(part.split("=", 1) for part in dict(query or [])["labelSelector"].split(","))
            return {"items": [json.loads(json.dumps(o)) for o in self.objs.values()
                              if wanted.items() <= o["metadata"]["labels"].items()]}
        if method == "GET":
            if name not in self.objs:
                raise ApiError(404, "{}")
            return json.loads(json.dumps(self.objs[name]))
        if method == "POST":
            name = body["metadata"]["name"]
            if name in self.objs:
                raise ApiError(409, "{}")
            self._check_size(body.get("data") or {})
            self.version += 1
            self.objs[name] = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
            return self.objs[name]
        assert method == "PATCH"
        if self.gate is not None:
            await self.gate.wait()
        if name not in self.objs:
            raise ApiError(404, "{}")
        obj = self.objs[name]
        if body["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise ApiError(409, '{"message": "the object has been modified"}')
        data = dict(obj.get("data") or {})
        for key, value in body["data"].items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        self._check_size(data)
        obj["data"] = data
        self.writes += 1
        self.bump(name)
        return obj


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """``app`` on a free port of 127.0.0.1: its runner (to clean up) and its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def ledger_fleet(pods: int) -> Fleet:
    fleet = Fleet("ns", "f", uid="u1")
    for i in range(pods):
        fleet.update_pod(PodInfo.from_pod(pod(f"p{i}")))
    return fleet


async def test_ledger_group_commit_and_conflicts() -> None:
    server = ConfigMapServer()
    fleet = Fleet("ns", "f", uid="u1")
    for name in ("a", "b", "c", "d"):
        fleet.update_pod(PodInfo.from_pod(pod(name)))
    ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
    await ledger.load()
    assert server.obj["metadata"]["ownerReferences"][0]["uid"] == "u1" and fleet.claims == {}
    # Claims arriving while a write is in flight go together in the next one.
    server.gate = asyncio.Event()
    first = asyncio.ensure_future(ledger.commit({"c1": ClaimRecord([["a"]])}))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(ledger.commit({f"c{i}": ClaimRecord([[n]])})) for i, n in ((2, "b"), (3, "c"))]
    await asyncio.sleep(0.01)
    server.gate.set()
    await asyncio.gather(first, *rest)
    assert server.writes == 2 and set(fleet.claims) == {"c1", "c2", "c3"} and fleet.owner["c"] == "c3"
    assert fleet.available_lists() == {"crm": ["d"]}
    # Another replica writes behind our back: our next write gets 409, rereads, and a claim of a
    # pod the other one took loses the race while the rest still commits.
    server.gate = None
    server.obj["data"]["other"] = ClaimRecord([["d"]]).dump()
    server.bump("f-claims")
    with pytest.raises(LostRace):
        await ledger.commit({"c4": ClaimRecord([["d"]])})
    await ledger.commit({"c1": None})
    assert "other" in fleet.claims and "c1" not in fleet.claims and fleet.available_lists() == {"crm": ["a"]}
    # A restarted operator (or a standby taking over) reads the same allocation back.
    fresh = Fleet("ns", "f", uid="u1")
    for name in ("a", "b", "c", "d"):
        fresh.update_pod(PodInfo.from_pod(pod(name)))
    await Ledger(server, fresh, Metrics()).load()  # type: ignore[arg-type]
    assert fresh.owner == {"b": "c2", "c": "c3", "d": "other"} and fresh.available_lists() == {"crm": ["a"]}


def test_shard_names_and_placement() -> None:
    assert [shard_name("train", i) for i in range(3)] == ["train-claims", "train-claims-1", "train-claims-2"]
    for fleet in ("train", "a-claims", "f" * 253, "x-claims-1"):
        for i in (0, 1, 12):
            assert shard_index(fleet, shard_name(fleet, i)) == i and len(shard_name(fleet, i)) <= 253
    assert shard_index("train", "train-claims-01") is None and shard_index("train", "other-claims") is None
    assert shard_index("a", "a-claims-claims") is None  # fleet "a-claims"'s first shard, not "a"'s
    assert place([], 10, 100) == 0                       # the first shard
    assert place([95, 50], 10, 100) == 1                 # first fit
    assert place([95, 95], 10, 100) == 2                 # a new shard
    assert place([95, 0], 500, 100) == 1                 # an empty shard takes any one claim


def test_4096_one_instance_claims_need_shards() -> None:
    """The worst case the API allows: 4,096 instances (maxReplicas), each in its own claim, with
    the longest pod names, identities and holders. One ConfigMap cannot hold that; the shards,
    filled as the ledger fills them, each stay far below the limit."""
    pods = [f"{'f' * 30}-{'e' * 25}-{i:05x}" for i in range(4096)]
    owner = f"system:serviceaccount:{'n' * 63}:{'s' * 253}"
    used: list[int] = []
    total = 0
    for i, name in enumerate(pods):
        claim_id = f"api_{i:016x}"
        size = entry_size(claim_id, ClaimRecord([[name]], holder="h" * 253, owner=owner).dump())
        total += size
        index = place(used, size, SHARD_BYTES)
        used += [0] * (index + 1 - len(used))
        used[index] += size
    assert total > 2.5 * CONFIGMAP_LIMIT
    assert len(used) <= -(-total // SHARD_BYTES) + 1 and max(used) <= SHARD_BYTES < CONFIGMAP_LIMIT


async def test_ledger_spreads_over_shards() -> None:
    server = ConfigMapServer()
    fleet = ledger_fleet(12)
    record = ClaimRecord([["p0"]], created=1.0)
    size = entry_size("c00", record.dump())
    ledger = Ledger(server, fleet, Metrics(), shard_bytes=3 * size)  # type: ignore[arg-type]
    await ledger.load()
    # Claims fill the first shard, then the next ones; a claim is whole in one shard.
    await asyncio.gather(*(ledger.commit({f"c{i:02d}": ClaimRecord([[f"p{i}"]], created=1.0)}) for i in range(7)))
    assert sorted(server.objs) == ["f-claims", "f-claims-1", "f-claims-2"]
    assert [sorted(server.data(n)) for n in sorted(server.objs)] == [
        ["c00", "c01", "c02"], ["c03", "c04", "c05"], ["c06"]]
    assert all(server.objs[n]["metadata"]["ownerReferences"][0]["uid"] == "u1" for n in server.objs)
    assert set(fleet.claims) == {f"c{i:02d}" for i in range(7)}
    # A claim bigger than a shard's limit goes to an empty one, whole.
    await ledger.commit({"big": ClaimRecord([["p7", "p8"], ["p9", "p10"]], created=1.0, holder="h" * 200)})
    assert list(server.data("f-claims-3")) == ["big"]
    # A release frees room in its shard, and the next claim takes it (first fit).
    await ledger.commit({"c01": None})
    await ledger.commit({"c11": ClaimRecord([["p1"]], created=1.0)})
    assert sorted(server.data("f-claims")) == ["c00", "c02", "c11"]
    # A renewal stays where its claim is.
    await ledger.commit({"c04": ClaimRecord([["p4"]], created=1.0, expires=99.0)})
    assert ClaimRecord.parse(server.data("f-claims-1")["c04"]).expires == 99.0
    # A restarted operator (or a standby taking over) reads every shard back.
    fresh = ledger_fleet(12)
    await Ledger(server, fresh, Metrics(), shard_bytes=3 * size).load()  # type: ignore[arg-type]
    assert fresh.owner == fleet.owner and fresh.available_lists() == fleet.available_lists()
    # A shard deleted by hand is written back from what this replica knew, at its next write.
    del server.objs["f-claims-1"]
    await ledger.commit({"c03": None})
    assert sorted(server.data("f-claims-1")) == ["c04", "c05"] and "c03" not in fleet.claims
    assert fleet.owner.get("p4") == "c04"
    # Another replica wrote a shard meanwhile: that shard's write is retried on the new version
    # and the other shards' changes in the same batch are not lost.
    server.data("f-claims-2")["other"] = ClaimRecord([["p3"]], created=1.0).dump()
    server.bump("f-claims-2")
    await asyncio.gather(ledger.commit({"c06": None}), ledger.commit({"c00": None}))
    assert sorted(server.data("f-claims-2")) == ["other"] and sorted(server.data("f-claims")) == ["c02", "c11"]
    assert fleet.owner.get("p3") == "other" and "c06" not in fleet.claims and "c00" not in fleet.claims


async def test_a_claim_left_in_two_shards_is_read_once_and_released_from_both() -> None:
    """A write whose answer was lost (the operator died after the API server applied it) can leave
    a claim in a second shard when it is retried elsewhere: read back once, removed from both."""
    server = ConfigMapServer()
    fleet = ledger_fleet(4)
    ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
    await ledger.load()
    await ledger.commit({"c1": ClaimRecord([["p1"]], created=1.0)})
    copy = dict(server.objs["f-claims"], metadata={**server.objs["f-claims"]["metadata"], "name": "f-claims-1"})
    server.objs["f-claims-1"] = json.loads(json.dumps(copy))
    fresh = ledger_fleet(4)
    again = Ledger(server, fresh, Metrics())  # type: ignore[arg-type]
    await again.load()
    assert fresh.owner == {"p1": "c1"} and len(again.shards) == 2
    await again.commit({"c1": None})
    assert server.data("f-claims") == {} and server.data("f-claims-1") == {} and fresh.owner == {}


# --------------------------------------------------------------------------- autoscaling


def test_desired_replicas() -> None:
    assert desired_replicas(allocated=10, pending=6, buffer=4, minimum=0, maximum=100) == 20
    assert desired_replicas(0, 0, 0, minimum=2, maximum=100) == 2
    assert desired_replicas(90, 40, 8, minimum=0, maximum=100) == 100


def test_scale_down_waits_scale_up_does_not() -> None:
    gate = ScaleDownGate(delay=30)
    assert gate.decide(current=10, target=20, now=0) == 20
    assert gate.decide(current=20, target=12, now=1) is None
    assert gate.due_in(now=11) == pytest.approx(20)
    assert gate.decide(current=20, target=14, now=20) is None
    assert gate.decide(current=20, target=14, now=31) == 14
    assert gate.decide(current=14, target=18, now=32) == 18
    assert gate.decide(current=18, target=10, now=33) is None
    assert gate.decide(current=18, target=18, now=34) is None  # demand came back: the timer resets
    assert gate.decide(current=18, target=10, now=35) is None


# --------------------------------------------------------------------------- configuration and CRDs


async def test_api_requests_skip_proxy_and_netrc_lookups_only_where_there_are_none(tmp_path: Path) -> None:
    from kubernetes_asyncio import client as k8s

    from awm_operator.kube import skip_env_lookups

    for environ, skipped in (({"HOME": str(tmp_path)}, True),
                             ({"HOME": str(tmp_path), "HTTPS_PROXY": "http://proxy:3128"}, False),
                             ({"HOME": str(tmp_path), "all_proxy": "socks5://p"}, False),
                             ({"HOME": str(tmp_path), "HTTPS_PROXY": ""}, True)):
        api = k8s.ApiClient(k8s.Configuration())
        assert skip_env_lookups(api, environ) is skipped and api.rest_client.pool_manager.trust_env is not skipped
        await api.close()
    (tmp_path / ".netrc").write_text("machine example.com login a password b\n")
    api = k8s.ApiClient(k8s.Configuration())
    assert not skip_env_lookups(api, {"HOME": str(tmp_path)}) and api.rest_client.pool_manager.trust_env
    await api.close()


def test_config_from_env() -> None:
    cfg = OperatorConfig.from_env({"AWM_NAMESPACES": "a, b", "AWM_PEERING": "awm", "AWM_HEALTH_PORT": "8081",
                                   "AWM_ENVSERVER_RESOURCES": '{"limits": {"cpu": "2"}}', "AWM_SCALE_DOWN_DELAY": "5",
                                   "AWM_IMAGE_PULL_SECRETS": '[{"name": "regcred"}]'})
    assert cfg.namespaces == ["a", "b"] and cfg.peering == "awm" and cfg.api_port == 8081
    assert cfg.envserver_resources == {"limits": {"cpu": "2"}} and cfg.scale_down_delay == 5.0
    assert cfg.image_pull_secrets == [{"name": "regcred"}]
    assert OperatorConfig.from_env({}).peering is None and OperatorConfig.from_env({}).namespaces == []


async def test_startup_waits_for_every_peering_object() -> None:
    """One KopfPeering per served namespace (a ClusterKopfPeering cluster-wide, none standalone);
    the wait retries a missing object (404) and any other error until all exist."""
    from awm_operator.kube import ApiError
    from awm_operator.peering import peering_paths, wait_for_peering

    assert peering_paths(OperatorConfig(namespaces=["a", "b"], peering="awm")) == [
        "/apis/kopf.dev/v1/namespaces/a/kopfpeerings/awm", "/apis/kopf.dev/v1/namespaces/b/kopfpeerings/awm"]
    assert peering_paths(OperatorConfig(peering="awm")) == ["/apis/kopf.dev/v1/clusterkopfpeerings/awm"]
    assert peering_paths(OperatorConfig(namespaces=["a"])) == []

    answers = {"/apis/kopf.dev/v1/namespaces/a/kopfpeerings/awm": [404, 500, 200],
               "/apis/kopf.dev/v1/namespaces/b/kopfpeerings/awm": [200]}
    asked: list[str] = []

    class Kube:
        async def request(self, method: str, path: str) -> dict[str, Any]:
            asked.append(path)
            status = answers[path].pop(0)
            if status != 200:
                raise ApiError(status, "{}")
            return {}

    await wait_for_peering(Kube(), OperatorConfig(namespaces=["a", "b"], peering="awm"), interval=0)  # type: ignore[arg-type]
    assert asked.count("/apis/kopf.dev/v1/namespaces/a/kopfpeerings/awm") == 3
    assert asked.count("/apis/kopf.dev/v1/namespaces/b/kopfpeerings/awm") == 1
    assert not any(answers.values())


def test_crds_in_chart_match_the_models(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["operator", "crds", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["campaigns.awm.dev.yaml", "envclaims.awm.dev.yaml", "envfleets.awm.dev.yaml"]
    for name in written:
        chart = ROOT / "charts" / "awm" / "crds" / name
        assert chart.read_text() == (tmp_path / name).read_text(), (
            f"{chart} is out of date: run `awm operator crds -o charts/awm/crds`")
    stream = CliRunner().invoke(app, ["operator", "crds"])
    assert [d["kind"] for d in yaml.safe_load_all(stream.stdout)] == ["CustomResourceDefinition"] * 3


# --------------------------------------------------------------------------- pod-side provisioning


def test_provision_instance_command(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle = tmp_path / "env.json"
    bundle.write_text(notes_bundle.model_dump_json())
    dsn_file = tmp_path / "run" / "instance.dsn"
    pod_name = "unit-notes-abcde"
    env = {**os.environ, "AWM_ADMIN_DSN": admin_dsn, "AWM_FLEET": "unit", "POD_NAMESPACE": "ns1"}
    command = [sys.executable, "-m", "awm.postgres.provision", "--bundle", str(bundle),
               "--name", pod_name, "--dsn-file", str(dsn_file)]  # exactly what the init container runs
    r = subprocess.run(command, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(dsn_file.stat().st_mode) == 0o600
    dbname = provision.pod_instance_name(pod_name)
    dsn = dsn_file.read_text()
    assert admin_dsn not in dsn and f"dbname={dbname}" in dsn.replace("'", "")
    with psycopg.connect(dsn) as conn:  # the instance role reaches its own database
        assert conn.execute("SELECT current_database()").fetchone()[0] == dbname
    assert databases.fleet_databases(admin_dsn, "ns1", "unit") == {dbname: pod_name}
    # Run twice (an init container restarted): a fresh database again, no error.
    r = subprocess.run(command, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert databases.drop_orphans(admin_dsn, "ns1", "unit", live_pods={pod_name}) == []
    assert databases.drop_orphans(admin_dsn, "ns1", "unit", live_pods=set()) == [dbname]
    assert dbname not in provision.list_instances(admin_dsn)


def test_envserver_reads_its_dsn_from_a_file(admin_dsn: str, notes_bundle, tmp_path: Path) -> None:
    bundle = tmp_path / "env.json"
    bundle.write_text(notes_bundle.model_dump_json())
    template = provision.ensure_template(admin_dsn, notes_bundle)
    inst = provision.create_instance(admin_dsn, template, provision.pod_instance_name("dsnfile-notes-x1"))
    dsn_file = tmp_path / "instance.dsn"
    dsn_file.write_text(inst.dsn + "\n")
    dsn_file.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k != "AWM_INSTANCE_DSN"}
    env["AWM_INSTANCE_DSN_FILE"] = str(dsn_file)
    proc = subprocess.Popen([sys.executable, "-m", "awm.envserver", "--bundle", str(bundle), "--mcp-port", "0",
                             "--control-port", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        ready = json.loads(line)
        import httpx

        assert httpx.get(ready["control_url"] + "/readyz", timeout=10).status_code == 200
        assert httpx.post(ready["control_url"] + "/reset", json={"task_id": None}, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)
        provision.drop_instance(admin_dsn, inst.dbname)


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


@pytest.mark.parametrize("host, ok", [
    ("10.0.0.7:8080", True), ("[fd00::1]:8080", True), ("awm-operator:8080", True),
    ("awm-operator.awm.svc", True), ("awm-operator.awm.svc.cluster.local:8080", True),
    ("evil.example.com", False), ("awm-operator.awm.svc.evil.example.com", False), ("", False),
    ("trainer.example.org", True),  # configured
])
def test_operator_api_host_guard(host: str, ok: bool) -> None:
    from awm_operator.hostguard import host_allowed

    assert host_allowed(host, ["cluster.local"], ["trainer.example.org"]) is ok


# --------------------------------------------------------------------------- API authentication


def test_reviews_are_cached_by_token_hash_and_expire() -> None:
    """Unit test of the cache (the real TokenReview and SubjectAccessReview are exercised on the
    real API server in test_operator_e2e): one review per token and TTL, shorter for refusals."""
    from awm_operator.auth import NEGATIVE_TTL, POSITIVE_TTL, Authenticator, Identity, Need

    now = [0.0]
    calls: list[tuple[str, dict]] = []

    async def review(path: str, body: dict) -> dict:
        calls.append((path, body))
        if path.endswith("tokenreviews"):
            good = body["spec"]["token"] == "good"
            return {"status": {"authenticated": good, "user": {"username": "sa:t", "groups": ["g"]}}}
        return {"status": {"allowed": body["spec"]["resourceAttributes"]["namespace"] == "rl"}}

    auth = Authenticator(review, clock=lambda: now[0])

    async def go() -> None:
        who = await auth.identify("good")
        assert who == Identity("sa:t", ("g",), "") and await auth.identify("good") == who
        assert await auth.identify("bad") is None
        assert len(calls) == 2 and "good" not in json.dumps(list(auth._tokens))  # hashes, not tokens
        need = Need("create", "envclaims")
        assert await auth.allowed(who, "rl", need) and not await auth.allowed(who, "other", need)
        attrs = calls[-1][1]["spec"]["resourceAttributes"]
        assert attrs == {"namespace": "other", "verb": "create", "group": "awm.dev", "resource": "envclaims"}
        assert len(calls) == 4
        now[0] = NEGATIVE_TTL + 1  # refusals are asked again sooner than grants
        assert await auth.identify("bad") is None and await auth.identify("good") == who and len(calls) == 5
        now[0] = POSITIVE_TTL + 1
        await auth.identify("good")
        assert len(calls) == 6

    asyncio.run(go())


async def test_each_route_needs_what_its_template_says_not_what_its_path_contains() -> None:
    """The Need of a request comes from its route's template and method: a namespace or fleet
    named "campaigns" or "envfleets" gets the Need of the route it is on. Every route has a rule;
    a path's names must be Kubernetes names (an encoded "/" in a namespace would otherwise reach
    the operator's own request to the API server), with or without authentication."""
    from aiohttp.test_utils import TestClient, TestServer

    from awm_operator import auth as authn
    from awm_operator.api import build_api
    from awm_operator.reconcile import Context

    asked: list[tuple[str, authn.Need]] = []

    class Recording(authn.Authenticator):
        async def identify(self, token: str) -> authn.Identity | None:
            return authn.Identity("sa:viewer")

        async def allowed(self, who: authn.Identity, namespace: str, need: authn.Need) -> bool:
            asked.append((namespace, need))
            return False  # nothing runs: only what was asked matters

    ctx = Context(kube=None, allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    app = build_api(ctx, operator_fleet(), Recording(review=None))  # type: ignore[arg-type]
    registered = {(r.method, r.resource.canonical) for r in app.router.routes()
                  if r.resource is not None and r.resource.canonical.startswith("/v1/") and r.method != "HEAD"}
    assert registered == set(authn.NEEDS)  # a new route must say what it needs
    bearer = {"Authorization": "Bearer t"}
    async with TestClient(TestServer(app)) as client:
        for method, path, want in [
            ("GET", "/v1/namespaces/campaigns/envfleets", authn.Need("list", "envfleets")),
            ("GET", "/v1/namespaces/rl/envfleets/campaigns", authn.Need("get", "envclaims")),
            ("GET", "/v1/namespaces/rl/envfleets/envfleets/instances", authn.Need("get", "envclaims")),
            ("POST", "/v1/namespaces/rl/envfleets/campaigns/claims", authn.Need("create", "envclaims")),
            ("DELETE", "/v1/namespaces/campaigns/envfleets/f/claims/api_1", authn.Need("create", "envclaims")),
            ("GET", "/v1/namespaces/rl/campaigns", authn.Need("list", "campaigns")),
            ("POST", "/v1/namespaces/rl/campaigns/grpo/progress", authn.Need("update", "campaigns", "status", "grpo")),
            ("GET", "/v1/namespaces/rl/nothing-here", authn.Need("get", "envclaims")),  # a 404 once allowed
        ]:
            asked.clear()
            r = await client.request(method, path, headers=bearer)
            assert r.status == 403 and asked == [(path.split("/")[3], want)], (method, path, asked)
        for path in ("/v1/namespaces/..%2F..%2Fapi%2Fv1%2Fpods%3Fx%3D/envfleets", "/v1/namespaces/RL/campaigns",
                     "/v1/namespaces/rl/envfleets/a_b", "/v1/namespaces/rl/campaigns/x%2Fy/progress"):
            asked.clear()
            r = await client.request("POST" if path.endswith("progress") else "GET", path, headers=bearer)
            assert r.status == 400 and "Kubernetes" in (await r.json())["error"] and asked == [], path
    open_app = build_api(ctx, operator_fleet(), None)  # AWM_API_AUTH=off checks the names too
    async with TestClient(TestServer(open_app)) as client:
        assert (await client.get("/v1/namespaces/..%2Fx/envfleets")).status == 400


def test_a_campaign_job_runs_as_its_own_trainer_account() -> None:
    from awm_operator.campaign_manifests import CampaignSettings, Names, job_manifest, trainer_access
    from awm_operator.crds import CampaignSpec

    spec = CampaignSpec.model_validate({"mode": "evaluation", "environments": ["crm"], "catalog": {},
                                        "database": {"secretName": "db"},
                                        "evaluation": {"baseUrl": "http://llm/v1", "model": "m"}})
    job = job_manifest("grpo", "rl", "uid", spec, OperatorConfig(), CampaignSettings(), "http://op:8080")
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == Names.of("grpo").account and pod["automountServiceAccountToken"] is True
    kinds = {m["kind"]: m for _, m in trainer_access("grpo", "rl", "uid")}
    assert set(kinds) == {"ServiceAccount", "Role", "RoleBinding"}
    rules = kinds["Role"]["rules"]
    assert rules[0]["resources"] == ["envclaims"] and set(rules[0]["verbs"]) == {"create", "get", "update", "delete"}
    assert rules[1] == {"apiGroups": ["awm.dev"], "resources": ["campaigns/status"], "verbs": ["update"],
                        "resourceNames": ["grpo"]}
    assert all(m["metadata"]["ownerReferences"][0]["uid"] == "uid" for m in kinds.values())


def test_the_operator_runs_on_uvloop_when_it_is_installed() -> None:
    """The allocation API's CPU is mostly the event loop's sockets and TLS: the operator image
    installs uvloop (the ``operator`` extra) and ``run_loop`` must pick it, in production as in
    the tests that run the operator in a thread."""
    import uvloop  # noqa: F401  (the operator extra installs it)

    from awm_operator.main import run_loop

    seen: list[str] = []

    async def probe() -> None:
        seen.append(type(asyncio.get_running_loop()).__module__)

    run_loop(probe())
    assert seen and seen[0].startswith("uvloop"), seen


async def test_two_replicas_binding_one_envclaim_agree_on_its_instances() -> None:
    """kopf's peering lets two replicas act at once for a while (seen in CI: both started
    together and both acted for 50 s). Both then bind the same EnvClaim: the second writer's
    409 rereads the ledger, finds the claim bound to other pods and must not move it there
    (its EnvClaim's status would name pods the ledger does not give it, and the pods it does
    name would count as free). The second replica answers with the first one's binding."""
    from awm_operator.allocator import Allocator

    server = ConfigMapServer()
    replicas = [ledger_fleet(4), ledger_fleet(4)]
    for fleet in replicas:
        fleet.ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
        await fleet.ledger.load()
        fleet.active = True
    a, b = replicas
    alloc = Allocator(kube=None, metrics=Metrics())  # type: ignore[arg-type]
    first = await alloc.claim(a, "victim.u1", ClaimRequest(1), wait=0, source="envclaim")
    b.reserve(["p0"])  # as if b's own other claim held it for a moment: b picks another pod than a
    second = await alloc.claim(b, "victim.u1", ClaimRequest(1), wait=0, source="envclaim")
    b.unreserve(["p0"])
    assert [x.pod.name for x in first] == [x.pod.name for x in second] == ["p0"]
    assert b.claims["victim.u1"].groups == [["p0"]] and b.owner == {"p0": "victim.u1"}
    fresh = ledger_fleet(4)
    await Ledger(server, fresh, Metrics()).load()  # type: ignore[arg-type]
    assert fresh.owner == {"p0": "victim.u1"}
    # A renewal of the same binding (other expiry, same pods) is not a clash.
    await b.ledger.commit({"victim.u1": ClaimRecord([["p0"]], expires=time.time() + 60)})
    await a.ledger.commit({"victim.u1": ClaimRecord([["p0"]], expires=time.time() + 120)})
    assert a.claims["victim.u1"].expires and a.claims["victim.u1"].expires > time.time() + 60


class CachingPod:
    """A late pod's control API as the operator sees it: /bind switches and keeps the last
    ``keep`` environments (least recently used dropped), /reset answers what it serves and keeps."""

    def __init__(self, env: str, keep: int = 2) -> None:
        self.env, self.keep, self.cached, self.binds = env, keep, [env], []
        self.url = ""

    def bind(self, env: str) -> dict[str, Any]:
        kept = env in self.cached
        self.binds.append((env, "serving" if env == self.env else "cached" if kept else "new"))
        if env in self.cached:
            self.cached.remove(env)
        self.cached = [*self.cached, env][-self.keep:]
        switched, self.env = env != self.env, env
        return {"env": env, "switched": switched, "cached": kept, "cached_envs": list(self.cached)}

    async def start(self) -> web.AppRunner:
        async def bind(request: web.Request) -> web.Response:
            return web.json_response(self.bind((await request.json())["env"]))

        async def reset(_: web.Request) -> web.Response:
            return web.json_response({"pristine": True, "env": self.env, "cached_envs": list(self.cached)})

        app = web.Application()
        app.router.add_post("/bind", bind)
        app.router.add_post("/reset", reset)
        runner, self.url = await serve_app(app)
        return runner


async def test_the_operator_learns_what_late_pods_keep_and_claims_land_there() -> None:
    """binding: late through the allocator, against two pods' control APIs: what each pod keeps
    comes from its answers (/bind at a claim, /reset at a release, which also says what a client
    switched it to), and a claim of an environment one pod keeps lands on that pod (a reset there)
    rather than on one that would need a new database."""
    from awm_operator.allocator import Allocator

    pods = {"p0": CachingPod("a"), "p1": CachingPod("a")}
    runners = [await p.start() for p in pods.values()]
    server = ConfigMapServer()
    fleet = Fleet("ns", "f", uid="u1")
    fleet.spec = fleet_spec(environments=["a", "b", "c", "d"], binding="late")
    for name, stub in pods.items():
        fleet.update_pod(PodInfo.from_pod(pod(name, env="a", **{A_CONTROL_URL: stub.url})))
    fleet.ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
    await fleet.ledger.load()
    fleet.active = True
    metrics = Metrics()
    alloc = Allocator(kube=None, metrics=metrics)  # type: ignore[arg-type]

    async def claim(cid: str, req: ClaimRequest) -> list[str]:
        bound = await alloc.claim(fleet, cid, req, wait=5, source="api")
        names = [b.pod.name for b in bound]
        await alloc.release(fleet, cid)
        return names

    try:
        assert await claim("1", ClaimRequest(1, environment="b")) == ["p0"]  # p0 keeps a, b
        assert await claim("2", ClaimRequest(1, environment="c")) == ["p1"]  # p1 keeps a, c
        assert await claim("3", ClaimRequest(1, environment="d")) == ["p0"]  # p0 keeps b, d
        assert fleet.cached == {"p0": ("b", "d"), "p1": ("a", "c")}
        assert {e: set(n) for e, n in fleet.holding.items()} == {"a": {"p1"}, "b": {"p0"}}
        # b: p1 comes first among the free pods (filed under c, before p0 under d), but p0 keeps b
        assert await claim("4", ClaimRequest(1, environment="b")) == ["p0"]
        assert pods["p0"].binds[-1] == ("b", "cached")
        moved = "p1"
        kinds = {k: metrics.switches.labels("ns", "f", k)._value.get() for k in ("serving", "cached", "new")}  # noqa: SLF001
        assert kinds == {"serving": 0, "cached": 1, "new": 3}, kinds
        # A claim its client switches: the operator learns what the pod serves at its release.
        (got,) = [b.pod.name for b in await alloc.claim(fleet, "client", ClaimRequest(1, environment="c",
                                                                                     client_switches=True),
                                                         wait=5, source="api")]
        assert got == moved  # it serves c
        pods[moved].bind("d")  # the client switched it elsewhere (as a lease with another environment would)
        await alloc.release(fleet, "client")
        assert fleet.env_of(moved) == "d" and moved in fleet.available["d"] and fleet.cached[moved] == ("c", "d")
    finally:
        await alloc.close()
        for runner in runners:
            await runner.cleanup()


async def test_a_status_another_replica_wrote_over_is_written_again() -> None:
    """A replica skips a status write when nothing changed since its own last one; if another
    replica wrote the status in between (two acting at once, a standby's last pass), the
    object's status must still end up as this replica counts, not as the other one left it."""
    from awm_operator.reconcile import Context, Reconciler

    writes: list[dict] = []

    class Kube:
        async def patch_status(self, plural: str, namespace: str, name: str, status: Any) -> dict:
            writes.append(status.patch())
            return {}

    ctx = Context(kube=Kube(), allocator=None, metrics=Metrics(),  # type: ignore[arg-type]
                  config=OperatorConfig(status_min_interval=0.0))
    fleet = ledger_fleet(2)
    fleet.spec = fleet_spec(replicas=2)
    rec = Reconciler(fleet, ctx)
    await rec.patch_status(force=False)
    assert writes[-1]["ready"] == 2
    fleet.set_body({"metadata": {"name": "f"}, "status": writes[-1]})  # the watch shows our write
    await rec.patch_status(force=False)
    assert len(writes) == 1  # nothing changed: no write
    other = {**writes[-1], "ready": 1, "allocated": 1}  # another replica's count
    fleet.set_body({"metadata": {"name": "f"}, "status": other})
    await rec.patch_status(force=False)
    assert len(writes) == 2 and writes[-1]["ready"] == 2 and writes[-1]["allocated"] == 0


# --------------------------------------------------------------------------- the pod watch


async def test_a_silent_pod_watch_is_dropped_and_relisted() -> None:
    """A watch stream whose peer vanished without closing it (no event, no bookmark) is given up
    after ``silence_s`` and the pods are listed again, so a pod that became Ready meanwhile is
    seen; before, the stream blocked for its whole request timeout (330 s). A real HTTP server
    that answers the list and then holds each watch open, silent."""
    from kubernetes_asyncio import client as k8s

    from awm_operator.kube import Kube
    from awm_operator.state import Fleets
    from awm_operator.watch import PodWatcher

    def pod(name: str) -> dict[str, Any]:
        body = pod_manifest("f", "ns", "uid-1", fleet_spec(), "crm", OperatorConfig())
        body["metadata"].update(name=name, resourceVersion="1")
        body["status"] = {"phase": "Running", "podIP": "10.0.0.1",
                          "conditions": [{"type": "Ready", "status": "True"}]}
        return body

    lists: list[int] = []
    watches: list[int] = []

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            lists.append(1)
            items = [pod("a")] + ([pod("b")] if len(lists) > 1 else [])  # b started while the stream was dead
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": items})
        watches.append(1)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await asyncio.sleep(3600)  # silent and never closed
        return response

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    runner = web.AppRunner(app, shutdown_timeout=0.1)  # its watches never end by themselves
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port the OS chose
    kube = Kube(k8s.ApiClient(k8s.Configuration(host=f"http://127.0.0.1:{port}")))
    fleets = Fleets()
    watcher = PodWatcher(kube, fleets, "ns", silence_s=0.5)
    task = asyncio.create_task(watcher.run())
    try:
        for _ in range(200):
            if "b" in (fleets.get("ns", "f") or fleets.ensure("ns", "f")).pods:
                break
            await asyncio.sleep(0.05)
        assert set(fleets.ensure("ns", "f").pods) == {"a", "b"}, (lists, watches)
        assert len(lists) >= 2 and len(watches) >= 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
        await runner.cleanup()
