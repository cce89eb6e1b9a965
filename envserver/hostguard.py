"""DNS-rebinding protection for both listeners (the MCP endpoint and the control API).

The MCP specification requires a server to validate ``Origin`` (and, bound to a local address,
``Host``): a web page on ``evil.example.com`` whose name the attacker re-points at 127.0.0.1 would
otherwise drive a local env server from the victim's browser. We use FastMCP's own guard
(``HostOriginGuardMiddleware``, strict mode) on both apps, so there is one implementation:

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

import ipaddress
import os
import socket
from collections.abc import Iterable

from fastmcp.server.http import DEFAULT_HOSTS, HostOriginGuardMiddleware
from starlette.middleware import Middleware

HOSTS_ENV = "AWM_ALLOWED_HOSTS"
ORIGINS_ENV = "AWM_ALLOWED_ORIGINS"


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


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
    hosts += [*_split(os.environ.get(HOSTS_ENV)), *extra]
    return list(dict.fromkeys(h.lower() for h in hosts if h))


def allowed_origins(extra: Iterable[str] = ()) -> list[str]:
    """Browser origins trusted besides same-origin requests: ``extra`` plus ``AWM_ALLOWED_ORIGINS``."""
    return list(dict.fromkeys([*_split(os.environ.get(ORIGINS_ENV)), *extra]))


def guard(hosts: list[str], origins: list[str]) -> Middleware:
    """FastMCP's Host/Origin guard in strict mode (every request is checked, whatever the bind
    address), as Starlette middleware for an app that is not FastMCP's (the control API)."""
    return Middleware(HostOriginGuardMiddleware, allowed_hosts=hosts, allowed_origins=origins, mode="strict")
