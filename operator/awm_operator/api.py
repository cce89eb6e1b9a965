"""The operator's HTTP side: health, the allocation API (port 8080) and metrics (port 9090).

The allocation API is the fast path for trainers: one HTTP round trip binds instances straight
from the operator's in-memory pool (the EnvClaim resource costs a create, a watch event, a status
patch and a watch event back). Both paths share the allocator and the fleet's ledger, so they
never hand out the same instance. Claims made here have ids ``api_<hex>`` (an underscore never
occurs in an EnvClaim's name) and a TTL: one not released nor renewed in time is released by
the operator, so a crashed trainer does not hold instances forever.

    POST   /v1/namespaces/{ns}/envfleets/{fleet}/claims       {"count": 16, "groupSize": 8,
                                                               "environment": null, "waitSeconds": 30,
                                                               "ttlSeconds": 3600, "holder": null,
                                                               "switch": "operator"}
        201 {"id", "namespace", "fleet", "instances": [{"pod", "environment", "group", "mcpUrl",
             "controlUrl", "switched"}], "expiresAt", "latencyMs"}
        A late-binding fleet's instances are switched to the claim's environment before the answer;
        with "switch": "client" the answer comes at once and an instance with "switched": false
        must be switched by the client (POST <controlUrl>/bind, or /reset with "env") before use.
        The release answers once the instances are reset (the ledger is written after it).
        400 bad request, 404 unknown fleet, 409 not enough ready instances within waitSeconds,
        503 this replica is a standby (kopf peering)
    GET    /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}        -> the claim; lost instances flagged
    POST   /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}/renew  {"ttlSeconds": 3600} -> {"expiresAt"}
    DELETE /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}  -> 200 {"returned", "replaced"}, 404 unknown
    DELETE /v1/namespaces/{ns}/envfleets/{fleet}/claims?holder=H -> 200 {"released": [ids], "returned",
        "replaced"}: every claim of that holder (a retried trainer pod frees what its dead predecessor
        held, instead of waiting out the TTL)

Every /v1/ request is authenticated and authorised against Kubernetes RBAC (awm_operator/auth.py:
a bearer ServiceAccount token; 401 without a valid one, 403 when RBAC says no or the claim is
another identity's), unless the operator runs with AWM_API_AUTH=off.
    GET    /v1/namespaces/{ns}/envfleets/{fleet}              -> sizes, demand, whether this replica acts
    GET    /v1/namespaces/{ns}/envfleets/{fleet}/instances    -> every instance (environment, state,
        claim, holder, problem) and every claim (holder, size, age, time left)
    GET    /v1/namespaces/{ns}/envfleets                      -> every fleet with its counts and Ready
        condition (what `awm ui --namespace NS` shows)
    GET    /v1/namespaces/{ns}/campaigns                      -> every campaign with its status, progress
        and its fleet's counts (campaigns.py; what `awm ui --namespace NS` shows)
    GET    /healthz (process alive), /readyz (this replica acts on its fleets)
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from awm_operator import auth as authn
from awm_operator import hostguard
from awm_operator.allocator import ClaimError, InProgress, NotActive, Unavailable, describe
from awm_operator.campaigns import add_campaign_routes
from awm_operator.crds import GROUP, MAX_REPLICAS, VERSION, binding_of
from awm_operator.kube import ApiError
from awm_operator.reconcile import Context
from awm_operator.state import ClaimRequest, Fleets

MAX_WAIT = 600.0
CLAIM_ID = re.compile(r"api_[0-9a-f]{16,64}")  # a claim id a client may choose (to ask again after a lost answer)
HOLDER_RELEASE_CONCURRENCY = 64  # releases of one DELETE ?holder= in flight (resets, ledger writes)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


ENVIRONMENT_NAMES = 2000  # a fleet's environment names listed (what a claim may ask for), at most


def fleet_summary(obj: dict[str, Any], fleets: Fleets) -> dict[str, Any]:
    """One EnvFleet as ``GET .../envfleets`` lists it."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    replicas, ready, allocated = (int(status.get(k) or 0) for k in ("replicas", "ready", "allocated"))
    names = list(status.get("environments") or spec.get("environments") or [])
    binding = binding_of(spec.get("binding"), (spec.get("catalog") or {}).get("url"))
    row: dict[str, Any] = {
        "namespace": meta["namespace"], "fleet": meta["name"], "binding": binding,
        "environments": len(names), "environmentNames": names[:ENVIRONMENT_NAMES],
        "replicas": replicas, "ready": ready, "allocated": allocated,
        "starting": max(0, replicas - ready - allocated), "demand": None, "live": False,
        "condition": next(({k: c.get(k) for k in ("status", "reason", "message")}
                           for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)}
    fleet = fleets.get(meta["namespace"], meta["name"])
    if fleet is not None and fleet.spec is not None and fleet.active and not fleet.deleted:
        row |= {**fleet.counts().as_dict(), "demand": fleet.demand(), "live": True}
    return row


@web.middleware
async def unavailable_closes(request: web.Request, handler: Any) -> web.StreamResponse:
    """A 503 (a standby replica, or one that does not act on the fleet) closes its connection:
    the Service balances per connection, so the client's next request gets a new one, which may
    reach the active replica (awm.episode.allocation.past_standby asks again)."""
    try:
        response = await handler(request)
    except web.HTTPServiceUnavailable as exc:
        exc.force_close()
        raise
    if response.status == 503:
        response.force_close()
    return response


def build_api(ctx: Context, fleets: Fleets, auth: authn.Authenticator | None = None) -> web.Application:
    """``auth``: who may call (:mod:`awm_operator.auth`); None leaves the API open (AWM_API_AUTH=off)."""
    routes = web.RouteTableDef()

    def caller(request: web.Request) -> str | None:
        who = authn.identity(request)
        return who.user if who else None

    def not_yours(request: web.Request, fleet: Any, claim_id: str) -> web.Response | None:
        """403 when the API authenticates and the claim was made by another identity."""
        record = fleet.claims.get(claim_id)
        me = caller(request)
        if record is not None and me is not None and record.owner is not None and record.owner != me:
            return _error(403, f"claim {claim_id} belongs to {record.owner}, not to {me}")
        return None

    @routes.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    @routes.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if fleets.acting() else web.Response(status=503, text="standby")

    def fleet_of(request: web.Request):  # type: ignore[no-untyped-def]
        fleet = fleets.get(request.match_info["ns"], request.match_info["fleet"])
        if fleet is not None and fleet.spec is None and not fleet.active and fleet.pods and not fleet.deleted:
            # its pods are watched but its spec is not: kopf pauses a standby replica's handlers
            raise web.HTTPServiceUnavailable(text='{"error": "this operator replica is a standby"}',
                                             content_type="application/json")
        if fleet is None or fleet.spec is None or fleet.deleted:
            raise web.HTTPNotFound(text='{"error": "no such fleet"}', content_type="application/json")
        return fleet

    @routes.get("/v1/namespaces/{ns}/envfleets")
    async def listing(request: web.Request) -> web.Response:
        """Every EnvFleet of the namespace (read from the API server, so a standby replica
        answers too), with this replica's live counts where it acts on the fleet, else the
        counts of the fleet's status; and its Ready condition (why it is not ready)."""
        namespace = request.match_info["ns"]
        try:
            listed = await ctx.kube.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/envfleets")
        except (ApiError, OSError, asyncio.TimeoutError) as exc:
            return _error(502, f"cannot list fleets: {exc}")
        return web.json_response({"namespace": namespace, "fleets": [
            fleet_summary(obj, fleets) for obj in sorted(listed.get("items") or [], key=lambda o: o["metadata"]["name"])]})

    @routes.get("/v1/namespaces/{ns}/envfleets/{fleet}")
    async def show(request: web.Request) -> web.Response:
        fleet = fleet_of(request)
        return web.json_response({"namespace": fleet.namespace, "fleet": fleet.name, "active": fleet.active,
                                  **fleet.counts().as_dict(), "demand": fleet.demand()})

    @routes.get("/v1/namespaces/{ns}/envfleets/{fleet}/instances")
    async def instances(request: web.Request) -> web.Response:
        """Every instance with its state and who holds it, and the claims: what a person looking at
        the fleet (awm ui's fleet page) wants beyond the counts. Read-only, like ``show``."""
        fleet = fleet_of(request)
        now = time.time()
        rows = []
        for pod in sorted(fleet.pods.values(), key=lambda p: (p.env, p.name)):
            claim = fleet.owner.get(pod.name)
            record = fleet.claims.get(claim) if claim else None
            state = ("deleting" if pod.deleting else "failed" if pod.failed else "allocated" if claim
                     else "ready" if pod.allocatable else "starting")
            rows.append({"pod": pod.name, "environment": pod.env, "state": state, "phase": pod.phase,
                         "claim": claim, "holder": record.holder if record else None, "problem": pod.problem,
                         "mcpUrl": pod.mcp_url, "controlUrl": pod.control_url})
        claims = [{"id": cid, "holder": rec.holder, "owner": rec.owner, "instances": len(rec.pods),
                   "groups": len(rec.groups), "ageSeconds": round(now - rec.created, 1),
                   "expiresInSeconds": None if rec.expires is None else round(rec.expires - now, 1)}
                  for cid, rec in sorted(fleet.claims.items())]
        return web.json_response({"namespace": fleet.namespace, "fleet": fleet.name, "instances": rows,
                                  "claims": claims})

    def ttl_of(body: dict[str, Any]) -> float:
        ttl = float(body.get("ttlSeconds") or ctx.config.claim_ttl_default)
        if not 0 < ttl <= ctx.config.claim_ttl_max:
            raise ValueError(f"ttlSeconds must be in (0, {ctx.config.claim_ttl_max:g}]")
        return ttl

    def holder_of(value: Any) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str) or len(value) > 253:
            raise ValueError("holder must be a string of at most 253 characters")
        return value

    @routes.post("/v1/namespaces/{ns}/envfleets/{fleet}/claims")
    async def claim(request: web.Request) -> web.Response:
        t0 = time.monotonic()
        fleet = fleet_of(request)
        try:
            body: dict[str, Any] = await request.json() if request.can_read_body else {}
            switch = body.get("switch", "operator")
            if switch not in ("operator", "client"):
                raise ValueError("switch must be 'operator' (the default) or 'client'")
            req = ClaimRequest(count=int(body.get("count", 1)), environment=body.get("environment"),
                               group_size=int(body["groupSize"]) if body.get("groupSize") else None,
                               client_switches=switch == "client")
            wait = min(float(body.get("waitSeconds", ctx.config.claim_wait_default)), MAX_WAIT)
            ttl = ttl_of(body)
            holder = holder_of(body.get("holder"))
            claim_id = body.get("id") or f"api_{secrets.token_hex(8)}"
            if not isinstance(claim_id, str) or not CLAIM_ID.fullmatch(claim_id):
                raise ValueError("id must be api_ and 16-64 lowercase hex digits")
        except (ValueError, TypeError, AttributeError) as exc:
            return _error(400, f"bad request: {exc}")
        denied = not_yours(request, fleet, claim_id)  # asked again after a lost answer: the maker's only
        if denied is not None:
            return denied
        try:
            bound = await ctx.allocator.claim(fleet, claim_id, req, wait, source="api", ttl=ttl, holder=holder,
                                              owner=caller(request))
        except ClaimError as exc:
            return _error(400, str(exc))
        except NotActive as exc:
            return _error(503, str(exc))
        except (Unavailable, InProgress) as exc:
            return _error(409, str(exc))
        record = fleet.claims.get(claim_id)
        return web.json_response({"id": claim_id, "namespace": fleet.namespace, "fleet": fleet.name,
                                  "instances": [{**b.as_status(), "switched": b.switched} for b in bound],
                                  "expiresAt": record.expires if record else None,
                                  "latencyMs": round((time.monotonic() - t0) * 1000, 3)}, status=201)

    @routes.post("/v1/namespaces/{ns}/envfleets/{fleet}/prepare")
    async def prepare(request: web.Request) -> web.Response:
        """binding: late - ``{"environments": {"<env>": n, ...}, "wait": false}``: make ``n``
        instances of each ready ahead of their claims (a GRPO step's next groups). Answers at
        once (202) unless ``wait`` is true (200, with what was made and what failed)."""
        fleet = fleet_of(request)
        try:
            body: dict[str, Any] = await request.json() if request.can_read_body else {}
            wants = body.get("environments")
            if not isinstance(wants, dict) or not wants or len(wants) > ENVIRONMENT_NAMES:
                raise ValueError(f"environments must map 1-{ENVIRONMENT_NAMES} environment names to counts")
            for env, n in wants.items():
                if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_REPLICAS:
                    raise ValueError(f"the count of {env!r} must be an integer from 0 to {MAX_REPLICAS}")
            wait = body.get("wait", False)
            if not isinstance(wait, bool):
                raise ValueError("wait must be true or false")
        except (ValueError, TypeError, AttributeError) as exc:
            return _error(400, f"bad request: {exc}")
        try:
            done = await ctx.allocator.prepare(fleet, wants, background=not wait)
        except ClaimError as exc:
            return _error(400, str(exc))
        except NotActive as exc:
            return _error(503, str(exc))
        return web.json_response({"namespace": fleet.namespace, "fleet": fleet.name, **done},
                                 status=200 if wait else 202)

    @routes.get("/v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}")
    async def get_claim(request: web.Request) -> web.Response:
        fleet = fleet_of(request)
        denied = not_yours(request, fleet, request.match_info["id"])
        if denied is not None:
            return denied
        shown = describe(fleet, request.match_info["id"])
        return web.json_response(shown) if shown else _error(404, "no such claim")

    @routes.post("/v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}/renew")
    async def renew(request: web.Request) -> web.Response:
        fleet = fleet_of(request)
        claim_id = request.match_info["id"]
        if not claim_id.startswith("api_"):
            return _error(400, "only allocation-API claims (api_...) expire")
        try:
            body: dict[str, Any] = await request.json() if request.can_read_body else {}
            ttl = ttl_of(body)
        except (ValueError, TypeError, AttributeError) as exc:
            return _error(400, f"bad request: {exc}")
        if claim_id not in fleet.claims or claim_id in fleet.releasing:
            return _error(404, "no such claim")
        denied = not_yours(request, fleet, claim_id)
        if denied is not None:
            return denied
        try:
            expires = await ctx.allocator.renew(fleet, claim_id, ttl)
        except ClaimError as exc:
            return _error(404, str(exc))
        return web.json_response({"id": claim_id, "expiresAt": expires})

    @routes.delete("/v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}")
    async def release(request: web.Request) -> web.Response:
        fleet = fleet_of(request)
        claim_id = request.match_info["id"]
        if not claim_id.startswith("api_"):
            return _error(400, "only allocation-API claims (api_...) are released here; delete the EnvClaim")
        if claim_id not in fleet.claims or claim_id in fleet.releasing:
            return _error(404, "no such claim (released already, or expired)")
        denied = not_yours(request, fleet, claim_id)
        if denied is not None:
            return denied
        try:
            returned, replaced = await ctx.allocator.release(fleet, claim_id, durable=False)
        except NotActive as exc:
            return _error(503, str(exc))
        return web.json_response({"id": claim_id, "returned": returned, "replaced": replaced})

    @routes.delete("/v1/namespaces/{ns}/envfleets/{fleet}/claims")
    async def release_holder(request: web.Request) -> web.Response:
        fleet = fleet_of(request)
        try:
            holder = holder_of(request.query.get("holder"))
        except ValueError as exc:
            return _error(400, f"bad request: {exc}")
        if holder is None:
            return _error(400, "bad request: ?holder= is required (to release one claim: .../claims/{id})")
        if not fleet.active or fleet.ledger is None:
            # the claims are not read from the fleet's ledger yet: "none held" would be a guess
            return _error(503, "the fleet's claims are not loaded yet (operator starting, or a standby); retry")
        me = caller(request)
        ids = [cid for cid, rec in fleet.claims.items()  # with auth on, only the caller's own
               if cid.startswith("api_") and rec.holder == holder and cid not in fleet.releasing
               and (me is None or rec.owner in (None, me))]
        # Concurrently (a trainer of a 4,096-instance fleet can hold thousands of claims): one at
        # a time, each release's ledger write went alone; together they share group commits.
        limit = asyncio.Semaphore(HOLDER_RELEASE_CONCURRENCY)

        async def release(claim_id: str) -> tuple[int, int]:
            async with limit:
                return await ctx.allocator.release(fleet, claim_id)
        try:
            results = await asyncio.gather(*(release(claim_id) for claim_id in ids))
        except NotActive as exc:
            return _error(503, str(exc))
        return web.json_response({"holder": holder, "released": ids, "returned": sum(r for r, _ in results),
                                  "replaced": sum(p for _, p in results)})

    add_campaign_routes(routes, ctx, fleets)  # GET .../campaigns, POST .../campaigns/{name}/progress (campaigns.py)
    cfg = ctx.config
    app = web.Application(middlewares=[unavailable_closes, hostguard.guard(cfg.api_allowed_hosts, cfg.api_allowed_origins,
                                                                           cfg.cluster_domains), authn.middleware(auth)])
    app.add_routes(routes)
    return app


def build_metrics(ctx: Context) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(ctx.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port a site listens on (tests bind port 0)."""
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
    raise RuntimeError("not listening")
