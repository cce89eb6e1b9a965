"""A database server's address, resolved once per process instead of at every connection.

psycopg resolves a DSN's host (``socket.getaddrinfo``) at every connect. In a pod, a shard's
name such as ``awm-postgres-0.<namespace>.svc`` has fewer dots than resolv.conf's ``ndots:5``, so
every lookup first walks the pod's search domains: several queries to the cluster DNS, on the
claim path of every switch to a new environment (an instance's first connection to its new
database). A Service's address does not change while the Service exists.

:func:`pinned` returns the DSN with the address in ``hostaddr`` (libpq connects there and keeps
``host`` for TLS and the password file); :func:`forget` drops it after a failed connection, so a
server that moved costs one failed attempt, and an address is looked up again after ``TTL_S``
anyway (a DNS name that follows a failover).
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time

from psycopg.conninfo import conninfo_to_dict, make_conninfo

TTL_S = 300.0

_lock = threading.Lock()
_addresses: dict[tuple[str, str], tuple[str, float]] = {}  # (host, port) -> (address, resolved at)


def _target(dsn: str) -> tuple[dict[str, str], tuple[str, str]] | None:
    """The DSN's parameters and its one (host, port) to resolve; None where there is nothing to
    resolve (a socket directory, an address, ``hostaddr`` given, several hosts)."""
    params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    host = params.get("host", "")
    if not host or "hostaddr" in params or host.startswith("/") or host[1:2] == ":" or "," in host:
        return None
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    port = params.get("port", "5432")
    return (params, (host, port)) if "," not in port else None


def pinned(dsn: str) -> str:
    """``dsn`` with its host's address as ``hostaddr`` (looked up once per ``TTL_S``)."""
    target = _target(dsn)
    if target is None:
        return dsn
    params, key = target
    with _lock:
        known = _addresses.get(key)
    if known is None or time.monotonic() - known[1] > TTL_S:
        info = socket.getaddrinfo(key[0], key[1], proto=socket.IPPROTO_TCP, type=socket.SOCK_STREAM)
        known = (str(info[0][4][0]), time.monotonic())
        with _lock:
            _addresses[key] = known
    return make_conninfo(**{**params, "hostaddr": known[0]})


def forget(dsn: str) -> None:
    """Look ``dsn``'s host up again at its next connection (this one failed)."""
    target = _target(dsn)
    if target is not None:
        with _lock:
            _addresses.pop(target[1], None)
