"""DNS-rebinding protection for both listeners (the MCP endpoint and the control API).

The MCP specification requires a server to validate ``Origin`` (and, bound to a local address,
``Host``): a web page on ``evil.example.com`` whose name the attacker re-points at 127.0.0.1 would
otherwise drive a local env server from the victim's browser. One ASGI middleware guards both apps
(the rules of FastMCP's ``HostOriginGuardMiddleware`` in strict mode: every request is checked,
whatever the bind address):

- ``Host`` must be a loopback name, the address the request arrived on (a pod's IP when reached by
  pod IP, whatever the bind address), the bind address, this machine's hostname when bound to all
  interfaces, or an allowed host (``--allowed-host`` / ``AWM_ALLOWED_HOSTS``; ``*`` wildcards, no
  port). Otherwise: 421 Misdirected Request.
- ``Origin``, when a browser sends one, must be the request's own origin, a loopback origin on a
  loopback host, or an allowed origin (``--allowed-origin`` / ``AWM_ALLOWED_ORIGINS``). Otherwise:
  403. Clients that are not browsers send no ``Origin`` and are unaffected.

The operator passes the names a pod may be reached by (Service names) in ``AWM_ALLOWED_HOSTS``.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

from starlette.middleware import Middleware

from awm import settings

ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]
DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")

HOSTS_ENV = settings.names.AWM_ALLOWED_HOSTS
ORIGINS_ENV = settings.names.AWM_ALLOWED_ORIGINS


@functools.lru_cache(maxsize=64)  # asked for every request's local address
def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_unspecified
    except ValueError:
        return False


def allowed_hosts(bind_hosts: Iterable[str], extra: Iterable[str] = ()) -> list[str]:
    """The Host names a server bound to ``bind_hosts`` answers to, besides the address each
    request arrived on (which the guard adds by itself): loopback names, each specific bind
    address, the hostname when bound to all interfaces, and ``extra`` plus ``AWM_ALLOWED_HOSTS``."""
    hosts = list(DEFAULT_HOSTS)
    for bind in bind_hosts:
        if _unspecified(bind):
            hosts.append(socket.gethostname())  # no getfqdn(): a reverse DNS lookup can hang
        elif bind:
            hosts.append(bind.strip("[]"))
    hosts += [*settings.AWM_ALLOWED_HOSTS, *extra]
    return list(dict.fromkeys(h.lower() for h in hosts if h))


def allowed_origins(extra: Iterable[str] = ()) -> list[str]:
    """Browser origins trusted besides same-origin requests: ``extra`` plus ``AWM_ALLOWED_ORIGINS``."""
    return list(dict.fromkeys([*settings.AWM_ALLOWED_ORIGINS, *extra]))


class HostOriginGuard:
    """ASGI middleware: 421 for a ``Host`` that is not ours, 403 for a foreign browser ``Origin``."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str], allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.hosts = tuple(allowed_hosts)
        self.origins = tuple(allowed_origins)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            host, origin = "", None
            for key, value in scope.get("headers") or ():
                if key == b"host":
                    host = value.decode("latin-1")
                elif key == b"origin":
                    origin = value.decode("latin-1")
            server = scope.get("server")
            hosts = self.hosts + ((server[0],) if server and not _unspecified(server[0]) else ())
            if not host_matches(host, hosts):
                return await _refuse(send, 421, b"Misdirected Request")
            if origin and not self._origin_allowed(origin, host, scope.get("scheme", "http")):
                return await _refuse(send, 403, b"Forbidden Origin")
        await self.app(scope, receive, send)

    def _origin_allowed(self, origin: str, host: str, scheme: str) -> bool:
        wanted = normalize_origin(origin)
        if any(p == "*" or fnmatchcase(wanted, normalize_origin(p)) for p in self.origins):
            return True
        if _loopback(urlsplit(origin).hostname or "") and _loopback(host):
            return True
        return wanted == normalize_origin(f"{scheme}://{host}")


def guard(hosts: list[str], origins: list[str]) -> Middleware:
    """The guard as Starlette middleware (the control API, the web view)."""
    return Middleware(HostOriginGuard, allowed_hosts=hosts, allowed_origins=origins)


async def _refuse(send: Any, status: int, text: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(text)).encode())]})
    await send({"type": "http.response.body", "body": text})


def normalize_host(host: str) -> str:
    """Lower case, without port or IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end != -1 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_matches(host: str, allowed: Sequence[str]) -> bool:
    host = normalize_host(host)
    return any(normalize_host(p) == "*" or fnmatchcase(host, normalize_host(p)) for p in allowed)


def normalize_origin(origin: str) -> str:
    """``scheme://host:port`` with the default port spelled out; anything else lower-cased."""
    origin = origin.strip().rstrip("/")
    try:
        parsed = urlsplit(origin)
        port = parsed.port
    except ValueError:
        return origin.lower()
    if not parsed.scheme or not parsed.hostname or parsed.path or parsed.query or parsed.fragment:
        return origin.lower()
    scheme = parsed.scheme.lower()
    host = normalize_host(parsed.hostname)
    host = f"[{host}]" if ":" in host else host
    port = port if port is not None else {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" if port is None else f"{scheme}://{host}:{port}"


def _loopback(host: str) -> bool:
    host = normalize_host(host)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
