"""What the operator's unit tests (tests/test_operator_*.py) and the UI's tests share: fleet
specs, pod objects, in-memory fleets, an in-memory ConfigMap server for the claims ledger, and an
aiohttp app served on a free port.

End-to-end tests on a real control plane are in test_operator_e2e.py.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from awm_operator.crds import EnvFleetSpec
from awm_operator.kube import ApiError
from awm_operator.shards import CONFIGMAP_LIMIT
from awm_operator.pods import A_ENV, PodInfo
from awm_operator.state import Fleet


def fleet_spec(**extra) -> EnvFleetSpec:
    """A pinned fleet unless ``binding`` is given (most of these tests are about pinned pods; the
    default binding has tests of its own)."""
    return EnvFleetSpec.model_validate({"environments": ["crm", "bike_shop"], "replicas": 4, "catalog": {},
                                        "database": {"secretName": "awm-database"}, "binding": "pinned", **extra})


def pod(name: str, env: str = "crm", ready: bool = True, rv: int = 1, **annotations: str) -> dict:
    ann = {A_ENV: env, **annotations}
    return {"metadata": {"name": name, "resourceVersion": str(rv), "labels": {}, "annotations": ann},
            "status": {"phase": "Running", "podIP": "10.0.0.1",
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


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
