"""DNS-rebinding protection for the operator's allocation and progress API (port 8080).

A web page whose DNS name an attacker re-points at the operator's address could otherwise drive
the API from a browser inside the cluster's network (claim every instance, read their endpoints).
Such a request always carries the attacker's DNS name in ``Host``, and a browser adds ``Origin``
to every cross-origin or state-changing request. So:

- ``Host`` must be an IP literal (pod and Service IPs), a single-label name (resolved only through
  the cluster's search domains), a name under ``.svc`` or ``.svc.<cluster domain>``, or a name in
  ``AWM_API_ALLOWED_HOSTS``; otherwise 421 Misdirected Request.
- ``Origin``, when present, must be in ``AWM_API_ALLOWED_ORIGINS``; otherwise 403. Trainers and
  ``kubectl``-side tools send no ``Origin`` and are unaffected.

Health probes (``/healthz``, ``/readyz``) are exempt: kubelets address them by pod IP anyway.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
EXEMPT = ("/healthz", "/readyz")


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8080
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str, cluster_domains: Iterable[str], extra: Iterable[str]) -> bool:
    name = _hostname(host)
    if not name:
        return False
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if name in {h.lower() for h in extra} or "." not in name:
        return True
    return name.endswith(".svc") or any(name.endswith(f".svc.{d.strip('.').lower()}") for d in cluster_domains)


def guard(allowed_hosts: Iterable[str], allowed_origins: Iterable[str],
          cluster_domains: Iterable[str] = ("cluster.local",)) -> Callable[..., Awaitable[web.StreamResponse]]:
    hosts, origins, domains = list(allowed_hosts), set(allowed_origins), list(cluster_domains)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in EXEMPT:
            if not host_allowed(request.headers.get("Host", ""), domains, hosts):
                return web.json_response({"error": "Host not allowed (DNS-rebinding protection)"}, status=421)
            origin = request.headers.get("Origin")
            if origin is not None and origin not in origins:
                return web.json_response({"error": "Origin not allowed"}, status=403)
        return await handler(request)

    return middleware
