"""Spare instance databases on one PostgreSQL server, shared by every provisioner of a pool (a fleet).

Why: a late-binding Kubernetes env pod has its own provisioner (a sidecar), and which pod a
claim lands on is decided at claim time, so a database one pod made ahead serves that pod only.
A switch to an environment the pod does not keep then clones on the claim path: 53-118 ms of a
loaded shard's disk on the real node, against ~20 ms for the rest of a switch. A spare is a clone
made off the claim path that *any* provisioner of the pool may take. Taking one renames it to the
taker's instance name and creates the instance's role, in one transaction: ~1 ms and a commit.

Names (under :data:`awm.postgres.provision.INSTANCE_PREFIX`, so the operator's sweeps and a
fleet's finalizer see them, and ``awm postgres gc`` locally)::

    awm_i_sp_<pool>_<template>_<made at>_<token>   a spare, ready to be taken
    awm_i_sm_<pool>_<template>_<made at>_<token>   a spare being made

A spare's comment is the pool's metadata without a pod, and ``"spare": true``: the operator's
sweep of deleted pods' databases leaves it, the fleet's finalizer drops it with the fleet. One
being made has its maker's comment (pod included), so the maker's death leaves nothing without
an owner; one whose maker died before writing the comment is dropped by the next maker of the
pool once it is older than :data:`STALE_MAKING_S` (the time is in its name), or with the fleet
(the operator finds a fleet's spares by the pool digest in their names too: :func:`pool_prefixes`).

Bounds: one spare per environment, made after each claim of it unless one is there or being
made (a try-lock per pool and template: the sixteen claims of a GRPO group make one, not
sixteen), and at most ``max_spares`` per pool on the server, the oldest dropped first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import secrets
import threading
import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awm.postgres import provision
from awm.postgres import snapshot as snap

log = logging.getLogger("awm.provisioner")

SPARE = provision.INSTANCE_PREFIX + "sp_"
MAKING = provision.INSTANCE_PREFIX + "sm_"
STALE_MAKING_S = 600.0  # a spare still being made after this long lost its maker
TAKE_CANDIDATES = 8  # spares tried before a claim clones instead (others may take them first)
PUBLISH_TRIES = 50  # the warm-up connection's backend may take a moment to leave


def _digest(text: str, n: int = 6) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def fleet_pool(namespace: str, fleet: str) -> str:
    """The pool of a Kubernetes fleet's spares (its pods' provisioners share them)."""
    return json.dumps([namespace, fleet])


def pool_prefixes(pool: str) -> tuple[str, str]:
    """The name prefixes of ``pool``'s spares and of those being made: the operator finds a
    fleet's by name too, so that one whose maker was killed before writing its comment still
    goes with the fleet."""
    digest = _digest(pool)
    return f"{SPARE}{digest}_", f"{MAKING}{digest}_"


def _verified(comment: str | None, template: provision.Template) -> bool:
    """Whether a spare's maker checksummed it as ``template``'s snapshot (its comment says so)."""
    try:
        return bool(template.checksum) and json.loads(comment or "{}").get("verified") == template.checksum
    except (ValueError, AttributeError):
        return False


def made_at(name: str) -> float:
    """When a spare (or one being made) was made, from its name (0 if the name has no time)."""
    try:
        return int(name.rsplit("_", 2)[-2], 16) / 1000
    except (IndexError, ValueError):
        return 0.0


class Spares:
    """The spares of one pool on one server, as seen by one provisioner.

    ``pool`` names who shares them (the fleet: its namespace and name); ``meta`` is the pool's
    metadata for the spares' comments (a ``pod`` in it is dropped: a spare belongs to no pod)."""

    def __init__(self, admin_dsn: str, pool: str, max_spares: int, meta: dict[str, Any] | None = None) -> None:
        self.admin_dsn = admin_dsn
        self.pool = _digest(pool)
        self._prefixes = pool_prefixes(pool)  # (spares, being made)
        self.max_spares = max_spares
        self.meta = {k: v for k, v in (meta or {}).items() if k != "pod"}
        self._lock = threading.Lock()  # the take connection: one statement sequence at a time
        self._conn: psycopg.Connection | None = None

    def prefix(self, template: provision.Template, making: bool = False) -> str:
        return f"{self._prefixes[making]}{_digest(template.dbname)}_"

    # -- taking (the claim path) ---------------------------------------------------------------

    def take(self, template: provision.Template, name: str, owner: dict[str, Any]) -> provision.Instance | None:
        """A spare of ``template`` made instance ``name`` (renamed, its role created, reachable by
        that role only, ``owner`` in its comment), or None if none could be taken. Never raises
        for a server problem: the caller clones instead, and that reports it."""
        with self._lock:
            try:
                return self._take(self._connection(), template, name, owner)
            except psycopg.Error as exc:
                log.warning("taking a spare of %s failed: %s: %s", template.env, type(exc).__name__, exc)
                self._close()
                return None

    def _take(self, conn: psycopg.Connection, template: provision.Template, name: str,
              owner: dict[str, Any]) -> provision.Instance | None:
        spares = conn.execute("SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database "
                              "WHERE starts_with(datname, %s)", (self.prefix(template),)).fetchall()
        random.shuffle(spares)  # the pods of a group claim together: not all after the same one
        comment = provision.instance_comment(template, owner)
        for spare, spare_comment in spares[:TAKE_CANDIDATES]:
            role, password = provision.instance_role_sql(conn, name, comment)
            try:
                # All or nothing (a spare, or an instance with its role), in one round trip. Its
                # commit need not wait for the disk: a server that crashes before the commit
                # reaches it comes back with the spare still a spare (and with nothing written
                # after it: the WAL reaches the disk in order), and the instance's connections,
                # all it loses, are gone with the crash anyway.
                provision.one_transaction(conn, [
                    sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(spare), sql.Identifier(name)),
                    *role, *provision.open_database_sql(name, name, comment)], synchronous=False)
            except (psycopg.errors.InvalidCatalogName, psycopg.errors.ObjectInUse):
                continue  # another provisioner took it (or is dropping it) first
            return provision.Instance(template.env, name, name, provision.instance_dsn(self.admin_dsn, name, password),
                                      verified=_verified(spare_comment, template))
        return None

    def _connection(self) -> psycopg.Connection:
        """One admin connection kept for takes (a connect costs the server ~4 ms): no retries,
        a claim clones instead of waiting for a server that does not answer."""
        if self._conn is None or self._conn.closed:
            params = {**provision.CONNECT_DEFAULTS, **conninfo_to_dict(self.admin_dsn)}
            self._conn = psycopg.connect(make_conninfo(**params), autocommit=True)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def close(self) -> None:
        with self._lock:
            self._close()

    # -- making (off the claim path) -----------------------------------------------------------

    def wanted(self, template: provision.Template) -> bool:
        """No spare of ``template`` is there or being made (a cheap look before connecting to make one)."""
        with self._lock:
            try:
                return self._count(self._connection(), template) == 0
            except psycopg.Error:
                self._close()
                return False

    def _count(self, conn: psycopg.Connection, template: provision.Template) -> int:
        row = conn.execute("SELECT count(*) FROM pg_database WHERE starts_with(datname, %s) OR starts_with(datname, %s)",
                           (self.prefix(template), self.prefix(template, making=True))).fetchone()
        return int(row[0]) if row else 0

    def make(self, conn: psycopg.Connection, template: provision.Template, owner: dict[str, Any],
             strategy: str | None) -> bool:
        """Make a spare of ``template`` on ``conn`` (an admin connection of the caller's) unless one
        is there or another provisioner is making one; True if this call made one."""
        key = int(_digest(f"{self.pool}:{template.dbname}", 15), 16)  # fits a bigint
        locked = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if not (locked and locked[0]):
            return False  # another provisioner of the pool is at it
        stamp = f"{int(time.time() * 1000):011x}_{secrets.token_hex(2)}"
        making = self.prefix(template, making=True) + stamp
        try:
            if self._count(conn, template):
                return False
            conn.execute(provision.clone_statement(template, making, strategy))
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        try:
            with conn.transaction():
                provision.open_database(conn, making, None, provision.instance_comment(template, owner))
            # A first connection builds the database's relation cache file (pg_internal.init), so
            # the taker's first connection skips that (~6 ms of a ~30 ms connect, measured). It
            # also checksums the copy against the snapshot: the taker's env server then skips
            # its own checksum (6-10 ms of a switch on the real node), and the reads leave the
            # spare's pages in the server's shared buffers for it.
            with provision._admin(self.admin_dsn, making) as warm:
                warm.execute("SELECT count(*) FROM pg_class").fetchone()
                verified = self._verify(warm, template, making)
            self._publish(conn, template, making, self.prefix(template) + stamp, verified)
        except BaseException:
            with contextlib.suppress(Exception):
                provision.drop_instance(self.admin_dsn, making)
            raise
        self.trim(conn)
        return True

    @staticmethod
    def _verify(warm: psycopg.Connection, template: provision.Template, making: str) -> str:
        """The checksum digest of a new spare, which must be its template's snapshot's (a copy
        that differs is an error: it is dropped, and the claim clones instead)."""
        expected = (snap.Facts.from_json(template.facts) if template.facts else snap.read_facts(warm)).expected
        got = snap.compute_checksum(warm)
        bad = got.mismatches(expected)
        if bad:
            raise RuntimeError(f"spare {making} of {template.env} differs from its snapshot: {bad[:5]}")
        return got.digest

    def _publish(self, conn: psycopg.Connection, template: provision.Template, making: str, spare: str,
                 verified: str = "") -> None:
        # "verified": the digest the maker checksummed; until a take renames it, only admin
        # roles may connect to a spare (provision.open_database with no role), so it still holds.
        comment = json.dumps({**self.meta, "spare": True, "env": template.env, "template": template.dbname,
                              **({"verified": verified} if verified else {})})
        for attempt in range(PUBLISH_TRIES):
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                        sql.Identifier(making), sql.Identifier(spare)))
                    conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                        sql.Identifier(spare), sql.Literal(comment)))
                return
            except psycopg.errors.ObjectInUse:  # the warm-up's backend has not left yet
                if attempt == PUBLISH_TRIES - 1:
                    raise
                time.sleep(0.01)

    def trim(self, conn: psycopg.Connection) -> list[str]:
        """Drop the pool's oldest spares beyond ``max_spares``, and spares whose maker died while
        making them; return what was dropped."""
        names = [r[0] for r in conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s) OR starts_with(datname, %s)",
            self._prefixes).fetchall()]
        spares = sorted((n for n in names if n.startswith(SPARE)), key=made_at)
        stale = [n for n in names if n.startswith(MAKING) and time.time() - made_at(n) > STALE_MAKING_S]
        drop = spares[:max(0, len(spares) - self.max_spares)] + stale
        for name in drop:
            provision._drop(conn, name)
        return drop
