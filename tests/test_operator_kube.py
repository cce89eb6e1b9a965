"""The operator's process and its link to the API server: the API client's settings (kube.py),
configuration from the environment (config.py), the startup wait for peering (peering.py), the
event loop (main.py) and the pod watch (watch.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from awm_operator.config import OperatorConfig
from awm_operator.pods import pod_manifest
from tests.operator_fakes import fleet_spec


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
