"""Who may use the operator's API: Kubernetes identities, checked by Kubernetes.

Every ``/v1/...`` request carries a bearer token: a ServiceAccount token (a trainer pod's
mounted one, a Campaign Job's, or one from ``kubectl create token``). The operator asks the API
server who it is (TokenReview) and whether that identity may act on the fleet's namespace
(SubjectAccessReview), so access is granted with ordinary RBAC - a Role allowing ``envclaims``
in the namespace - as Agones' allocator does with mutual TLS:

=========================================  =========================================
request                                     needs (in the fleet's namespace)
=========================================  =========================================
POST .../claims, renew, DELETE, prepare     ``create`` ``envclaims.awm.dev``
GET .../claims/{id}, GET the fleet          ``get`` ``envclaims.awm.dev``
POST /v1/namespaces/{ns}/campaigns/{name}   ``update`` ``campaigns.awm.dev/status``
/progress
GET /v1/namespaces/{ns}/campaigns           ``list`` ``campaigns.awm.dev``
GET /v1/namespaces/{ns}/envfleets           ``list`` ``envfleets.awm.dev``
=========================================  =========================================

A claim remembers who made it: only that identity renews, reads or releases it (403 for anyone
else), and ``?holder=`` releases only the caller's own claims. Reviews are cached briefly
(positive 60 s, negative 2 s) by the token's hash - never the token - so a trainer's claim
loop pays the API server once a minute, not once a claim. 401: no token, or one the API server
does not accept; 403: RBAC says no, or the claim is someone else's.
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from aiohttp import web

from awm_operator.crds import GROUP

POSITIVE_TTL = 60.0
NEGATIVE_TTL = 2.0  # a refusal is asked again soon: RBAC bindings are often made just before use


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""


@dataclass(frozen=True)
class Need:
    verb: str
    resource: str
    subresource: str = ""
    name: str = ""  # the object, for Roles that name theirs (a campaign trainer's own campaign)


IDENTITY_KEY = web.RequestKey("awm_identity", Identity)  # where the middleware leaves the caller

Review = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]  # (path, body) -> API response


@dataclass
class Authenticator:
    """TokenReview + SubjectAccessReview with a small TTL cache. ``review`` posts to the API server."""

    review: Review
    clock: Callable[[], float] = time.monotonic
    _tokens: dict[str, tuple[float, Identity | None]] = field(default_factory=dict)
    _access: dict[tuple[Any, ...], tuple[float, bool]] = field(default_factory=dict)
    calls: int = 0

    async def identify(self, token: str) -> Identity | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._tokens.get(key)
        if hit and hit[0] > self.clock():
            return hit[1]
        self.calls += 1
        status = (await self.review("/apis/authentication.k8s.io/v1/tokenreviews", {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})).get("status") or {}
        identity = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            identity = Identity(str(user.get("username", "")), tuple(user.get("groups") or ()), str(user.get("uid", "")))
        self._tokens[key] = (self.clock() + (POSITIVE_TTL if identity else NEGATIVE_TTL), identity)
        self._trim(self._tokens)
        return identity

    async def allowed(self, who: Identity, namespace: str, need: Need) -> bool:
        key = (who, namespace, need)
        hit = self._access.get(key)
        if hit and hit[0] > self.clock():
            return hit[1]
        self.calls += 1
        attributes = {"namespace": namespace, "verb": need.verb, "group": GROUP, "resource": need.resource}
        if need.subresource:
            attributes["subresource"] = need.subresource
        if need.name:
            attributes["name"] = need.name
        status = (await self.review("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": who.user, "groups": list(who.groups), "uid": who.uid,
                     "resourceAttributes": attributes}})).get("status") or {}
        ok = bool(status.get("allowed"))
        self._access[key] = (self.clock() + (POSITIVE_TTL if ok else NEGATIVE_TTL), ok)
        self._trim(self._access)
        return ok

    def _trim(self, cache: dict[Any, Any], limit: int = 10_000) -> None:
        if len(cache) > limit:
            now = self.clock()
            for key in [k for k, (until, _) in cache.items() if until <= now] or list(cache)[: len(cache) - limit]:
                cache.pop(key, None)


_FLEET = "/v1/namespaces/{ns}/envfleets/{fleet}"
# What each route of the API needs, by its template and method (never by a substring of the
# path: a namespace or fleet may be named "campaigns").
NEEDS: dict[tuple[str, str], Need] = {
    ("GET", "/v1/namespaces/{ns}/envfleets"): Need("list", "envfleets"),
    ("GET", _FLEET): Need("get", "envclaims"),
    ("GET", _FLEET + "/instances"): Need("get", "envclaims"),
    ("POST", _FLEET + "/claims"): Need("create", "envclaims"),
    ("POST", _FLEET + "/prepare"): Need("create", "envclaims"),
    ("DELETE", _FLEET + "/claims"): Need("create", "envclaims"),
    ("GET", _FLEET + "/claims/{id}"): Need("get", "envclaims"),
    ("POST", _FLEET + "/claims/{id}/renew"): Need("create", "envclaims"),
    ("DELETE", _FLEET + "/claims/{id}"): Need("create", "envclaims"),
    ("GET", "/v1/namespaces/{ns}/campaigns"): Need("list", "campaigns"),
    ("POST", "/v1/namespaces/{ns}/campaigns/{name}/progress"): Need("update", "campaigns", "status"),
}
# Names in a path must be Kubernetes names: they go into the API server's paths (an encoded "/"
# or "?" in a namespace must not reach one) and into access reviews.
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # a namespace (RFC 1123 label)
_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class NoRule(LookupError):
    """A /v1 route without an entry in NEEDS (a new route must say what it needs)."""


def bad_name(request: web.Request) -> str | None:
    """Why a path's names are not Kubernetes names (None: they are)."""
    ns = request.match_info.get("ns")
    if ns is not None and not _LABEL.match(ns):
        return f"namespace {ns[:80]!r} is not a Kubernetes namespace name"
    for key in ("fleet", "name"):
        value = request.match_info.get(key)
        if value is not None and not _SUBDOMAIN.match(value):
            return f"{key} {value[:80]!r} is not a Kubernetes object name"
    return None


def need_of(request: web.Request) -> Need | None:
    """What a request needs; None for routes outside the API (health). A /v1 path that matches
    no route needs what any reader needs (it gets its 404 once authenticated)."""
    if not request.path.startswith("/v1/"):
        return None
    resource = request.match_info.route.resource
    if resource is None:
        return Need("get", "envclaims")
    need = NEEDS.get(("GET" if request.method == "HEAD" else request.method, resource.canonical))
    if need is None:
        raise NoRule(f"{request.method} {resource.canonical}")
    if need.resource == "campaigns" and need.subresource:  # a campaign's own status: by its name
        return Need(need.verb, need.resource, need.subresource, request.match_info.get("name", ""))
    return need


def _deny(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status,
                             headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)


def middleware(auth: Authenticator | None) -> Any:
    """aiohttp middleware: authenticate and authorise ``/v1/`` requests (a no-op when ``auth`` is
    None: the API was configured open, e.g. on a developer's machine)."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1/"):
            why = bad_name(request)
            if why is not None:
                return _deny(400, why)
        try:
            need = need_of(request)
        except NoRule as exc:  # a route nobody gave a rule: refused rather than guessed
            return _deny(403, f"no access rule for {exc}")
        if auth is None or need is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer ") or not header[7:].strip():
            return _deny(401, "a bearer token is required (a ServiceAccount token; AWM_API_TOKEN for the client)")
        try:
            who = await auth.identify(header[7:].strip())
        except Exception as exc:  # noqa: BLE001 - the API server is unreachable: not the caller's fault
            return _deny(503, f"cannot review the token: {type(exc).__name__}")
        if who is None:
            return _deny(401, "the token was not accepted by the Kubernetes API server")
        namespace = request.match_info.get("ns") or request.path.split("/")[3]
        try:
            ok = await auth.allowed(who, namespace, need)
        except Exception as exc:  # noqa: BLE001
            return _deny(503, f"cannot review access: {type(exc).__name__}")
        if not ok:
            what = f"{need.verb} {need.resource}{'/' + need.subresource if need.subresource else ''}.{GROUP}"
            return _deny(403, f"{who.user} may not {what} in namespace {namespace}")
        request[IDENTITY_KEY] = who
        return await handler(request)

    return check


def identity(request: web.Request) -> Identity | None:
    """The caller, as the middleware found it (None when the API is open)."""
    return request.get(IDENTITY_KEY)
