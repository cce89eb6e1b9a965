"""The operator's HTTP side: health, the allocation API (port 8080) and metrics (port 9090).

The allocation API is the fast path for trainers: one HTTP round trip binds instances straight
from the operator's in-memory pool (the EnvClaim resource costs a create, a watch event, a status
patch and a watch event back). Both paths share the allocator and the fleet's ledger, so they
never hand out the same instance. Claims made here have ids ``api_<hex>`` (an underscore never
occurs in an EnvClaim's name) and a TTL: one not released nor renewed in time is released by
the operator, so a crashed trainer does not hold instances forever.

Requests and answers are the models of :mod:`awm.claims` (named after each route below); every
refusal is a ``ClaimRefusal`` ``{"error", "outcome"}``.

    POST   /v1/namespaces/{ns}/envfleets/{fleet}/claims    ClaimRequest -> 201 Claim
        A late-binding fleet's instances are switched to the claim's environment before the answer;
        with "switch": "client" the answer comes at once and an instance with "switched": false
        must be switched by the client (POST <controlUrl>/bind, or /reset with "env") before use.
        400 Refused (bad request, unknown environment), 404 unknown fleet, 409 UnAllocated (not
        enough ready instances within waitSeconds) or Contention (the id is being bound), 503
        Standby (this replica does not act on the fleet: kopf peering)
    GET    /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}              -> Claim, lost instances flagged
    POST   /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}/renew        RenewRequest -> Renewal
    DELETE /v1/namespaces/{ns}/envfleets/{fleet}/claims/{id}              -> Release (once the instances
        are reset; the ledger is written after it), 404 unknown
    DELETE /v1/namespaces/{ns}/envfleets/{fleet}/claims?holder=H          -> HolderRelease: every claim
        of that holder (a retried trainer pod frees what its dead predecessor held, instead of
        waiting out the TTL)
    POST   /v1/namespaces/{ns}/envfleets/{fleet}/prepare                  PrepareRequest -> Preparation

Every /v1/ request is authenticated and authorised against Kubernetes RBAC (awm_operator/auth.py:
a bearer ServiceAccount token; 401 without a valid one, 403 when RBAC says no or the claim is
another identity's), unless the operator runs with AWM_API_AUTH=off.
    GET    /v1/namespaces/{ns}/envfleets/{fleet}              -> sizes, demand, whether this replica acts
    GET    /v1/namespaces/{ns}/envfleets/{fleet}/instances    -> FleetInstances: every instance
        (environment, state, claim, holder, problem) and every claim (holder, size, age, time left)
    GET    /v1/namespaces/{ns}/envfleets                      -> every fleet with its counts and Ready
        condition (what `awm ui --namespace NS` shows)
    GET    /v1/namespaces/{ns}/campaigns                      -> every campaign with its status, progress
        and its fleet's counts (campaigns.py; what `awm ui --namespace NS` shows)
    GET    /healthz (process alive), /readyz (this replica acts on its fleets)
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from awm.claims import (MAX_ENVIRONMENTS, MAX_WAIT_S, OUTCOME_STATUS, BadRequest, Claim, ClaimOutcome, ClaimRefusal,
                        ClaimRequest, FleetInstance, FleetInstances, HeldClaim, HolderRelease, Preparation,
                        PrepareRequest, Release, Renewal, RenewRequest, Wire)
from awm_operator import auth as authn
from awm_operator import hostguard
from awm_operator.allocator import ClaimError, Refused, describe
from awm_operator.campaigns import add_campaign_routes
from awm_operator.crds import GROUP, VERSION, EnvFleetStatus, binding_of
from awm_operator.kube import ApiError
from awm_operator.phases import ConditionType
from awm_operator.reconcile import Context
from awm_operator.state import Fleet, Fleets

HOLDER_RELEASE_CONCURRENCY = 64  # releases of one DELETE ?holder= in flight (resets, ledger writes)
W = TypeVar("W", bound=Wire)


class Refusal(Exception):
    """An answer other than the route's own: its status, message and (for a claim) outcome."""

    def __init__(self, status: int, message: str, outcome: ClaimOutcome | None = None) -> None:
        super().__init__(message)
        self.status, self.outcome = status, outcome

    @classmethod
    def of(cls, exc: Refused) -> "Refusal":
        """The allocator's refusal in the API's words: its outcome decides the status."""
        return cls(OUTCOME_STATUS[exc.outcome], str(exc), exc.outcome)

    def response(self) -> web.Response:
        return answer(ClaimRefusal(error=str(self), outcome=self.outcome), self.status)


def answer(model: Wire, status: int = 200) -> web.Response:
    return web.json_response(model.wire(), status=status)


async def body_of(request: web.Request, model: type[W]) -> W:
    """The request's body as ``model`` (an empty body: the model's defaults); 400 with the
    model's words for what is wrong."""
    try:
        data = await request.json() if request.can_read_body else None
        return model.read(data)
    except (ValueError, BadRequest) as exc:  # not JSON, or not the model
        raise Refusal(400, f"bad request: {exc}", ClaimOutcome.REFUSED if model is ClaimRequest else None) from None


def fleet_summary(obj: dict[str, Any], fleets: Fleets) -> dict[str, Any]:
    """One EnvFleet as ``GET .../envfleets`` lists it."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, EnvFleetStatus.read(obj.get("status"))
    replicas, ready, allocated = status.replicas, status.ready, status.allocated
    names = list(status.environments or spec.get("environments") or [])
    binding = binding_of(spec.get("binding"), (spec.get("catalog") or {}).get("url"))
    row: dict[str, Any] = {
        "namespace": meta["namespace"], "fleet": meta["name"], "binding": binding,
        "environments": len(names), "environmentNames": names[:MAX_ENVIRONMENTS],
        "replicas": replicas, "ready": ready, "allocated": allocated,
        "starting": max(0, replicas - ready - allocated), "demand": None, "live": False,
        "condition": next(({"status": c.status, "reason": c.reason, "message": c.message}
                           for c in status.conditions if c.type == ConditionType.READY), None)}
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


@web.middleware
async def refusals(request: web.Request, handler: Any) -> web.StreamResponse:
    """A route raises :class:`Refusal` (or the allocator a :class:`Refused`); the client gets
    its status and a :class:`ClaimRefusal` body."""
    try:
        return await handler(request)
    except Refusal as exc:
        return exc.response()
    except Refused as exc:
        return Refusal.of(exc).response()


class AllocationApi:
    """The routes of ``/v1/namespaces/{ns}/envfleets/{fleet}/...``: each reads its request into
    a model of :mod:`awm.claims`, asks the allocator, and answers with a model."""

    def __init__(self, ctx: Context, fleets: Fleets) -> None:
        self.ctx, self.fleets = ctx, fleets

    # ---- what every route needs
    def fleet(self, request: web.Request) -> Fleet:
        fleet = self.fleets.get(request.match_info["ns"], request.match_info["fleet"])
        if fleet is not None and fleet.spec is None and not fleet.active and fleet.pods and not fleet.deleted:
            # its pods are watched but its spec is not: kopf pauses a standby replica's handlers
            raise Refusal(503, "this operator replica is a standby", ClaimOutcome.STANDBY)
        if fleet is None or fleet.spec is None or fleet.deleted:
            raise Refusal(404, "no such fleet")
        return fleet

    @staticmethod
    def caller(request: web.Request) -> str | None:
        who = authn.identity(request)
        return who.user if who else None

    def check_owner(self, request: web.Request, fleet: Fleet, claim_id: str) -> None:
        """403 when the API authenticates and the claim was made by another identity."""
        record = fleet.claims.get(claim_id)
        me = self.caller(request)
        if record is not None and me is not None and record.owner is not None and record.owner != me:
            raise Refusal(403, f"claim {claim_id} belongs to {record.owner}, not to {me}")

    def ttl(self, asked: float | None) -> float:
        ttl = asked or self.ctx.config.claim_ttl_default
        if not 0 < ttl <= self.ctx.config.claim_ttl_max:
            raise Refusal(400, f"bad request: ttlSeconds must be in (0, {self.ctx.config.claim_ttl_max:g}]")
        return ttl

    @staticmethod
    def api_claim(fleet: Fleet, claim_id: str, doing: str) -> None:
        """404/400 unless ``claim_id`` is a live allocation-API claim of the fleet."""
        if not claim_id.startswith("api_"):
            raise Refusal(400, f"only allocation-API claims (api_...) {doing}")
        if claim_id not in fleet.claims or claim_id in fleet.releasing:
            raise Refusal(404, "no such claim (released already, or expired)")

    # ---- the routes
    async def claim(self, request: web.Request) -> web.Response:
        t0 = time.monotonic()
        fleet = self.fleet(request)
        req = await body_of(request, ClaimRequest)
        ttl = self.ttl(req.ttl_seconds)
        wait = self.ctx.config.claim_wait_default if req.wait_seconds is None else req.wait_seconds
        claim_id = req.id or f"api_{secrets.token_hex(8)}"
        self.check_owner(request, fleet, claim_id)  # asked again after a lost answer: the maker's only
        bound = await self.ctx.allocator.claim(fleet, claim_id, req, min(wait, MAX_WAIT_S), source="api", ttl=ttl,
                                               holder=req.holder or None, owner=self.caller(request))
        record = fleet.claims.get(claim_id)
        return answer(Claim(id=claim_id, namespace=fleet.namespace, fleet=fleet.name,
                            instances=[b.instance() for b in bound], expires_at=record.expires if record else None,
                            holder=req.holder or None, owner=self.caller(request),
                            latency_ms=round((time.monotonic() - t0) * 1000, 3)), 201)

    async def get_claim(self, request: web.Request) -> web.Response:
        fleet = self.fleet(request)
        self.check_owner(request, fleet, request.match_info["id"])
        shown = describe(fleet, request.match_info["id"])
        if shown is None:
            raise Refusal(404, "no such claim")
        return answer(shown)

    async def renew(self, request: web.Request) -> web.Response:
        fleet, claim_id = self.fleet(request), request.match_info["id"]
        if not claim_id.startswith("api_"):
            raise Refusal(400, "only allocation-API claims (api_...) expire")
        ttl = self.ttl((await body_of(request, RenewRequest)).ttl_seconds)
        self.api_claim(fleet, claim_id, "expire")
        self.check_owner(request, fleet, claim_id)
        try:
            expires = await self.ctx.allocator.renew(fleet, claim_id, ttl)
        except ClaimError as exc:
            raise Refusal(404, str(exc)) from None
        return answer(Renewal(id=claim_id, expires_at=expires))

    async def release(self, request: web.Request) -> web.Response:
        fleet, claim_id = self.fleet(request), request.match_info["id"]
        self.api_claim(fleet, claim_id, "are released here; delete the EnvClaim")
        self.check_owner(request, fleet, claim_id)
        returned, replaced = await self.ctx.allocator.release(fleet, claim_id, durable=False)
        return answer(Release(id=claim_id, returned=returned, replaced=replaced))

    async def release_holder(self, request: web.Request) -> web.Response:
        fleet = self.fleet(request)
        holder = request.query.get("holder") or ""
        if not holder or len(holder) > 253:
            raise Refusal(400, "bad request: ?holder= is required, at most 253 characters "
                               "(to release one claim: .../claims/{id})")
        if not fleet.active or fleet.ledger is None:
            # the claims are not read from the fleet's ledger yet: "none held" would be a guess
            raise Refusal(503, "the fleet's claims are not loaded yet (operator starting, or a standby); retry",
                          ClaimOutcome.STANDBY)
        me = self.caller(request)
        ids = [cid for cid, rec in fleet.claims.items()  # with auth on, only the caller's own
               if cid.startswith("api_") and rec.holder == holder and cid not in fleet.releasing
               and (me is None or rec.owner in (None, me))]
        # Concurrently (a trainer of a 4,096-instance fleet can hold thousands of claims): one at
        # a time, each release's ledger write went alone; together they share group commits.
        limit = asyncio.Semaphore(HOLDER_RELEASE_CONCURRENCY)

        async def one(claim_id: str) -> tuple[int, int]:
            async with limit:
                return await self.ctx.allocator.release(fleet, claim_id)
        results = await asyncio.gather(*(one(claim_id) for claim_id in ids))
        return answer(HolderRelease(holder=holder, released=ids, returned=sum(r for r, _ in results),
                                    replaced=sum(p for _, p in results)))

    async def prepare(self, request: web.Request) -> web.Response:
        """binding: late - make instances of environments ready ahead of their claims (a GRPO
        step's next groups). Answers at once (202) unless ``wait`` is true (200, with what was
        made and what failed)."""
        fleet = self.fleet(request)
        req = await body_of(request, PrepareRequest)
        done = await self.ctx.allocator.prepare(fleet, req.environments, background=not req.wait)
        return answer(Preparation(namespace=fleet.namespace, fleet=fleet.name, **done), 200 if req.wait else 202)

    async def show(self, request: web.Request) -> web.Response:
        fleet = self.fleet(request)
        return web.json_response({"namespace": fleet.namespace, "fleet": fleet.name, "active": fleet.active,
                                  **fleet.counts().as_dict(), "demand": fleet.demand()})

    async def instances(self, request: web.Request) -> web.Response:
        """Every instance with its state and who holds it, and the claims: what a person looking at
        the fleet (awm ui's fleet page) wants beyond the counts. Read-only, like ``show``."""
        fleet = self.fleet(request)
        now = time.time()
        rows = []
        for pod in sorted(fleet.pods.values(), key=lambda p: (p.env, p.name)):
            claim = fleet.owner.get(pod.name)
            record = fleet.claims.get(claim) if claim else None
            state = ("deleting" if pod.deleting else "failed" if pod.failed else "allocated" if claim
                     else "ready" if pod.allocatable else "starting")
            rows.append(FleetInstance(pod=pod.name, environment=pod.env, state=state, phase=pod.phase, claim=claim,
                                      holder=record.holder if record else None, problem=pod.problem,
                                      mcp_url=pod.mcp_url, control_url=pod.control_url))
        claims = [HeldClaim(id=cid, holder=rec.holder, owner=rec.owner, instances=len(rec.pods), groups=len(rec.groups),
                            age_seconds=round(now - rec.created, 1),
                            expires_in_seconds=None if rec.expires is None else round(rec.expires - now, 1))
                  for cid, rec in sorted(fleet.claims.items())]
        return answer(FleetInstances(namespace=fleet.namespace, fleet=fleet.name, instances=rows, claims=claims))

    async def listing(self, request: web.Request) -> web.Response:
        """Every EnvFleet of the namespace (read from the API server, so a standby replica
        answers too), with this replica's live counts where it acts on the fleet, else the
        counts of the fleet's status; and its Ready condition (why it is not ready)."""
        namespace = request.match_info["ns"]
        try:
            listed = await self.ctx.kube.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/envfleets")
        except (ApiError, OSError, asyncio.TimeoutError) as exc:
            raise Refusal(502, f"cannot list fleets: {exc}") from None
        return web.json_response({"namespace": namespace, "fleets": [
            fleet_summary(obj, self.fleets) for obj in sorted(listed.get("items") or [], key=lambda o: o["metadata"]["name"])]})

    def routes(self) -> list[web.RouteDef]:
        fleet = "/v1/namespaces/{ns}/envfleets/{fleet}"
        return [web.get("/v1/namespaces/{ns}/envfleets", self.listing),
                web.get(fleet, self.show),
                web.get(f"{fleet}/instances", self.instances),
                web.post(f"{fleet}/claims", self.claim),
                web.delete(f"{fleet}/claims", self.release_holder),
                web.post(f"{fleet}/prepare", self.prepare),
                web.get(f"{fleet}/claims/{{id}}", self.get_claim),
                web.post(f"{fleet}/claims/{{id}}/renew", self.renew),
                web.delete(f"{fleet}/claims/{{id}}", self.release)]


def build_api(ctx: Context, fleets: Fleets, auth: authn.Authenticator | None = None) -> web.Application:
    """``auth``: who may call (:mod:`awm_operator.auth`); None leaves the API open (AWM_API_AUTH=off)."""
    routes = web.RouteTableDef()

    @routes.get("/healthz")
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    @routes.get("/readyz")
    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if fleets.acting() else web.Response(status=503, text="standby")

    add_campaign_routes(routes, ctx, fleets)  # GET .../campaigns, POST .../campaigns/{name}/progress (campaigns.py)
    cfg = ctx.config
    app = web.Application(middlewares=[unavailable_closes, hostguard.guard(cfg.api_allowed_hosts, cfg.api_allowed_origins,
                                                                           cfg.cluster_domains), authn.middleware(auth),
                                       refusals])
    app.add_routes(routes)
    app.add_routes(AllocationApi(ctx, fleets).routes())
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
