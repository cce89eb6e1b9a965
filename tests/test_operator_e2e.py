"""The operator end to end, on a real control plane (k8s/harness.py: etcd, kube-apiserver,
controller-manager, scheduler; kwok fakes the kubelet, so pods get an IP and turn Ready but run
nothing). The operator runs in-process (kopf in a thread) against the harness kubeconfig.

Releases reset instances through their control API: the fleets here point every pod at a real
env server (``awm.dev/control-url`` from the fleet's pod template), served locally on the real
PostgreSQL. Databases: kwok runs no init containers, so the tests create instance databases the
way the provisioning init container does, then check the operator drops them.

Skipped without the harness binaries (k8s/build.sh), except under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
import urllib.error
import uuid
from typing import Any

import httpx
import pytest

from awm.claims import Claim
from awm.postgres import provision
from awm.episode.allocation import AllocationClient, AllocationError, bearer, new_claim_id
from awm.episode.sources import Lease
from awm_operator.config import OperatorConfig
from awm_operator.main import InThread
from awm_operator.pods import A_CONTROL_URL
from tests.k8s_e2e import Cluster, api_url, apply_crds, claim_of, metric, operator_config, setup_namespace, wait_for

pytestmark = pytest.mark.slow

NS = "awm-e2e"


def fleet_spec(replicas: int, control_url: str | None, environments: list[str] | None = None,
               **extra: Any) -> dict[str, Any]:
    """A pinned fleet unless ``binding`` is given (the stub control URLs of kwok pods here are
    pinned env servers; late-binding fleets say so and point at ``late_server``)."""
    spec: dict[str, Any] = {"environments": environments or ["crm", "bike_shop", "notes"], "replicas": replicas,
                            "catalog": {}, "database": {"secretName": "awm-db"}, "binding": "pinned", **extra}
    if control_url:
        spec["template"] = {"annotations": {A_CONTROL_URL: control_url}}
    return spec


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
def env_server(notes_fleet: Any) -> str:
    """The control URL of a real env server (the notes environment on the real PostgreSQL)."""
    return notes_fleet.instances[0].control_url


@pytest.fixture(scope="module")
async def late_server(admin_dsn: str, notes_bundle: Any) -> Any:
    """A real late-binding env server over four environments (its databases from a provisioner)."""
    from awm import catalog
    from awm.fleet import Database, LocalFleet

    bundles = [notes_bundle, *catalog.load("starter", ["crm", "project_tracker", "bike_shop"])]
    fleet = LocalFleet(bundles, database=Database(admin_dsn), allow_ungated=True, instances=1, fleet_id="e2elate")
    await fleet.start()
    yield fleet.instances[0]
    await fleet.stop()


# --------------------------------------------------------------------------- fleets


def test_a_late_binding_fleet_switches_its_pods_to_the_claimed_environment(cluster: Cluster, operator: InThread,
                                                                          late_server: Any, notes_bundle: Any) -> None:
    control = late_server.control_url
    cluster.create("envfleets", "late", fleet_spec(3, control, ["notes", "crm", "project_tracker", "bike_shop", "missing"],
                                                   binding="late"))
    wait_for("3 ready", lambda: cluster.ready("late", 3))
    switches = metric(operator, "awm_claim_switch_seconds_count", fleet="late") or 0
    grpo = claim_of(cluster, "late-crm", {"fleet": "late", "count": 2, "groupSize": 2, "environment": "crm"})
    assert grpo["phase"] == "Bound", grpo
    assert {i["environment"] for i in grpo["instances"]} == {"crm"} and {i["group"] for i in grpo["instances"]} == {0}
    info = httpx.get(control + "/info").json()
    assert info["env"] == "crm" and info["late_binding"] is True

    async def api_claim() -> None:  # the allocation API switches the third pod to another one
        async with AllocationClient(api_url(operator), NS, "late") as alloc:
            got = await alloc.claim(count=1, environment="project_tracker")
            assert [i.environment for i in got.instances] == ["project_tracker"]
            assert {i.pod for i in got.instances}.isdisjoint(i["pod"] for i in grpo["instances"])
            assert httpx.get(control + "/info").json()["env"] == "project_tracker"
            with pytest.raises(AllocationError) as exc:  # every pod is taken: a fleet of 3 holds 3 episodes
                await alloc.claim(count=1, environment="notes", wait_seconds=0.5)
            assert exc.value.status == 409
            await alloc.release(got.id)
            # switch="client": answered at once, the pod left as it was; the client's lease
            # switches it when it connects (one /bind from the client, none from the operator).
            got = await alloc.claim(count=1, environment="notes", switch="client", wait_seconds=10)
            (inst,) = got.instances
            assert inst.environment == "notes" and inst.switched is False, inst
            assert httpx.get(control + "/info").json()["env"] == "project_tracker"
            lease = Lease(inst.environment, inst.pod, late_server.mcp_url, inst.control_url,  # a kwok pod: no MCP
                          unswitched=inst.switched is False)
            handle = await lease.connect()
            try:
                assert httpx.get(control + "/info").json()["env"] == "notes" and not lease.unswitched
                assert {t["name"] for t in handle.tools} == {t.name for t in notes_bundle.tools}
            finally:
                await lease.disconnect()
                await alloc.release(got.id)
            # prepare: the operator makes an environment ready on a free pod ahead of its claim,
            # and the claim lands there. crm counts as ready: the GRPO claim's pods serve it.
            for _ in range(100):  # the release is answered before its ledger write frees the pod
                if (await alloc.fleet())["ready"] == 1:
                    break
                await asyncio.sleep(0.1)
            assert (await alloc.prepare({"crm": 2}, wait=True)).chosen == 0
            # The free pod served project_tracker two claims ago and said it keeps it (its
            # answers' cached_envs): nothing to make, and a claim of it would land there.
            assert (await alloc.prepare({"project_tracker": 1}, wait=True)).chosen == 0
            made = await alloc.prepare({"bike_shop": 1}, wait=True)  # no pod has served it
            assert made.chosen == 1 and made.prepared + made.cached == 1 and made.failed == 0, made
            (ready_pod,) = made.pods
            assert made.pods[ready_pod] == "bike_shop" and ready_pod not in {i["pod"] for i in grpo["instances"]}
            assert "bike_shop" in httpx.get(control + "/info").json()["cached_envs"]
            again = await alloc.prepare({"bike_shop": 1}, wait=True)
            assert again.chosen == 0  # it is ready already
            got = await alloc.claim(count=1, environment="bike_shop", wait_seconds=10)
            assert [i.pod for i in got.instances] == [ready_pod]
            await alloc.release(got.id)
            # A claim asked for again with its id (the first answer lost on the way) is the claim
            # bound the first time, not a second one held by nobody until its TTL.
            cid = new_claim_id()
            once = await alloc.claim(count=1, environment="notes", claim_id=cid, wait_seconds=10)
            again = await alloc.claim(count=1, environment="notes", claim_id=cid, wait_seconds=10)
            assert once.id == again.id == cid
            assert [i.pod for i in again.instances] == [i.pod for i in once.instances]
            await alloc.release(cid)
            r = httpx.post(f"{api_url(operator)}/v1/namespaces/{NS}/envfleets/late/claims", json={"id": "mine"},
                           headers=bearer())
            assert r.status_code == 400 and "id: String should match pattern" in r.json()["error"]
            for body in ({"environments": {"missing-from-fleet": 1}}, {"environments": {"crm": -1}},
                         {"environments": {}}, {"environments": ["crm"]}, {"environments": {"crm": 1}, "wait": "yes"}):
                r = httpx.post(f"{api_url(operator)}/v1/namespaces/{NS}/envfleets/late/prepare", json=body,
                               headers=bearer())
                assert r.status_code == 400 and "error" in r.json(), (body, r.text)
    asyncio.run(api_claim())
    assert sum(metric(operator, "awm_prepares_total", fleet="late", outcome=o) or 0 for o in ("prepared", "cached")) >= 1
    # project_tracker, notes, prepared bike_shop, and the claim asked for twice (its pod is
    # asked to switch again the second time: a no-op where it serves the environment already)
    assert (metric(operator, "awm_claim_switch_seconds_count", fleet="late") or 0) - switches == 5
    # An environment no pod started on is served too: late binding, not a per-environment pool.
    cluster.delete("envclaims", "late-crm")
    wait_for("all 3 back", lambda: cluster.ready("late", 3) and not cluster.ledger("late"))
    whole = claim_of(cluster, "late-all", {"fleet": "late", "count": 3, "environment": "notes"})
    assert whole["phase"] == "Bound" and {i["environment"] for i in whole["instances"]} == {"notes"}
    cluster.delete("envclaims", "late-all")
    wait_for("all 3 back again", lambda: cluster.ready("late", 3) and not cluster.ledger("late"))
    # An environment the pods refuse (not in their catalog): the claim fails; no pod is replaced.
    pods = {p["metadata"]["name"] for p in cluster.pods("late")}
    refused = claim_of(cluster, "late-missing", {"fleet": "late", "count": 1, "environment": "missing"})
    assert refused["phase"] == "Failed" and "missing" in refused["message"], refused
    assert {p["metadata"]["name"] for p in cluster.pods("late")} == pods and not cluster.ledger("late")
    assert httpx.get(control + "/info").json()["env"] == "notes"  # it serves what it served
    cluster.delete("envclaims", "late-missing")
    cluster.delete("envfleets", "late")


@pytest.mark.timeout(900)  # 40-80 s to Ready on 2 shared cores; more on a loaded machine
def test_fleet_of_1024_gets_ready_and_recovers(cluster: Cluster, operator: InThread) -> None:
    t0 = time.monotonic()
    cluster.create("envfleets", "big", fleet_spec(1024, None, [f"env{i}" for i in range(8)]))
    wait_for("1,024 ready instances", lambda: cluster.ready("big", 1024), timeout=300, interval=0.5)
    ready_s = time.monotonic() - t0
    pods = cluster.pods("big")
    assert len(pods) == 1024
    per_env: dict[str, int] = {}
    for p in pods:
        per_env[p["metadata"]["labels"]["awm.dev/environment"]] = per_env.get(p["metadata"]["labels"]["awm.dev/environment"], 0) + 1
        assert p["metadata"]["ownerReferences"][0]["kind"] == "EnvFleet"
    assert per_env == {f"env{i}": 128 for i in range(8)}
    status = cluster.status("envfleets", "big")
    assert status["conditions"][0]["type"] == "Ready" and status["conditions"][0]["status"] == "True"
    assert status["selector"] == "app.kubernetes.io/name=awm-envserver,awm.dev/fleet=big"
    assert metric(operator, "awm_fleet_instances", fleet="big", state="ready") == 1024

    t1 = time.monotonic()
    cluster.delete_pods([p["metadata"]["name"] for p in pods[:100]])
    wait_for("the fleet back at 1,024 ready", lambda: cluster.ready("big", 1024) and len(cluster.pods("big")) == 1024,
             timeout=240, interval=0.5)
    print(f"1,024 ready in {ready_s:.1f}s; 100 deleted pods replaced in {time.monotonic() - t1:.1f}s")

    cluster.delete("envfleets", "big")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "big") is None and not cluster.pods("big"), timeout=120)


def test_failed_pods_are_replaced_and_scale_down_spares_allocated(cluster: Cluster, operator: InThread) -> None:
    cluster.create("envfleets", "repl", fleet_spec(4, "http://127.0.0.1:9", ["crm"]))
    wait_for("4 ready", lambda: cluster.ready("repl", 4))
    victim = cluster.pods("repl")[0]["metadata"]["name"]
    # A pod that exits for good (evicted, node lost) is replaced.
    subprocess.run([cluster.cp.bin("kubectl"), "--kubeconfig", cluster.cp.kubeconfig, "-n", NS, "patch", "pod", victim,
                    "--subresource=status", "--type=merge", "-p", json.dumps({"status": {"phase": "Failed"}})],
                   check=True, capture_output=True)
    wait_for("the failed pod replaced", lambda: victim not in {p["metadata"]["name"] for p in cluster.pods("repl")}
             and cluster.ready("repl", 4))

    async def claim() -> Claim:
        async with AllocationClient(api_url(operator), NS, "repl") as alloc:
            return await alloc.claim(count=2)

    bound = asyncio.run(claim())
    cluster.scale("repl", 1)
    wait_for("scaled down to the 2 allocated", lambda: len(cluster.pods("repl")) == 2, timeout=30)
    assert {p["metadata"]["name"] for p in cluster.pods("repl")} == {i.pod for i in bound.instances}
    cluster.delete("envfleets", "repl")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "repl") is None)


# --------------------------------------------------------------------------- claims


def test_claims_bind_and_release(cluster: Cluster, operator: InThread, env_server: str) -> None:
    cluster.create("envfleets", "pool", fleet_spec(12, env_server))
    wait_for("12 ready", lambda: cluster.ready("pool", 12))

    single = claim_of(cluster, "one", {"fleet": "pool", "count": 3})
    assert single["phase"] == "Bound" and len(single["instances"]) == 3 and single["latencyMs"] >= 0
    assert all(i["controlUrl"] == env_server and i["mcpUrl"].endswith(":8000/mcp") for i in single["instances"])
    grpo = claim_of(cluster, "grpo", {"fleet": "pool", "count": 6, "groupSize": 3})
    assert grpo["phase"] == "Bound"
    groups: dict[int, set[str]] = {}
    for i in grpo["instances"]:
        groups.setdefault(i["group"], set()).add(i["environment"])
    assert sorted(groups) == [0, 1] and all(len(envs) == 1 for envs in groups.values())
    taken = {i["pod"] for i in single["instances"]} | {i["pod"] for i in grpo["instances"]}
    assert len(taken) == 9
    allocated = cluster.allocated("pool")  # the ledger in the API server, not the operator's memory
    assert set(allocated) == taken
    assert allocated[single["instances"][0]["pod"]].startswith("one.")
    wait_for("status counts", lambda: cluster.status("envfleets", "pool").get("allocated") == 9)

    bad = claim_of(cluster, "bad", {"fleet": "pool", "count": 3, "groupSize": 2})
    assert bad["phase"] == "Failed" and "multiple" in bad["message"]
    # a bound claim is not re-bound by an edit: the API server refuses it
    r = cluster.cp.kubectl("-n", NS, "patch", "envclaim", "one", "--type=merge", "-p", '{"spec": {"count": 5}}',
                           check=False)
    assert r.returncode != 0 and "spec cannot change" in r.stderr

    # The allocation API draws from the same pool; a claim larger than what is left waits.
    async def api_claims() -> None:
        async with AllocationClient(api_url(operator), NS, "pool") as alloc:
            got = await alloc.claim(count=2)
            assert len({i.pod for i in got.instances} | taken) == 11
            with pytest.raises(AllocationError) as exc:
                await alloc.claim(count=2, wait_seconds=0.5)
            assert exc.value.status == 409
            released = await alloc.release(got.id)
            assert released.returned == 2 and released.replaced == 0
    asyncio.run(api_claims())

    # Deleting claims resets their instances through the control API and returns them.
    resets_before = metric(operator, "awm_instances_released_total", fleet="pool", result="returned")
    cluster.delete("envclaims", "one")
    cluster.delete("envclaims", "grpo")
    cluster.delete("envclaims", "bad")
    wait_for("all 12 back in the pool", lambda: cluster.ready("pool", 12) and not cluster.ledger("pool"))
    assert metric(operator, "awm_instances_released_total", fleet="pool", result="returned") - resets_before == 9

    # An EnvClaim with a TTL gives its instances back by itself, and says so: phase Expired.
    timed = claim_of(cluster, "timed", {"fleet": "pool", "count": 2, "ttlSeconds": 2})
    assert timed["phase"] == "Bound" and len(timed["instances"]) == 2
    expired = wait_for("the claim Expired", lambda: (s := cluster.status("envclaims", "timed")).get("phase")
                       == "Expired" and s, timeout=30)
    assert expired["instances"] == [] and "ttlSeconds" in expired["message"]
    wait_for("its instances back in the pool", lambda: cluster.ready("pool", 12) and not cluster.ledger("pool"))
    time.sleep(1)
    assert cluster.status("envclaims", "timed")["phase"] == "Expired"  # not bound again
    cluster.delete("envclaims", "timed")


def test_a_claim_for_a_missing_fleet_says_so_and_binds_when_it_appears(cluster: Cluster, operator: InThread,
                                                                     env_server: str) -> None:
    cluster.create("envclaims", "early", {"fleet": "late", "count": 2})
    pending = wait_for("the claim Pending", lambda: (s := cluster.status("envclaims", "early")).get("phase") == "Pending"
                       and s)
    assert pending["message"] == f"EnvFleet 'late' not found in namespace {NS}: waiting for it"
    cluster.create("envfleets", "late", fleet_spec(2, env_server, ["crm"]))
    bound = wait_for("the claim bound once the fleet is ready",
                     lambda: (s := cluster.status("envclaims", "early")).get("phase") == "Bound" and s, timeout=60)
    assert len(bound["instances"]) == 2
    cluster.delete("envclaims", "early")
    cluster.delete("envfleets", "late")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "late") is None)


def test_a_stuck_pod_says_why_in_the_fleet_status(cluster: Cluster, operator: InThread) -> None:
    """What a misspelt environment looks like on a real cluster (kwok runs no containers, so the
    kubelet's report is written by hand): the fleet's Ready condition names the pod and the error."""
    cluster.create("envfleets", "typo", fleet_spec(1, None, ["crmm"]))
    (p,) = wait_for("the pod", lambda: cluster.pods("typo"))
    name = p["metadata"]["name"]
    wait_for("the pod ready (kwok)", lambda: cluster.ready("typo", 1))
    status = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
              "initContainerStatuses": [{"name": "bundle", "ready": False, "restartCount": 3, "image": "c", "imageID": "",
                                         "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                         "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                                                      "message": "cp: can't stat '/catalog/crmm.json'"}}}]}
    r = cluster.cp.kubectl("-n", NS, "patch", "pod", name, "--subresource=status", "--type=merge",
                           "-p", json.dumps({"status": status}), check=False)
    assert r.returncode == 0, r.stderr
    cond = wait_for("the reason in the fleet's status", lambda: next(
        (c for c in cluster.status("envfleets", "typo").get("conditions", [])
         if c["type"] == "Ready" and c["reason"] == "BundleUnavailable"), None), timeout=30)
    assert cond["status"] == "False" and f"{name}: bundle: CrashLoopBackOff: cp: can't stat" in cond["message"]
    cluster.delete("envfleets", "typo")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "typo") is None)


def test_environment_selector_over_the_catalog_index(cluster: Cluster, operator: InThread, tmp_path: Any) -> None:
    """A fleet chooses its environments from the catalog's index (served next to the bundles, or
    in a ConfigMap for an image catalog), follows a changed selector, and says when it cannot read
    the index; the API server refuses a selector with no index to read."""
    import functools
    import http.server
    import threading

    index = tmp_path / "index.json"
    index.write_text(json.dumps({"environments": [{"name": n} for n in ("crm", "crm_lite", "hotel")]}))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        base = {"replicas": 4, "database": {"secretName": "awm-db"}, "environmentSelector": {"matchNames": ["crm*"]}}
        cluster.create("envfleets", "picky", {**base, "catalog": {"url": url}})
        status = wait_for("the chosen environments in the status",
                          lambda: (s := cluster.status("envfleets", "picky")).get("environments") and s)
        assert status["environments"] == ["crm", "crm_lite"]
        wait_for("4 ready", lambda: cluster.ready("picky", 4))
        envs = sorted(p["metadata"]["labels"]["awm.dev/environment"] for p in cluster.pods("picky"))
        assert envs == ["crm", "crm", "crm_lite", "crm_lite"]
        cluster.cp.kubectl("-n", NS, "patch", "envfleet", "picky", "--type=merge",
                           "-p", json.dumps({"spec": {"environmentSelector": {"matchNames": ["hotel"]}}}))
        wait_for("the new choice, and its pods", lambda: cluster.status("envfleets", "picky").get("environments")
                 == ["hotel"] and sorted(p["metadata"]["labels"]["awm.dev/environment"]
                                         for p in cluster.pods("picky")) == ["hotel"] * 4, timeout=60)

        # An image catalog's index lives in a ConfigMap; a broken one is reported, pods stay.
        cluster.cp.api("POST", f"/api/v1/namespaces/{NS}/configmaps", {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cat-index"},
            "data": {"index.json": json.dumps({"environments": [{"name": "crm"}, {"name": "crm_x"}]})}})
        cluster.create("envfleets", "viacm", {**base, "replicas": 2, "catalog": {"indexConfigMap": "cat-index"}})
        wait_for("the ConfigMap's environments", lambda: cluster.status("envfleets", "viacm").get("environments")
                 == ["crm", "crm_x"])
        cluster.create("envfleets", "noindex", {**base, "replicas": 2, "catalog": {"indexConfigMap": "missing"}})
        cond = wait_for("the unreadable index reported", lambda: next(
            (c for c in cluster.status("envfleets", "noindex").get("conditions", [])
             if c["reason"] == "CatalogIndexUnavailable"), None))
        assert cond["status"] == "False" and "missing" in cond["message"] and not cluster.pods("noindex")
        # Dropping the selector for a list clears the condition and the old choice.
        cluster.cp.kubectl("-n", NS, "patch", "envfleet", "noindex", "--type=merge", "-p", json.dumps(
            {"spec": {"environmentSelector": None, "catalog": {"indexConfigMap": None}, "environments": ["crm"]}}))
        wait_for("the fleet healthy on its list", lambda: (s := cluster.status("envfleets", "noindex"))
                 and all(c["reason"] != "CatalogIndexUnavailable" for c in s.get("conditions", []))
                 and cluster.ready("noindex", 2), timeout=60)
        cluster.cp.kubectl("-n", NS, "patch", "envfleet", "viacm", "--type=merge", "-p", json.dumps(
            {"spec": {"environmentSelector": None, "environments": ["crm"]}}))
        wait_for("the selector's choice gone from the status",
                 lambda: "environments" not in cluster.status("envfleets", "viacm"))
        for spec, message in (({**base, "catalog": {}}, "needs catalog.url or catalog.indexConfigMap"),
                              ({**base, "catalog": {"url": url}, "environments": ["crm"]}, "either environments or"),
                              (fleet_spec(1, None, minReplicas=3, maxReplicas=2), "minReplicas must not exceed")):
            with pytest.raises(urllib.error.HTTPError) as refused:
                cluster.create("envfleets", "noway", spec)
            assert refused.value.code == 422 and message in refused.value.read().decode()
    finally:
        server.shutdown()
        for name in ("picky", "viacm", "noindex"):
            cluster.delete("envfleets", name)
        cluster.cp.api("DELETE", f"/api/v1/namespaces/{NS}/configmaps/cat-index")
    wait_for("the fleets gone", lambda: all(cluster.get("envfleets", n) is None for n in ("picky", "viacm", "noindex")))


def test_concurrent_claims_never_share_an_instance(cluster: Cluster, operator: InThread) -> None:
    wait_for("12 ready", lambda: cluster.ready("pool", 12))
    run_id = uuid.uuid4().hex[:6]

    async def api_claim(alloc: AllocationClient) -> list[str]:
        got = await alloc.claim(count=1, wait_seconds=5)
        return [i.pod for i in got.instances]

    async def race() -> list[str]:
        async with AllocationClient(api_url(operator), NS, "pool") as alloc:
            loop = asyncio.get_running_loop()
            creations = [loop.run_in_executor(None, cluster.create, "envclaims", f"c{run_id}-{i}",
                                              {"fleet": "pool", "count": 1}) for i in range(6)]
            results = await asyncio.gather(*(api_claim(alloc) for _ in range(6)), *creations)
            return [p for r in results[:6] for p in r]

    api_pods = asyncio.run(race())
    bound = [wait_for(f"claim {i}", lambda i=i: cluster.status("envclaims", f"c{run_id}-{i}").get("phase") == "Bound"
                      and cluster.status("envclaims", f"c{run_id}-{i}")) for i in range(6)]
    claim_pods = [i["pod"] for b in bound for i in b["instances"]]
    everything = api_pods + claim_pods
    assert len(everything) == 12 and len(set(everything)) == 12

    # The pool is empty now: a claim waits (Pending), and binds once instances come back.
    cluster.create("envclaims", f"w{run_id}", {"fleet": "pool", "count": 2, "environment": "crm"})
    wait_for("a pending claim", lambda: cluster.status("envclaims", f"w{run_id}").get("phase") == "Pending")
    for i in range(6):
        cluster.delete("envclaims", f"c{run_id}-{i}")
    waited = wait_for("the waiting claim bound",
                      lambda: (s := cluster.status("envclaims", f"w{run_id}")).get("phase") == "Bound" and s)
    assert {i["environment"] for i in waited["instances"]} == {"crm"}
    cluster.delete("envclaims", f"w{run_id}")

    async def release_api() -> None:  # the API claims: find their ids in the ledger
        ids = {cid for cid in cluster.ledger("pool") if cid.startswith("api_")}
        assert len(ids) == 6
        async with AllocationClient(api_url(operator), NS, "pool") as alloc:
            for claim_id in ids:
                await alloc.release(claim_id)
    asyncio.run(release_api())
    wait_for("all 12 back in the pool", lambda: cluster.ready("pool", 12))


def test_failed_reset_replaces_the_instance(cluster: Cluster, operator: InThread) -> None:
    wait_for("12 ready", lambda: cluster.ready("pool", 12))

    async def go() -> None:
        async with AllocationClient(api_url(operator), NS, "pool") as alloc:
            got = await alloc.claim(count=2)
            broken = got.instances[0].pod
            cluster.annotate(broken, A_CONTROL_URL, "http://127.0.0.1:9")  # nothing listens there
            await asyncio.sleep(0.5)  # the operator sees the new annotation through its watch
            released = await alloc.release(got.id)
            assert (released.returned, released.replaced) == (1, 1)
            wait_for("the broken pod gone and replaced",
                     lambda: broken not in {p["metadata"]["name"] for p in cluster.pods("pool")}
                     and cluster.ready("pool", 12))
    asyncio.run(go())
    assert metric(operator, "awm_instances_released_total", fleet="pool", result="replaced") >= 1
    cluster.delete("envfleets", "pool")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "pool") is None)


def test_claim_ttl_renewal_and_lost_instances(cluster: Cluster, operator: InThread, env_server: str) -> None:
    cluster.create("envfleets", "ttl", fleet_spec(6, env_server, ["crm"]))
    wait_for("6 ready", lambda: cluster.ready("ttl", 6))

    async def api() -> None:
        async with AllocationClient(api_url(operator), NS, "ttl") as alloc:
            with pytest.raises(AllocationError) as exc:
                await alloc.claim(count=1, ttl_seconds=-1)
            assert exc.value.status == 400
            short = await alloc.claim(count=2, ttl_seconds=1.5)
            kept = await alloc.claim(count=2, ttl_seconds=1.5)
            renewed = await alloc.renew(kept.id, ttl_seconds=300)
            assert renewed.expires_at > kept.expires_at
            # Not renewed: the operator releases it by itself (reset, back to the pool).
            wait_for("the short claim expired", lambda: short.id not in cluster.ledger("ttl"), timeout=30)
            with pytest.raises(AllocationError) as exc:
                await alloc.get(short.id)
            assert exc.value.status == 404
            assert metric(operator, "awm_claims_expired_total", fleet="ttl") == 1
            # An allocated pod deleted: the claim shows the instance lost, the fleet replaces the pod.
            lost = kept.instances[0].pod
            cluster.delete_pods([lost])
            wait_for("the replacement", lambda: len(cluster.pods("ttl")) == 6 and lost not in
                     {p["metadata"]["name"] for p in cluster.pods("ttl")})
            shown = await alloc.get(kept.id)
            assert shown.lost == 1 and [i.pod for i in shown.instances if i.lost] == [lost]
            released = await alloc.release(kept.id)
            assert (released.returned, released.replaced) == (1, 0)
            with pytest.raises(AllocationError) as exc:
                await alloc.release(kept.id)
            assert exc.value.status == 404
    asyncio.run(api())
    wait_for("6 ready and nothing allocated", lambda: cluster.ready("ttl", 6) and not cluster.ledger("ttl"))

    # An EnvClaim whose instance is lost says so in its status.
    bound = claim_of(cluster, "deg", {"fleet": "ttl", "count": 2})
    assert bound["observedGeneration"] == 1 and {c["type"]: c["status"] for c in bound["conditions"]} == {
        "Bound": "True", "Degraded": "False"}
    r = cluster.cp.kubectl("-n", NS, "wait", "--for=condition=Bound", "envclaim/deg", "--timeout=20s", check=False)
    assert r.returncode == 0, r.stderr  # what docs/kubernetes.md tells users to wait on
    victim = bound["instances"][1]["pod"]
    cluster.delete_pods([victim])
    degraded = wait_for("the claim degraded",
                        lambda: (s := cluster.status("envclaims", "deg")).get("phase") == "Degraded" and s)
    assert degraded["lost"] == [victim] and "1 of 2" in degraded["message"]
    assert {c["type"]: (c["status"], c["reason"]) for c in degraded["conditions"]} == {
        "Bound": ("True", "Bound"), "Degraded": ("True", "InstancesLost")}
    cluster.delete("envclaims", "deg")
    wait_for("released", lambda: not cluster.ledger("ttl") and cluster.ready("ttl", 6))
    cluster.delete("envfleets", "ttl")
    wait_for("the fleet and its ledger gone (garbage collector)",
             lambda: cluster.get("envfleets", "ttl") is None and _gone(cluster, "configmaps/ttl-claims"), timeout=60)


def test_a_retried_trainer_frees_what_its_predecessor_held(cluster: Cluster, operator: InThread,
                                                           env_server: str) -> None:
    """A campaign's trainer pod dies holding every instance of its fleet (claims with a 10-minute
    TTL); the Job's next pod claims them again at once: it releases its holder's claims first."""
    from awm.trainer.k8s_source import KubernetesSettings, KubernetesSource

    cluster.create("envfleets", "retry", fleet_spec(4, env_server, ["crm"]))
    wait_for("4 ready", lambda: cluster.ready("retry", 4))
    settings = KubernetesSettings(api_url(operator), NS, "retry", "grpo-1")

    async def go() -> None:
        async with AllocationClient(api_url(operator), NS, "retry") as alloc:
            dead = await alloc.claim(count=4, group_size=2, ttl_seconds=600, holder="campaign/grpo-1")
            assert (await alloc.get(dead.id)).holder == "campaign/grpo-1"
            with pytest.raises(AllocationError) as exc:
                await alloc.claim(count=1, wait_seconds=0)
            assert exc.value.status == 409  # the fleet is all held
            async with KubernetesSource(settings, ["crm"], per_env=4, group_size=2, claim_timeout_s=20) as source:
                assert len(source._all) == 4 and len(source.claims) == 1
                with pytest.raises(AllocationError) as gone:
                    await alloc.get(dead.id)
                assert gone.value.status == 404
                (held,) = source.claims
                assert (await alloc.get(held)).holder == "campaign/grpo-1"
            with pytest.raises(AllocationError) as bad:
                await alloc.release_holder("")
            assert bad.value.status == 400
            assert (await alloc.release_holder("campaign/nobody")).released == []
    asyncio.run(go())
    wait_for("all 4 back in the pool", lambda: cluster.ready("retry", 4))
    cluster.delete("envfleets", "retry")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "retry") is None)


def test_the_allocation_api_authenticates_and_authorises_callers(cluster: Cluster, operator: InThread,
                                                                  env_server: str) -> None:
    """Callers are Kubernetes identities (TokenReview) allowed by RBAC on the fleet's namespace
    (SubjectAccessReview): no token or a forged one is 401, an identity without the Role is 403,
    and a claim is its maker's: another allowed identity can neither read, renew nor release it,
    nor free it by its holder name. Health stays open."""
    from tests.k8s_e2e import CLIENTS_NS, client_token, grant_claims

    cluster.create("envfleets", "authz", fleet_spec(2, env_server, ["crm"]))
    wait_for("2 ready", lambda: cluster.ready("authz", 2))
    base = f"{api_url(operator)}/v1/namespaces/{NS}/envfleets/authz"
    outsider = client_token(cluster.cp, "outsider")  # no Role in this namespace
    second = client_token(cluster.cp, "second")
    grant_claims(cluster.cp, NS, CLIENTS_NS, "second")
    with httpx.Client(timeout=30) as client:
        def claim(token: str | None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return client.post(f"{base}/claims", json={"count": 1, "holder": "team-a"}, headers=headers)

        assert claim(None).status_code == 401 and claim("not-a-token").status_code == 401
        denied = claim(outsider)
        assert denied.status_code == 403, denied.text
        assert f"system:serviceaccount:{CLIENTS_NS}:outsider may not create envclaims.awm.dev" in denied.json()["error"]
        made = claim(os.environ["AWM_API_TOKEN"])
        assert made.status_code == 201, made.text
        claim_id = made.json()["id"]
        as_second = {"Authorization": f"Bearer {second}"}
        for method, path in (("GET", f"/claims/{claim_id}"), ("POST", f"/claims/{claim_id}/renew"),
                             ("DELETE", f"/claims/{claim_id}")):
            answer = client.request(method, base + path, headers=as_second, json={} if method == "POST" else None)
            assert answer.status_code == 403 and "belongs to" in answer.text, (method, answer.text)
        assert client.delete(f"{base}/claims", params={"holder": "team-a"}, headers=as_second).json()["released"] == []
        mine = client.get(f"{base}/claims/{claim_id}", headers=bearer()).json()
        assert mine["owner"] == f"system:serviceaccount:{CLIENTS_NS}:trainer"
        assert client.delete(f"{base}/claims/{claim_id}", headers=bearer()).status_code == 200
        assert client.get(f"{api_url(operator)}/healthz").status_code == 200
    wait_for("both back", lambda: cluster.ready("authz", 2) and not cluster.ledger("authz"))
    cluster.delete("envfleets", "authz")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "authz") is None)


def _gone(cluster: Cluster, what: str) -> bool:
    try:
        cluster.cp.api("GET", f"/api/v1/namespaces/{cluster.ns}/{what}")
        return False
    except urllib.error.HTTPError as exc:
        return exc.code == 404


def test_a_fleet_binds_late_unless_it_says_otherwise(cluster: Cluster, operator: InThread, late_server: Any) -> None:
    """The default path: a fleet that does not say `binding` over a catalog image binds late (its
    pod carries the catalog and a provisioner sidecar; a claim switches it), and the API server
    keeps it late (binding: pinned is refused on it). Over catalog.url a fleet is pinned, and
    binding: late is refused there."""
    spec = fleet_spec(1, late_server.control_url, ["notes", "crm"])
    del spec["binding"]
    cluster.create("envfleets", "bydefault", spec)
    assert "binding" not in cluster.get("envfleets", "bydefault")["spec"]  # stored as given: no default written
    wait_for("1 ready", lambda: cluster.ready("bydefault", 1))
    (pod,) = cluster.pods("bydefault")
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["bundle", "provisioner"]
    crm = claim_of(cluster, "bydefault-crm", {"fleet": "bydefault", "count": 1, "environment": "crm"})
    assert crm["phase"] == "Bound" and crm["instances"][0]["environment"] == "crm", crm
    assert httpx.get(late_server.control_url + "/info").json()["env"] == "crm"

    def patch(fleet: str, body: dict[str, Any]) -> subprocess.CompletedProcess:
        return cluster.cp.kubectl("-n", cluster.ns, "patch", f"envfleet/{fleet}", "--type", "merge",
                                  "-p", json.dumps(body), check=False)

    refused = patch("bydefault", {"spec": {"binding": "pinned"}})
    assert refused.returncode != 0 and "binding cannot change" in refused.stderr, refused.stderr
    assert patch("bydefault", {"spec": {"binding": "late"}}).returncode == 0  # what it was already
    cluster.delete("envclaims", "bydefault-crm")
    cluster.delete("envfleets", "bydefault")
    url_spec = {**fleet_spec(0, None, ["crm"]), "catalog": {"url": "http://catalog.invalid/"}}
    del url_spec["binding"]
    cluster.create("envfleets", "byurl", url_spec)
    refused = patch("byurl", {"spec": {"binding": "late"}})
    assert refused.returncode != 0 and "image catalog" in refused.stderr, refused.stderr
    cluster.delete("envfleets", "byurl")
    wait_for("both fleets gone", lambda: cluster.get("envfleets", "bydefault") is None
             and cluster.get("envfleets", "byurl") is None, timeout=60)


def test_a_late_binding_fleet_scales_with_concurrent_episodes_not_environments(cluster: Cluster, operator: InThread,
                                                                               late_server: Any) -> None:
    """Autoscaling a late-binding fleet: three GRPO claims of three environments waiting at once
    need 6 instances in all (not 2 per environment kept for each): the fleet grows from 1 to 6
    and every group is switched to its own environment."""
    envs = ["notes", "crm", "project_tracker"]
    cluster.create("envfleets", "lateauto", fleet_spec(1, late_server.control_url, envs, binding="late",
                                                       autoscale=True, minReplicas=1, maxReplicas=8))
    wait_for("1 ready", lambda: cluster.ready("lateauto", 1))
    for env in envs:
        cluster.create("envclaims", f"la-{env.replace('_', '-')}", {"fleet": "lateauto", "count": 2, "groupSize": 2,
                                                                    "environment": env})
    for env in envs:
        bound = wait_for(f"the {env} group bound", lambda env=env: (s := cluster.status(
            "envclaims", f"la-{env.replace('_', '-')}")).get("phase") == "Bound" and s, timeout=90)
        assert {i["environment"] for i in bound["instances"]} == {env} and len(bound["instances"]) == 2
    assert cluster.get("envfleets", "lateauto")["spec"]["replicas"] == 6  # demand in episodes, across the catalog
    for env in envs:
        cluster.delete("envclaims", f"la-{env.replace('_', '-')}")
    cluster.delete("envfleets", "lateauto")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "lateauto") is None)


def test_autoscaling_follows_demand(cluster: Cluster, operator: InThread, env_server: str) -> None:
    cluster.create("envfleets", "auto", fleet_spec(1, env_server, ["crm"], autoscale=True, buffer=2,
                                                   minReplicas=1, maxReplicas=12))
    wait_for("the buffer of 2", lambda: cluster.ready("auto", 2))
    assert cluster.get("envfleets", "auto")["spec"]["replicas"] == 2
    cluster.create("envclaims", "burst", {"fleet": "auto", "count": 6})
    bound = wait_for("the burst bound after scaling up",
                     lambda: (s := cluster.status("envclaims", "burst")).get("phase") == "Bound" and s, timeout=60)
    assert len(bound["instances"]) == 6
    wait_for("allocated + buffer", lambda: cluster.get("envfleets", "auto")["spec"]["replicas"] == 8
             and cluster.status("envfleets", "auto").get("ready") == 2)
    huge = claim_of(cluster, "huge", {"fleet": "auto", "count": 13})
    assert huge["phase"] == "Failed" and "maxReplicas" in huge["message"]
    cluster.delete("envclaims", "huge")
    cluster.delete("envclaims", "burst")
    wait_for("scaled back down to the buffer", lambda: cluster.get("envfleets", "auto")["spec"]["replicas"] == 2
             and cluster.ready("auto", 2), timeout=60)
    cluster.delete("envfleets", "auto")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "auto") is None)


def test_autoscaling_serves_grpo_and_per_environment_claims_on_a_mixed_fleet(cluster: Cluster, operator: InThread,
                                                                             env_server: str) -> None:
    """An even spread of the autoscaled total (16 + buffer 2 = 6/6/6) holds no 4 groups of 4; the
    fleet puts the waiting claims' instances where they are needed instead (the chart's example)."""
    cluster.create("envfleets", "mixed", fleet_spec(0, env_server, autoscale=True, buffer=2, maxReplicas=40))
    wait_for("the buffer of 2", lambda: cluster.ready("mixed", 2))
    grpo = claim_of(cluster, "mixed-grpo", {"fleet": "mixed", "count": 16, "groupSize": 4})
    assert grpo["phase"] == "Bound", grpo
    groups: dict[int, set[str]] = {}
    for inst in grpo["instances"]:
        groups.setdefault(inst["group"], set()).add(inst["environment"])
    assert len(groups) == 4 and all(len(envs) == 1 for envs in groups.values())
    crm = claim_of(cluster, "mixed-crm", {"fleet": "mixed", "count": 8, "environment": "crm"})
    assert crm["phase"] == "Bound" and {i["environment"] for i in crm["instances"]} == {"crm"}, crm
    cluster.delete("envclaims", "mixed-grpo")
    cluster.delete("envclaims", "mixed-crm")
    wait_for("scaled back down to the buffer", lambda: cluster.get("envfleets", "mixed")["spec"]["replicas"] == 2
             and cluster.ready("mixed", 2), timeout=60)
    cluster.delete("envfleets", "mixed")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "mixed") is None)


# --------------------------------------------------------------------------- databases


def test_fleet_deletion_drops_its_databases(cluster: Cluster, operator: InThread, admin_dsn: str,
                                            notes_bundle: Any) -> None:
    cluster.create("envfleets", "dbs", fleet_spec(3, None, ["notes"]))
    wait_for("3 ready", lambda: cluster.ready("dbs", 3))
    template = provision.ensure_template(admin_dsn, notes_bundle)

    def provision_for(pod: str) -> str:  # what the pod's init container does
        name = provision.pod_instance_name(pod)
        provision.create_instance(admin_dsn, template, name, meta={"pod": pod, "fleet": "dbs", "namespace": NS})
        return name

    pods = [p["metadata"]["name"] for p in cluster.pods("dbs")]
    dbs = {pod: provision_for(pod) for pod in pods}
    stray = provision_for("dbs-notes-neverexisted")
    other = provision.pod_instance_name("other-notes-keepme")
    provision.create_instance(admin_dsn, template, other, meta={"pod": "other-notes-keepme", "fleet": "other",
                                                                 "namespace": NS})
    # Deleted pods' databases are swept on reconcile.
    cluster.delete_pods([pods[0]])
    wait_for("the deleted pod's and the stray database dropped",
             lambda: not {dbs[pods[0]], stray} & set(provision.list_instances(admin_dsn)), timeout=30)
    assert {dbs[pods[1]], dbs[pods[2]]} <= set(provision.list_instances(admin_dsn))
    # Deleting the fleet deletes its pods, then drops every database it has.
    cluster.delete("envfleets", "dbs")
    wait_for("the fleet gone (its finalizer done)", lambda: cluster.get("envfleets", "dbs") is None, timeout=60)
    assert not cluster.pods("dbs")
    left = set(provision.list_instances(admin_dsn))
    assert not set(dbs.values()) & left and other in left
    provision.drop_instance(admin_dsn, other)


def test_pods_spread_over_database_shards_and_a_lost_shards_pods_are_replaced(
        cluster: Cluster, operator: InThread, admin_dsn: str, notes_bundle: Any, env_server: str,
        tmp_path: Any) -> None:
    """Two real Postgres servers as the shards of one fleet (Secret keys `dsn` and `dsn-b`): new
    pods go to the shard with the most free connection slots, each pod's provisioning reads its
    own shard's key; shard b stopped for longer than shard_lost_after: its pods (also an
    allocated one, which its EnvClaim reports lost) are replaced on the default shard, the
    status and metrics say so; b back: up again, and the databases left there by the replaced
    pods are swept."""
    from awm.postgres.server import EmbeddedPostgres

    b = EmbeddedPostgres(tmp_path / "shard-b")
    b.start()
    try:
        provision.harden_cluster(b.admin_dsn())
        cluster.cp.kubectl("-n", NS, "create", "secret", "generic", "awm-shards", f"--from-literal=dsn={admin_dsn}",
                           f"--from-literal=dsn-b={b.admin_dsn()}")
        spec = fleet_spec(4, env_server, ["notes"], database={"secretName": "awm-shards"})
        cluster.create("envfleets", "sharded", spec)
        wait_for("4 ready", lambda: cluster.ready("sharded", 4))

        def shard_of(pod: dict[str, Any]) -> str:
            return pod["metadata"]["labels"]["awm.dev/db-shard"]

        pods = cluster.pods("sharded")
        for pod in pods:  # the provisioning container reads the admin DSN of the pod's own shard
            (prov,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "provision"]
            ref = next(e for e in prov["env"] if e["name"] == "AWM_ADMIN_DSN")["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "awm-shards", "key": "dsn" if shard_of(pod) == "default" else "dsn-b"}
        # b has fewer backends open than the default shard (which the tests' env servers use): the
        # first pod at least went there
        on_b = sorted(p["metadata"]["name"] for p in pods if shard_of(p) == "b")
        assert on_b, [shard_of(p) for p in pods]
        status = wait_for("both shards up in the status", lambda: (s := cluster.status("envfleets", "sharded"))
                          .get("shards") and all(x["state"] == "Up" for x in s["shards"]) and s)
        assert {x["name"]: x["instances"] for x in status["shards"]} == {"b": len(on_b), "default": 4 - len(on_b)}
        assert all(x["maxConnections"] > 0 for x in status["shards"])
        db_cond = next(c for c in status["conditions"] if c["type"] == "DatabaseAvailable")
        assert (db_cond["status"], db_cond["reason"]) == ("True", "AllShardsUp")
        assert metric(operator, "awm_db_shard_up", fleet="sharded", shard="b") == 1
        assert metric(operator, "awm_db_shard_instances", fleet="sharded", shard="b") == len(on_b)
        # what a pod on b provisioned there (kwok runs no init containers: the test does it)
        template = provision.ensure_template(b.admin_dsn(), notes_bundle)
        left_on_b = provision.pod_instance_name(on_b[0])
        provision.create_instance(b.admin_dsn(), template, left_on_b,
                                  meta={"pod": on_b[0], "fleet": "sharded", "namespace": NS})
        # an EnvClaim holding a pod on b
        held = claim_of(cluster, "on-b", {"fleet": "sharded", "count": 4})
        assert held["phase"] == "Bound"

        b.stop()  # shard b is gone
        down = wait_for("b down", lambda: any(x["name"] == "b" and x["state"] in ("Down", "Lost") for x in
                                              cluster.status("envfleets", "sharded").get("shards", [])), timeout=30)
        assert down
        wait_for("b's pods replaced on the default shard", lambda: (ps := cluster.pods("sharded")) and
                 len(ps) == 4 and all(shard_of(p) == "default" for p in ps), timeout=60)
        status = wait_for("b lost in the status", lambda: (s := cluster.status("envfleets", "sharded")).get(
            "shards") and any(x["name"] == "b" and x["state"] == "Lost" for x in s["shards"]) and s)
        db_cond = next(c for c in status["conditions"] if c["type"] == "DatabaseAvailable")
        assert (db_cond["status"], db_cond["reason"]) == ("False", "ShardLost") and "b: lost" in db_cond["message"]
        assert metric(operator, "awm_db_shard_up", fleet="sharded", shard="b") == 0
        assert metric(operator, "awm_db_shard_lost_total", fleet="sharded", shard="b") == 1
        degraded = wait_for("the claim reports its instances on b lost", lambda: (
            s := cluster.status("envclaims", "on-b")).get("phase") == "Degraded" and s)
        assert set(degraded["lost"]) == set(on_b)
        cluster.delete("envclaims", "on-b")
        wait_for("4 ready on the default shard", lambda: cluster.ready("sharded", 4))

        b.start()  # back: up again; what the replaced pods left there is swept
        wait_for("b up again", lambda: any(x["name"] == "b" and x["state"] == "Up" for x in
                                           cluster.status("envfleets", "sharded").get("shards", [])), timeout=30)
        wait_for("the database a replaced pod left on b dropped",
                 lambda: left_on_b not in provision.list_instances(b.admin_dsn()), timeout=30)
        cluster.delete("envfleets", "sharded")
        wait_for("the fleet gone", lambda: cluster.get("envfleets", "sharded") is None, timeout=60)
    finally:
        b.stop()


# --------------------------------------------------------------------------- scale

def test_a_ledger_spread_over_configmaps(control_plane: Any, cluster: Cluster, admin_dsn: str,
                                        env_server: str) -> None:
    """A ledger ConfigMap holds at most 1 MiB, and 4,096 one-instance claims can need 3 MB: the
    ledger spreads over shards. Here an operator whose shards take ~3 claims each: claims of both
    kinds land whole in one shard each and never share an instance, a restarted operator reads
    every shard back, released room is reused before a new shard is made, and the shards go with
    the fleet."""
    ns = "awm-shards"
    setup_namespace(control_plane, ns, admin_dsn)
    shards = Cluster(control_plane, ns)
    config = operator_config(ns, ledger_shard_bytes=450)

    async def claim(op: InThread, n: int, **kwargs: Any) -> list[Claim]:
        async with AllocationClient(api_url(op), ns, "sharded") as alloc:
            return list(await asyncio.gather(*(alloc.claim(count=1, **kwargs) for _ in range(n))))

    async def release(op: InThread, ids: list[str]) -> None:
        async with AllocationClient(api_url(op), ns, "sharded") as alloc:
            await asyncio.gather(*(alloc.release(i) for i in ids))

    with InThread(config, control_plane.kubeconfig) as op:
        shards.create("envfleets", "sharded", fleet_spec(10, env_server, ["crm", "notes"]))
        wait_for("10 ready", lambda: shards.ready("sharded", 10), timeout=120)
        api = asyncio.run(claim(op, 8))
        got = claim_of(shards, "two", {"fleet": "sharded", "count": 2})
        assert got["phase"] == "Bound"
    stored = shards.ledger_shards("sharded")
    assert len(stored) >= 3 and "sharded-claims" in stored and "sharded-claims-1" in stored, stored
    for name, data in stored.items():
        assert len(data) == 1 or sum(len(k) + len(v) for k, v in data.items()) <= 450, (name, data)
    held = [p for cid, groups in shards.ledger("sharded").items() for g in groups for p in g]
    assert len(held) == 10 and len(set(held)) == 10
    assert sum(len(data) for data in stored.values()) == 9  # each claim in exactly one shard

    with InThread(config, control_plane.kubeconfig) as op:  # a restarted operator
        wait_for("all 10 allocated", lambda: (s := shards.status("envfleets", "sharded")).get("allocated") == 10
                 and s.get("ready") == 0)
        with pytest.raises(AllocationError) as exc:
            asyncio.run(claim(op, 1, wait_seconds=1))
        assert exc.value.status == 409  # nothing handed out twice
        asyncio.run(release(op, [c.id for c in api[:4]]))
        again = asyncio.run(claim(op, 4))
        assert set(shards.ledger_shards("sharded")) == set(stored)  # the freed room was reused
        assert len(set(shards.allocated("sharded"))) == 10
        asyncio.run(release(op, [c.id for c in api[4:] + again]))
        shards.delete("envclaims", "two")
        wait_for("all 10 back in the pool", lambda: shards.ready("sharded", 10) and not shards.ledger("sharded"))
        shards.delete("envfleets", "sharded")
        wait_for("the fleet and its ledger gone", lambda: shards.get("envfleets", "sharded") is None
                 and not shards.ledger_shards("sharded"), timeout=120)


def test_the_pod_watch_lists_in_pages(cluster: Cluster, operator: InThread) -> None:
    """At 4,096 pods one LIST answer is ~45 MB of JSON: the watch lists in pages (limit/continue)
    and sees every pod; here in pages of 3 against the real API server."""
    from awm_operator.kube import Kube
    from awm_operator.state import Fleets
    from awm_operator.watch import PodWatcher

    cluster.create("envfleets", "paged", fleet_spec(7, None, ["crm"]))
    wait_for("7 ready", lambda: cluster.ready("paged", 7))
    names = {p["metadata"]["name"] for p in cluster.pods("paged")}

    async def go() -> tuple[set[str], str, list[int]]:
        kube = await Kube.connect(cluster.cp.kubeconfig)
        try:
            fleets = Fleets()
            version = await PodWatcher(kube, fleets, NS, page=3)._list()
            sizes = [len(page.get("items") or []) async for page in kube.list_pages(
                f"/api/v1/namespaces/{NS}/pods", [("labelSelector", "awm.dev/fleet=paged")], limit=3)]
            return set((fleets.get(NS, "paged") or fleets.ensure(NS, "paged")).pods), version, sizes
        finally:
            await kube.close()
    seen, version, sizes = asyncio.run(go())
    assert seen == names and version.isdigit() and sizes == [3, 3, 1]
    cluster.delete("envfleets", "paged")
    wait_for("the fleet gone", lambda: cluster.get("envfleets", "paged") is None and not cluster.pods("paged"))


# --------------------------------------------------------------------------- more than one replica


def test_peering_one_replica_acts_and_a_standby_takes_over(control_plane: Any, cluster: Cluster, admin_dsn: str) -> None:
    ns = "awm-peer"
    setup_namespace(control_plane, ns, admin_dsn)
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(
        {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "awm", "namespace": ns}}))
    peer = Cluster(control_plane, ns)

    def config(priority: int) -> OperatorConfig:
        return operator_config(ns, peering="awm", priority=priority, scale_down_delay=30.0,
                               db_sweep_interval=60.0, reset_timeout=30.0, claim_wait_default=30.0)

    with InThread(config(10), control_plane.kubeconfig) as standby:
        active = InThread(config(20), control_plane.kubeconfig).__enter__()
        try:
            time.sleep(2)  # both announce themselves; the lower priority pauses
            peer.create("envfleets", "ha", fleet_spec(5, None, ["crm"]))
            wait_for("5 ready", lambda: peer.ready("ha", 5), timeout=60)
            time.sleep(1)
            assert metric(active, "awm_pod_operations_total", fleet="ha", operation="create") == 5
            assert metric(standby, "awm_pod_operations_total", fleet="ha", operation="create") == 0
            assert len(peer.pods("ha")) == 5

            async def claim(op: InThread, count: int, wait: float = 60, retries: int = 8) -> Claim:
                async with AllocationClient(api_url(op), ns, "ha", standby_retries=retries) as alloc:
                    return await alloc.claim(count=count, wait_seconds=wait)
            first = asyncio.run(claim(active, 2))
            with pytest.raises(AllocationError) as exc:  # a standby does not allocate
                asyncio.run(claim(standby, 1, wait=0.5, retries=0))
            assert exc.value.status == 503
        finally:
            active.stop()
        peer.scale("ha", 7)
        wait_for("the standby took over", lambda: (s := peer.status("envfleets", "ha")).get("replicas") == 7
                 and s.get("ready") == 5 and s.get("allocated") == 2, timeout=90)
        assert metric(standby, "awm_pod_operations_total", fleet="ha", operation="create") == 2
        # The claim made through the stopped replica survived in the ledger: the new one knows it
        # and never hands its instances out again.
        async def show() -> Claim:
            async with AllocationClient(api_url(standby), ns, "ha") as alloc:
                return await alloc.get(first.id)
        assert {i.pod for i in asyncio.run(show()).instances} == {i.pod for i in first.instances}
        second = asyncio.run(claim(standby, 5))
        assert not {i.pod for i in second.instances} & {i.pod for i in first.instances}
        peer.delete("envfleets", "ha")
        wait_for("the fleet gone", lambda: peer.get("envfleets", "ha") is None, timeout=60)


def test_replicas_started_before_their_peering_object_still_elect_one(control_plane: Any, cluster: Cluster,
                                                                       admin_dsn: str) -> None:
    """`helm install` creates the chart's KopfPeering after the operator's Deployment, so replicas
    can start before it exists. kopf's first announcement then found nothing, and when the object
    appeared both replicas saw no peer and acted together until the next keep-alive (~55 s: seen
    on the real node as a release answered 404 by the replica that did not know the claim). The
    startup now waits for the object. Judged by effects: neither replica is ready while it is
    missing, and once it exists only one of them creates the fleet's pods."""
    ns = "awm-peer-late"
    setup_namespace(control_plane, ns, admin_dsn)
    peer = Cluster(control_plane, ns)

    def config(priority: int) -> OperatorConfig:
        return operator_config(ns, peering="awm", priority=priority, scale_down_delay=30.0,
                               db_sweep_interval=60.0, reset_timeout=30.0, claim_wait_default=30.0)

    replicas = [InThread(config(10), control_plane.kubeconfig), InThread(config(20), control_plane.kubeconfig)]
    starters = [threading.Thread(target=op.__enter__) for op in replicas]
    for starter in starters:
        starter.start()
    try:
        time.sleep(2)
        assert not any(op.ready_flag.is_set() for op in replicas), "a replica started without its peering object"
        control_plane.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "awm", "namespace": ns}}))
        for starter in starters:
            starter.join(60)
        assert all(op.ready_flag.is_set() and op.error is None for op in replicas), [op.error for op in replicas]
        peer.create("envfleets", "late-peer", fleet_spec(3, None, ["crm"]))
        wait_for("3 pods", lambda: len(peer.pods("late-peer")) == 3, timeout=60)
        time.sleep(1)
        created = [metric(op, "awm_pod_operations_total", fleet="late-peer", operation="create") for op in replicas]
        assert sorted(created) == [0, 3], created
        assert created[1] == 3, created  # the higher priority acts
        peer.delete("envfleets", "late-peer")
        wait_for("the fleet gone", lambda: peer.get("envfleets", "late-peer") is None, timeout=60)
    finally:
        for op in replicas:
            op.stop()


def test_allocation_api_refuses_dns_rebinding(cluster: Cluster, operator: InThread) -> None:
    """A browser page on a rebound DNS name carries that name in Host (421) and its own Origin
    (403); trainers, addressing the operator by IP or Service name without an Origin, are served."""

    base = api_url(operator)
    claims = f"{base}/v1/namespaces/{NS}/envfleets/pool/claims"
    with httpx.Client(timeout=30) as client:
        evil_host = client.post(claims, json={"count": 1}, headers={"Host": "evil.example.com"})
        assert evil_host.status_code == 421, evil_host.text
        evil_origin = client.get(f"{base}/v1/namespaces/{NS}/envfleets/pool",
                                 headers={"Origin": "http://evil.example.com"})
        assert evil_origin.status_code == 403, evil_origin.text
        # past the guard: the API's own answer (no fleet of that name)
        as_service = client.get(f"{base}/v1/namespaces/{NS}/envfleets/no-such-fleet",
                                headers={"Host": "awm-operator.awm-system.svc:8080", **bearer()})
        assert as_service.status_code == 404 and "no such fleet" in as_service.text, as_service.text
        assert client.get(f"{base}/readyz", headers={"Host": "evil.example.com"}).status_code in (200, 503)
