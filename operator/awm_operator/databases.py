"""A fleet's instance databases on its Postgres shards (admin DSNs from the fleet's Secret).

Pods create their own databases (init container ``provision``, or the ``provisioner`` sidecar of
a late-binding pod) and record pod, fleet and namespace in the database comment; the operator
only chooses the shard a pod's databases go to, watches the shards, and drops databases: those of
deleted pods (a periodic sweep) and all of a deleted fleet (its finalizer).

Why shards: every open episode holds a backend (~8 MB) and a connection slot on the server its
instance database lives on, so one Postgres for 1,024 concurrent episodes is one server with
more than a thousand backends, and a single point of failure. A fleet's Secret names its shards
by key: ``dsn`` (the shard named ``default``: one server, as before shards existed) and any
number of ``dsn-<name>`` (shard ``<name>``). A pod is placed on a shard when it is created (label
``awm.dev/db-shard``; its provisioning reads that shard's key) and stays there: an instance
database never moves, a pod on a lost shard is replaced by one on another shard.

Placement: the shard with the most free connection slots, as last probed (``max_connections``
less the backends open, less what this fleet's pods placed there and not yet Ready will open).
A GRPO group is spread over shards, not kept together: its members are whatever free pods the
claim takes, and pods are spread by free slots, so a shard's loss costs each group a few
members (masked episodes) instead of whole groups, and a group's 16 identical workloads do not
queue on one server's CPU.

Blocking psycopg calls: callers run these in a thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psycopg

from awm.postgres import provision
from awm.postgres import spares as spares_of

DEFAULT_SHARD = "default"
_KEY = re.compile(r"^dsn(?:-([a-z0-9]([a-z0-9-]{0,28}[a-z0-9])?))?$")
# Connection slots one instance holds: the env server's one, and a late-binding pod's provisioner
# (one admin connection kept for taking spares; others for a moment while it makes a database).
# Pinned pods hold one once provisioned; counting two for both keeps the estimate on the safe side.
SLOTS_PER_INSTANCE = 2
PROBE_TIMEOUT_S = 3


def shard_keys(keys: Iterable[str]) -> dict[str, str]:
    """Shard name -> Secret key, for the keys of a fleet's database Secret that name shards."""
    out: dict[str, str] = {}
    for key in keys:
        match = _KEY.match(key)
        if match:
            out[match.group(1) or DEFAULT_SHARD] = key
    return dict(sorted(out.items()))


@dataclass
class Shard:
    """One Postgres server of a fleet, as last probed."""

    name: str
    key: str                               # its key in the fleet's Secret
    dsn: str
    up: bool | None = None                 # None: never probed yet
    down_since: float | None = None        # monotonic time of the first failed probe in a row
    lost: bool = False                     # down for longer than the fleet tolerates
    max_connections: int = 0
    connections: int = 0                   # backends open, as last probed
    error: str = ""

    def free_slots(self, starting: int) -> int:
        """Connection slots left for new instances, with ``starting`` pods placed here that have
        not connected yet."""
        return self.max_connections - self.connections - SLOTS_PER_INSTANCE * starting

    def observe(self, result: tuple[int, int] | Exception, now: float, lost_after: float) -> bool:
        """Record a probe's result (``(max_connections, connections)`` or the error); True if
        up, down or lost changed."""
        before = (self.up, self.lost)
        if isinstance(result, Exception):
            self.up, self.error = False, f"{type(result).__name__}: {result}".strip()[:300]
            if self.down_since is None:
                self.down_since = now
            self.lost = now - self.down_since >= lost_after
        else:
            self.max_connections, self.connections = result
            self.up, self.down_since, self.lost, self.error = True, None, False, ""
        return before != (self.up, self.lost)


def probe(dsn: str) -> tuple[int, int]:
    """``(max_connections, backends open)`` of the server behind ``dsn``; raises if it does not
    answer within a few seconds."""
    with psycopg.connect(dsn, connect_timeout=PROBE_TIMEOUT_S, autocommit=True,
                         options=f"-c statement_timeout={PROBE_TIMEOUT_S * 1000}") as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int - "
                           "current_setting('superuser_reserved_connections')::int, "
                           "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
                           ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def choose_shard(shards: Iterable[Shard], starting: Mapping[str, int]) -> Shard | None:
    """The shard for a new pod: the up shard with the most free slots (ties by name), if it has
    room for one more instance; None when no shard does."""
    best: Shard | None = None
    for shard in sorted(shards, key=lambda s: s.name):
        if shard.up and not shard.lost:
            if best is None or shard.free_slots(starting.get(shard.name, 0)) > \
                    best.free_slots(starting.get(best.name, 0)):
                best = shard
    if best is None or best.free_slots(starting.get(best.name, 0)) < SLOTS_PER_INSTANCE:
        return None
    return best


def fleet_databases(admin_dsn: str, namespace: str, fleet: str, spares: bool = True) -> dict[str, str]:
    """Database name -> pod name, for every instance database of this fleet on one shard (with its
    spares, the databases its pods' provisioners made ahead for any of them, whose pod is ``""``,
    unless ``spares`` is False)."""
    own = spares_of.pool_prefixes(spares_of.fleet_pool(namespace, fleet))
    return {db: str(meta.get("pod", "")) for db, meta in provision.instances_with_meta(admin_dsn).items()
            if (meta.get("fleet") == fleet and meta.get("namespace") == namespace and (spares or not meta.get("spare")))
            or (spares and db.startswith(own))}


def drop(admin_dsn: str, names: list[str]) -> None:
    for name in names:
        provision.drop_instance(admin_dsn, name)


def drop_orphans(admin_dsn: str, namespace: str, fleet: str, live_pods: set[str]) -> list[str]:
    """Drop the databases on one shard whose pod no longer exists; return their names. Spares
    belong to the fleet, not to a pod: they go with the fleet (its finalizer)."""
    gone = [db for db, pod in fleet_databases(admin_dsn, namespace, fleet, spares=False).items()
            if pod not in live_pods]
    drop(admin_dsn, gone)
    return gone
