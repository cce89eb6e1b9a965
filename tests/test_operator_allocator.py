"""The allocator (awm_operator/allocator.py): two replicas binding one claim, and a late
fleet's claims landing on the pods that keep their environment, learnt from the pods' answers."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from awm.claims import ClaimRequest
from awm_operator.ledger import Ledger
from awm_operator.metrics import Metrics
from awm_operator.pods import A_CONTROL_URL, PodInfo
from awm_operator.state import ClaimRecord, Fleet
from tests.operator_fakes import ConfigMapServer, fleet_spec, ledger_fleet, pod, serve_app


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
    first = await alloc.claim(a, "victim.u1", ClaimRequest(count=1), wait=0, source="envclaim")
    b.reserve(["p0"])  # as if b's own other claim held it for a moment: b picks another pod than a
    second = await alloc.claim(b, "victim.u1", ClaimRequest(count=1), wait=0, source="envclaim")
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
        assert await claim("1", ClaimRequest(count=1, environment="b")) == ["p0"]  # p0 keeps a, b
        assert await claim("2", ClaimRequest(count=1, environment="c")) == ["p1"]  # p1 keeps a, c
        assert await claim("3", ClaimRequest(count=1, environment="d")) == ["p0"]  # p0 keeps b, d
        assert fleet.cached == {"p0": ("b", "d"), "p1": ("a", "c")}
        assert {e: set(n) for e, n in fleet.holding.items()} == {"a": {"p1"}, "b": {"p0"}}
        # b: p1 comes first among the free pods (filed under c, before p0 under d), but p0 keeps b
        assert await claim("4", ClaimRequest(count=1, environment="b")) == ["p0"]
        assert pods["p0"].binds[-1] == ("b", "cached")
        moved = "p1"
        kinds = {k: metrics.switches.labels("ns", "f", k)._value.get() for k in ("serving", "cached", "new")}  # noqa: SLF001
        assert kinds == {"serving": 0, "cached": 1, "new": 3}, kinds
        # A claim its client switches: the operator learns what the pod serves at its release.
        (got,) = [b.pod.name for b in await alloc.claim(fleet, "client", ClaimRequest(count=1, environment="c",
                                                                                     switch="client"),
                                                         wait=5, source="api")]
        assert got == moved  # it serves c
        pods[moved].bind("d")  # the client switched it elsewhere (as a lease with another environment would)
        await alloc.release(fleet, "client")
        assert fleet.env_of(moved) == "d" and moved in fleet.available["d"] and fleet.cached[moved] == ("c", "d")
    finally:
        await alloc.close()
        for runner in runners:
            await runner.cleanup()
