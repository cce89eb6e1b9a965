"""The operator's allocation API (awm_operator/api.py) and its client's retries when a standby
answers, the API's Host guard (hostguard.py), authentication and authorization (auth.py), and the
account a campaign's trainer calls it with."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
import pytest

from awm_operator.config import OperatorConfig
from tests.operator_fakes import fleet_spec, operator_fleet


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
        return web.json_response({"id": "api_1", "namespace": "ns", "fleet": "f", "instances": []}, status=201)

    app = web.Application()
    app.router.add_route("*", "/v1/namespaces/ns/envfleets/f/claims", handler)
    app.router.add_route("*", "/v1/namespaces/ns/envfleets/f/claims/{id}", handler)
    async with TestServer(app) as server:
        async with AllocationClient(str(server.make_url("")), "ns", "f", token="t0ken") as alloc:
            assert (await alloc.claim(count=1)).id == "api_1"
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
        return web.json_response({"id": f"api_{env}", "namespace": "ns", "fleet": "f", "instances": []},
                                 status=201)

    app = web.Application(middlewares=[unavailable_closes])
    app.router.add_post("/v1/namespaces/ns/envfleets/f/claims", claims)
    async with TestServer(app) as server:
        async with AllocationClient(str(server.make_url("")), "ns", "f") as alloc:
            slow = asyncio.ensure_future(alloc.claim(environment="slow"))
            await asyncio.sleep(0.1)
            assert (await alloc.claim(environment="fast")).id == "api_fast"
            assert (await slow).id == "api_slow" and standby_once == ["fast"]
        async with aiohttp.ClientSession() as http:  # the standby's answer closes its connection
            standby_once.clear()
            async with http.post(server.make_url("/v1/namespaces/ns/envfleets/f/claims"), json={"environment": "x"}) as r:
                assert r.status == 503 and r.headers.get("Connection", "").lower() == "close"
            async with http.post(server.make_url("/v1/namespaces/ns/envfleets/f/claims"), json={"environment": "x"}) as r:
                assert r.status == 201 and r.headers.get("Connection", "").lower() != "close"


# --------------------------------------------------------------------------- API authentication


@pytest.mark.parametrize("host, ok", [
    ("10.0.0.7:8080", True), ("[fd00::1]:8080", True), ("awm-operator:8080", True),
    ("awm-operator.awm.svc", True), ("awm-operator.awm.svc.cluster.local:8080", True),
    ("evil.example.com", False), ("awm-operator.awm.svc.evil.example.com", False), ("", False),
    ("trainer.example.org", True),  # configured
])
def test_operator_api_host_guard(host: str, ok: bool) -> None:
    from awm_operator.hostguard import host_allowed

    assert host_allowed(host, ["cluster.local"], ["trainer.example.org"]) is ok


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
