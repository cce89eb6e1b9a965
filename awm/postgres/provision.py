"""Templates and instances: the privileged half of the database story.

* One **template database per environment snapshot**, named after the bundle's database hash,
  loaded once (DDL, seed rows, sequences moved past the seeded ids, snapshot copy, checksum) and
  then closed to connections. A changed seed gets a new template; an unchanged one is reused
  across runs. Its checksum is kept in the database comment, readable without connecting.
* One **database per instance**, cloned from the template, and one **login role per instance**
  that may connect to that database only. Table privileges come from two group roles granted
  inside the template (``awm_tool``: read/write the agent's tables; ``awm_reader``: read only,
  used by verifiers), so cloning copies them and an instance needs no per-table grants.

Only this module needs the admin DSN; env servers receive their instance DSN and nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterator

import psycopg
from psycopg import pq, sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from awm.bundle import EnvBundle
from awm.postgres import snapshot as snap

log = logging.getLogger("awm.provision")

TOOL_ROLE = "awm_tool"
READER_ROLE = "awm_reader"
TEMPLATE_PREFIX = "awm_tpl_"
INSTANCE_PREFIX = "awm_i_"


class ProvisionError(RuntimeError):
    """A snapshot that does not load, with the statement or row that failed."""


@dataclass(frozen=True)
class Template:
    dbname: str
    env: str
    checksum: str
    # snapshot.Facts.to_json() of its database (None for a template made before they were kept)
    facts: dict[str, Any] | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class Instance:
    env: str
    dbname: str
    role: str
    dsn: str
    # Checksummed against its template's snapshot by the provisioner that made it, and reachable by
    # no role but the admin's since (a spare: awm.postgres.spares), so its taker need not again.
    verified: bool = False


# Connecting is retried for a while: a server still starting, or out of connection slots while a
# thousand pods provision at once, is a moment to wait out, not a failed pod.
CONNECT_RETRY_S = 60.0


# Unless the DSN says otherwise: a server that does not answer is an error after 10 s, and a
# connection whose peer vanished (a node gone, a dropped route) is found dead by TCP keepalives
# within a minute instead of blocking its caller (an operator's sweep, an init container) for
# the kernel's hours.
CONNECT_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                    "keepalives_interval": "10", "keepalives_count": "3"}


def _admin(dsn: str, dbname: str | None = None, retry_s: float = CONNECT_RETRY_S) -> psycopg.Connection:
    params = {**CONNECT_DEFAULTS, **conninfo_to_dict(dsn)}
    if dbname:
        params["dbname"] = dbname
    dsn = make_conninfo(**params)
    for attempt in Retrying(retry=retry_if_exception(_transient), stop=stop_after_delay(retry_s),
                            wait=wait_exponential(multiplier=0.2, max=5.0), reraise=True):
        with attempt:
            return psycopg.connect(dsn, autocommit=True)
    raise AssertionError("unreachable")  # Retrying either returns or re-raises


def _transient(exc: BaseException) -> bool:
    """Worth another try: too many clients or connections (53300), the server starting up or shutting down
    (57P03), a refused or timed-out connection; not a wrong password or a missing database."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if exc.sqlstate in ("53300", "57P03"):
        return True
    text = str(exc).lower()
    return exc.sqlstate is None and any(w in text for w in (
        "too many clients", "too many connections", "connection refused", "starting up", "shutting down",
        "remaining connection slots", "timeout expired"))


def _slug(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())[:limit]


def template_name(bundle: EnvBundle) -> str:
    digest = hashlib.sha256(f"{bundle.database_hash()}:{HARDENING}".encode()).hexdigest()
    return f"{TEMPLATE_PREFIX}{_slug(bundle.name, 40)}_{digest[:12]}"


def ensure_group_roles(admin_dsn: str) -> None:
    with _admin(admin_dsn) as conn:
        # Fleets, synthesis workers and init containers start at once: one of them at a time.
        conn.execute("SELECT pg_advisory_lock(hashtext('awm_group_roles'))")
        for role in (TOOL_ROLE, READER_ROLE):
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if not exists:
                try:
                    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                except psycopg.errors.DuplicateObject:
                    pass  # created concurrently by another awm process
        # The dirty-table fallback refills tables with FK triggers off; PostgreSQL >= 15 can
        # grant just that one setting instead of superuser.
        if conn.info.server_version >= 150000:
            try:
                conn.execute(sql.SQL("GRANT SET ON PARAMETER session_replication_role TO {}").format(
                    sql.Identifier(TOOL_ROLE)))
            except psycopg.errors.InsufficientPrivilege:
                # A non-superuser admin cannot grant it: the fast reset path is unaffected; an
                # instance whose state escaped its transaction then refuses to reset (and is
                # replaced by its supervisor) instead of repairing itself in place.
                log.warning("cannot grant SET session_replication_role to %s: the dirty-table "
                            "fallback is unavailable on this server", TOOL_ROLE)


def ensure_templates(admin_dsn: str, bundles: list[EnvBundle], jobs: int = 4) -> list[Template]:
    """Templates of many bundles, ``jobs`` at a time (a catalog of a thousand environments loads
    them in parallel; each is its own database, so they do not contend but for the server)."""
    from concurrent.futures import ThreadPoolExecutor

    ensure_group_roles(admin_dsn)
    with ThreadPoolExecutor(max(1, min(jobs, len(bundles) or 1))) as pool:
        return list(pool.map(lambda b: ensure_template(admin_dsn, b, roles_ready=True), bundles))


def ensure_template(admin_dsn: str, bundle: EnvBundle, roles_ready: bool = False) -> Template:
    """Load the bundle's snapshot into its template database, unless a complete one exists."""
    if not roles_ready:
        ensure_group_roles(admin_dsn)
    name = template_name(bundle)
    with _admin(admin_dsn) as lock_conn:
        # Many processes (pods' init containers, parallel fleets) may load the same template at
        # once: one loads it, the others wait and then find it complete.
        lock_conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (name,))
        return _ensure_template_locked(admin_dsn, bundle, name)


def complete_template(conn: psycopg.Connection, bundle: EnvBundle, name: str | None = None) -> Template | None:
    """The bundle's template if it is fully loaded, else None (missing, or half-loaded by an
    interrupted run). Needs no lock: a template is marked complete only once loaded."""
    name = name or template_name(bundle)
    row = conn.execute("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
                       (name,)).fetchone()
    info = json.loads(row[0]) if row and row[0] else {}
    if not info.get("complete"):
        return None
    facts = info.get("facts")
    return Template(name, bundle.name, info["checksum"], facts if isinstance(facts, dict) else None)


def _ensure_template_locked(admin_dsn: str, bundle: EnvBundle, name: str) -> Template:
    with _admin(admin_dsn) as conn:
        done = complete_template(conn, bundle, name)
        if done is not None:
            return done
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if row:  # half-loaded by an interrupted run
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
        owner, password = _owner_role(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0 ENCODING 'UTF8'").format(
            sql.Identifier(name), sql.Identifier(owner)))
    try:
        # The bundle's DDL and seed are untrusted (an LLM wrote them): they run on a login of the
        # template's owner role, which owns this database and nothing else (no superuser, so no
        # COPY ... PROGRAM, no untrusted language, no ALTER ROLE); a SET ROLE on the admin's own
        # session would not do, the DDL could RESET it. Only the revocations of pg_catalog
        # privileges, which touch nothing of the bundle's, run on the admin's connection.
        with _as_owner(admin_dsn, name, owner, password) as db, _admin(admin_dsn, name) as admin:
            checksum = load_snapshot(db, bundle, admin)
            facts = snap.read_facts(db).to_json()
    except Exception:
        with _admin(admin_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))
        raise
    with _admin(admin_dsn) as conn:
        # The facts an env server needs of every copy (the snapshot's checksums, sequences,
        # tables, keys): read here once, so that a switch's first connection need not read them
        # from catalogs it has never touched (8.7 ms p50 on the real node).
        comment = json.dumps({"complete": True, "env": bundle.name, "checksum": checksum.digest, "facts": facts})
        ident = sql.Identifier(name)
        # The owner keeps its objects (its functions run as an unprivileged role, never as the
        # admin) but may log in no more.
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN PASSWORD NULL").format(sql.Identifier(owner)))
        conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(ident, sql.Literal(comment)))
        conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))
        conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(ident))
    return Template(name, bundle.name, checksum.digest, facts)


OWNER_PREFIX = "awm_o_"


def owner_role(template: str) -> str:
    """The role that owns template ``template`` and every object its DDL made."""
    return f"{OWNER_PREFIX}{hashlib.sha256(template.encode()).hexdigest()[:20]}"


def _owner_role(conn: psycopg.Connection, template: str) -> tuple[str, str]:
    """The template's owner role, able to log in (once, with a fresh password) and nothing more:
    no superuser, no CREATEDB/CREATEROLE, no replication, no RLS bypass, in no other role."""
    role, password = owner_role(template), secrets.token_urlsafe(24)
    ident = sql.Identifier(role)
    attributes = sql.SQL("LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                         "CONNECTION LIMIT 2 PASSWORD {}").format(sql.Literal(scram_verifier(password)))
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
        conn.execute(sql.SQL("ALTER ROLE {} ").format(ident) + attributes)  # left by an interrupted run
    else:
        conn.execute(sql.SQL("CREATE ROLE {} ").format(ident) + attributes)
    return role, password


@contextlib.contextmanager
def _as_owner(admin_dsn: str, dbname: str, role: str, password: str) -> Iterator[psycopg.Connection]:
    """A connection to ``dbname`` as its owner role (the admin's server, the role's password)."""
    params = {**CONNECT_DEFAULTS, **conninfo_to_dict(admin_dsn), "dbname": dbname, "user": role,
              "password": password}
    with psycopg.connect(make_conninfo(**params), autocommit=True) as conn:
        yield conn


def load_snapshot(db: psycopg.Connection, bundle: EnvBundle, admin: psycopg.Connection | None = None) -> snap.Checksum:
    """DDL, seed, sequences, snapshot copy, grants and checksum, into the connected database.
    ``admin``: a superuser's connection to the same database, for the revocations of pg_catalog
    privileges (``db`` may then be an unprivileged owner's); None: ``db`` does them too."""
    with db.transaction():
        # The schema's own owner, not the database's (pg_database_owner): an instance database
        # is the admin's, and the tables' owner must still reach its schema (foreign-key checks
        # run as the owner of the table they read).
        db.execute("ALTER SCHEMA public OWNER TO CURRENT_USER")
    with db.transaction():
        try:
            db.execute(bundle.database.ddl)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ProvisionError(f"DDL failed: {exc} (an environment's schema runs as its template's owner "
                                 "role, not as a superuser)") from exc
        except psycopg.Error as exc:
            raise ProvisionError(f"DDL failed: {exc}") from exc
    with db.transaction():
        for seed in bundle.database.seed:
            insert_rows(db, seed.table, seed.rows)
    tables = snap.public_tables(db)
    with db.transaction():
        _move_sequences_past_seed(db)
        db.execute(f"CREATE SCHEMA {snap.SNAPSHOT_SCHEMA}")
        db.execute(f"CREATE SCHEMA {snap.META_SCHEMA}")
        for table in tables:
            db.execute(sql.SQL("CREATE TABLE {s}.{t} AS TABLE public.{t}").format(
                s=sql.Identifier(snap.SNAPSHOT_SCHEMA), t=sql.Identifier(table)))
        db.execute(f"CREATE TABLE {snap.META_SCHEMA}.sequences "
                   "(name text PRIMARY KEY, last_value bigint NOT NULL, is_called boolean NOT NULL)")
        db.execute(f"CREATE TABLE {snap.META_SCHEMA}.checksums "
                   "(table_name text PRIMARY KEY, row_count bigint NOT NULL, row_hash_sum numeric NOT NULL)")
        db.execute(f"CREATE TABLE {snap.META_SCHEMA}.info (key text PRIMARY KEY, value jsonb)")
        checksum = snap.compute_checksum(db)
        for name, (last, called) in checksum.sequences.items():
            db.execute(f"INSERT INTO {snap.META_SCHEMA}.sequences VALUES (%s, %s, %s)", (name, last, called))
        for name, (count, total) in checksum.tables.items():
            db.execute(f"INSERT INTO {snap.META_SCHEMA}.checksums VALUES (%s, %s, %s)", (name, count, total))
        db.execute(f"INSERT INTO {snap.META_SCHEMA}.info VALUES ('env', %s), ('database_hash', %s)",
                   (Jsonb(bundle.name), Jsonb(bundle.database_hash())))
        _grant(db)
    _revoke_functions(admin if admin is not None else db)
    return checksum


def insert_rows(db: psycopg.Connection, table: str, rows: list[dict[str, Any]]) -> None:
    """Insert seed rows in order; a column a row leaves out gets its DEFAULT, not NULL.

    The first failing row is reported with its index, the database's reason and its values.
    """
    index = 0
    while index < len(rows):
        columns = list(rows[index])
        end = index
        while end < len(rows) and list(rows[end]) == columns:  # a run of rows with the same columns
            end += 1
        _insert_run(db, table, columns, rows, index, end)
        index = end


def _insert_run(db: psycopg.Connection, table: str, columns: list[str], rows: list[dict[str, Any]],
                start: int, end: int) -> None:
    target = sql.SQL("INSERT INTO public.{} ").format(sql.Identifier(table))
    if columns:
        statement = target + sql.SQL("({}) VALUES ({})").format(
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns)))
    else:
        statement = target + sql.SQL("DEFAULT VALUES")
    values = [tuple(_adapt(rows[i][c]) for c in columns) for i in range(start, end)]
    try:
        with db.transaction(), db.cursor() as cur:  # a savepoint: a failure leaves the load usable
            cur.executemany(statement, values)
        return
    except psycopg.Error:
        pass
    for offset, value in enumerate(values):  # find the offending row for a precise error
        try:
            with db.transaction():
                db.execute(statement, value)
        except psycopg.Error as exc:
            i = start + offset
            raise ProvisionError(f"seed row {i} of table {table!r} failed: {exc}; row={rows[i]}") from exc
    raise ProvisionError(f"seed rows {start}-{end - 1} of table {table!r} failed as a batch")


def _adapt(value: Any) -> Any:
    return Jsonb(value) if isinstance(value, (dict, list)) else value


def _move_sequences_past_seed(db: psycopg.Connection) -> None:
    owned = db.execute(
        "SELECT c.relname, a.attname, s.relname FROM pg_depend d "
        "JOIN pg_class s ON s.oid = d.objid AND s.relkind = 'S' "
        "JOIN pg_class c ON c.oid = d.refobjid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = d.refobjsubid "
        "WHERE n.nspname = 'public' AND d.deptype IN ('a', 'i')"
    ).fetchall()
    for table, column, seq in owned:
        db.execute(sql.SQL(
            "SELECT setval({seq}, coalesce((SELECT max({c}) FROM public.{t}), 1), "
            "(SELECT max({c}) FROM public.{t}) IS NOT NULL)"
        ).format(seq=sql.Literal(f"public.{seq}"), c=sql.Identifier(column), t=sql.Identifier(table)))


# Built-in functions no instance may call: session-level state that survives ROLLBACK (advisory
# locks), messages to other sessions, and server-side files. Revoked in the template, so every
# clone inherits it; the statement guard refuses them too, and each reset unlocks all locks.
REVOKED_FUNCTIONS = (
    "pg_advisory_lock(bigint)", "pg_advisory_lock(integer, integer)",
    "pg_advisory_lock_shared(bigint)", "pg_advisory_lock_shared(integer, integer)",
    "pg_try_advisory_lock(bigint)", "pg_try_advisory_lock(integer, integer)",
    "pg_try_advisory_lock_shared(bigint)", "pg_try_advisory_lock_shared(integer, integer)",
    "pg_advisory_xact_lock(bigint)", "pg_advisory_xact_lock(integer, integer)",
    "pg_advisory_xact_lock_shared(bigint)", "pg_advisory_xact_lock_shared(integer, integer)",
    "pg_try_advisory_xact_lock(bigint)", "pg_try_advisory_xact_lock(integer, integer)",
    "pg_try_advisory_xact_lock_shared(bigint)", "pg_try_advisory_xact_lock_shared(integer, integer)",
    "pg_notify(text, text)", "lo_import(text)", "lo_import(text, oid)", "lo_export(oid, text)",
    # Session settings (statement_timeout, role) and functions that run SQL given as text, where
    # the statement guard cannot see it.
    "set_config(text, text, boolean)", "ts_stat(text)", "ts_stat(text, text)", "ts_rewrite(tsquery, text)",
    "query_to_xml(text, boolean, boolean, text)", "query_to_xmlschema(text, boolean, boolean, text)",
    "query_to_xml_and_xmlschema(text, boolean, boolean, text)",
    # Overloads the statement guard cannot tell from an allowed one of the same name
    # (envserver/sql_allowlist.py REVOKED_OVERLOADS; tests/test_sqlguard.py checks both agree):
    # age(xid) reads the cluster's transaction counter, which other instances move; the trims
    # with a set of characters never check for a cancel and take the product of their arguments'
    # lengths (envserver/sqlguard.py UNCANCELLABLE).
    "age(xid)", "btrim(bytea,bytea)", "btrim(text,text)", "ltrim(bytea,bytea)", "ltrim(text,text)",
    "rtrim(bytea,bytea)", "rtrim(text,text)",
)
TEMP_FILE_LIMIT = "256MB"  # per session of an instance role
# Bumped when the template's privileges change, so that no template made before is reused.
HARDENING = "4"


def _revoke_functions(db: psycopg.Connection) -> None:
    """What the admin revokes in a template, in one transaction: nothing of the bundle's objects
    is touched (so none of the bundle's code can run as the admin)."""
    with db.transaction():
        # Also here, not only by the owner: where the public schema is not the database owner's
        # (PostgreSQL < 15), only its owner can take CREATE on it away from PUBLIC.
        db.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        # pg_settings' UPDATE rule runs set_config as the view's owner: `UPDATE pg_settings SET
        # setting = 0 WHERE name = 'statement_timeout'` would switch the statement timeout off.
        db.execute("REVOKE UPDATE ON pg_catalog.pg_settings FROM PUBLIC")
        for signature in REVOKED_FUNCTIONS:
            try:
                db.execute(f"REVOKE EXECUTE ON FUNCTION pg_catalog.{signature} FROM PUBLIC")
            except psycopg.errors.InsufficientPrivilege:
                log.warning("cannot revoke %s from PUBLIC (the admin role is not a superuser): the "
                            "statement guard and the reset still stop it", signature)
                return


def _grant(db: psycopg.Connection) -> None:
    tool, reader = sql.Identifier(TOOL_ROLE), sql.Identifier(READER_ROLE)
    for statement in (
        "REVOKE ALL ON SCHEMA public FROM PUBLIC",
        "GRANT USAGE ON SCHEMA public, {snapshot}, {meta} TO {tool}, {reader}",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {tool}",
        "GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {tool}",
        "GRANT SELECT ON ALL TABLES IN SCHEMA public, {snapshot}, {meta} TO {tool}, {reader}",
        "GRANT SELECT ON ALL SEQUENCES IN SCHEMA public TO {reader}",
    ):
        db.execute(sql.SQL(statement).format(
            tool=tool, reader=reader, snapshot=sql.Identifier(snap.SNAPSHOT_SCHEMA),
            meta=sql.Identifier(snap.META_SCHEMA)))


def instance_name(env: str, index: int, fleet: str = "") -> str:
    """``awm_i_[<fleet>_]<env>_<index>``: the fleet id keeps two fleets on one server apart."""
    middle = f"{_slug(fleet, 12)}_" if fleet else ""
    return f"{INSTANCE_PREFIX}{middle}{_slug(env, 40)}_{index}"


def pod_instance_name(pod: str) -> str:
    """``awm_i_<pod name>`` for a Kubernetes env pod (``-`` becomes ``_``). PostgreSQL cuts
    identifiers at 63 bytes, which would silently merge two long pod names, so a longer name
    keeps its head and gets a hash of the whole name instead."""
    name = INSTANCE_PREFIX + _slug(pod, 200)
    if len(name) <= 63:
        return name
    import hashlib

    return f"{name[:50]}_{hashlib.sha256(pod.encode()).hexdigest()[:12]}"


def create_instance(admin_dsn: str, template: Template, name: str,
                    meta: dict[str, str] | None = None) -> Instance:
    """A fresh database cloned from the template, and a role that reaches only it.

    ``meta`` goes into the database comment next to the environment and template (the
    Kubernetes operator records pod, fleet and namespace there, to find a fleet's databases)."""
    with _admin(admin_dsn) as conn:
        return _create_instance(conn, admin_dsn, template, name, meta)


def clone_strategy(conn: psycopg.Connection) -> str | None:
    """The ``CREATE DATABASE`` strategy for instance databases on this server (None: the
    server's own, before PostgreSQL 15 had a choice).

    ``FILE_COPY`` copies the template's files between two checkpoints, and a checkpoint on a
    durable server (``fsync`` on: the chart's shards, any external server) flushes and syncs
    every dirty buffer of every instance on it. ``WAL_LOG`` copies through the WAL instead.
    Measured on one durable server (2 vCPUs, ext4, a generated environment's ~8 MB template,
    12 clones each, alternating, each then connected to): ``WAL_LOG`` 31.9 ms p50 against
    96.2 ms idle, 34.2 against 96.9 ms with 8 episodes writing. Without ``fsync`` (the embedded
    server) the two are within each other's noise in latency (48-76 ms) and ``FILE_COPY`` costs
    the server less CPU (docs/benchmarks.md, "Instance databases at claim time"), so it stays."""
    if conn.info.server_version < 150000:
        return None
    fsync = conn.execute("SHOW fsync").fetchone()
    return "FILE_COPY" if fsync is not None and fsync[0] == "off" else "WAL_LOG"


def scram_verifier(password: str, iterations: int = 1) -> str:
    """What PostgreSQL stores for ``password`` under SCRAM-SHA-256 (``pg_authid.rolpassword``;
    RFC 5802 and 7677), made here and given to ``CREATE ROLE ... PASSWORD`` as it is.

    Why one iteration: an instance role's password is 24 random bytes, so there is no dictionary
    for SCRAM's iterations to slow down, and one is as strong as the server's 4,096. Those cost
    the server ~3 ms to hash the password at creation and the env server ~2.7 ms at every
    connect (a switch's first connection to its new database): measured, connect p50 4.2 against
    1.5 ms. PostgreSQL 16's ``scram_iterations`` would do the same, but shards run 15. ``password``
    must be ASCII (SASLprep leaves it as it is), as :func:`secrets.token_urlsafe` makes it."""
    if not password.isascii():
        raise ValueError("scram_verifier: the password must be ASCII (no SASLprep here)")
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    stored_key = hashlib.sha256(hmac.digest(salted, b"Client Key", "sha256")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    b64 = (lambda raw: base64.b64encode(raw).decode())
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def _create_instance(conn: psycopg.Connection, admin_dsn: str, template: Template, name: str,
                     meta: dict[str, str] | None, strategy: str | None = None) -> Instance:
    """:func:`create_instance` on an admin connection the caller holds. ``strategy``: the
    ``CREATE DATABASE`` strategy (``FILE_COPY`` or ``WAL_LOG``; None: the server's default)."""
    _drop(conn, name)
    comment = instance_comment(template, meta)
    # The role and its owner record (the comment) are made in one transaction, before the
    # database exists: a process killed at any point of this function leaves nothing without an
    # owner for reap_abandoned and the operator's sweeps to find (CREATE DATABASE cannot run in a
    # transaction; its own comment follows it).
    role, password = instance_role_sql(conn, name, comment)
    one_transaction(conn, role)
    conn.execute(clone_statement(template, name, strategy))
    one_transaction(conn, open_database_sql(name, name, comment))  # one commit and one round trip, not three
    return Instance(template.env, name, name, instance_dsn(admin_dsn, name, password))


def instance_comment(template: Template, meta: dict[str, Any] | None) -> str:
    """The comment of an instance database and its role: ``meta`` (owner) and where it came from."""
    return json.dumps({**(meta or {}), "env": template.env, "template": template.dbname})


def instance_dsn(admin_dsn: str, name: str, password: str) -> str:
    """The DSN of instance ``name``: the admin's server, the instance's database, role and password."""
    params = conninfo_to_dict(admin_dsn)
    params.update(dbname=name, user=name, password=password)
    return make_conninfo(**params)


def clone_statement(template: Template, name: str, strategy: str | None = None) -> sql.Composed:
    """``CREATE DATABASE name TEMPLATE ...`` (``STRATEGY`` when given: FILE_COPY or WAL_LOG)."""
    clone = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template.dbname))
    if strategy is not None:
        if strategy.upper() not in ("FILE_COPY", "WAL_LOG"):
            raise ValueError(f"unknown CREATE DATABASE strategy {strategy!r}")
        clone = sql.SQL("{} STRATEGY {}").format(clone, sql.SQL(strategy.upper()))
    return clone


def instance_role_sql(conn: psycopg.Connection, name: str, comment: str) -> tuple[list[sql.Composable], str]:
    """The statements that create instance ``name``'s role, and its password.

    One connection at most: the env server's; a stolen password cannot open a second one
    beside it. Temporary files are the cluster's disk, shared with every other instance, so a
    sort or hash that spills is bounded (a superuser-only setting: the role cannot raise it;
    left out, with a warning, where the admin role is not a superuser)."""
    password = secrets.token_urlsafe(24)
    role = sql.Identifier(name)
    statements: list[sql.Composable] = [
        sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}, {} CONNECTION LIMIT 1").format(
            role, sql.Literal(scram_verifier(password)), sql.Identifier(TOOL_ROLE), sql.Identifier(READER_ROLE)),
        sql.SQL("COMMENT ON ROLE {} IS {}").format(role, sql.Literal(comment))]
    if conn.info.parameter_status("is_superuser") == "on":
        statements.append(sql.SQL("ALTER ROLE {} SET temp_file_limit = {}").format(role, sql.Literal(TEMP_FILE_LIMIT)))
    else:
        log.warning("cannot set temp_file_limit for instance roles (the admin role is not a superuser)")
    return statements, password


def open_database(conn: psycopg.Connection, database: str, role: str | None, comment: str) -> None:
    """Database ``database`` reachable by ``role`` only (None: by nobody but the admin), and its
    owner record, in the caller's transaction."""
    for statement in open_database_sql(database, role, comment):
        conn.execute(statement)


def open_database_sql(database: str, role: str | None, comment: str) -> list[sql.Composable]:
    """The statements of :func:`open_database`."""
    db = sql.Identifier(database)
    statements: list[sql.Composable] = [sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(db)]
    if role is not None:
        statements.append(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(db, sql.Identifier(role)))
    statements.append(sql.SQL("COMMENT ON DATABASE {} IS {}").format(db, sql.Literal(comment)))
    return statements


def one_transaction(conn: psycopg.Connection, statements: list[sql.Composable], synchronous: bool = True) -> None:
    """``statements`` as one transaction sent in one round trip (they take no parameters: the
    simple query protocol), on an autocommit connection; rolled back and raised on an error.
    ``synchronous=False``: its commit does not wait for the WAL to reach the disk (only where
    losing it to a crash of the server loses nothing: see the callers)."""
    body: list[sql.Composable] = [sql.SQL("BEGIN")]
    if not synchronous:
        body.append(sql.SQL("SET LOCAL synchronous_commit = off"))
    try:
        conn.execute(sql.SQL("; ").join([*body, *statements, sql.SQL("COMMIT")]))
    except psycopg.Error:
        if not conn.closed and conn.info.transaction_status == pq.TransactionStatus.INERROR:
            conn.execute("ROLLBACK")
        raise


def drop_instance(admin_dsn: str, name: str) -> None:
    with _admin(admin_dsn) as conn:
        _drop(conn, name)


def drop_instances(admin_dsn: str, names: list[str], retry_s: float = CONNECT_RETRY_S) -> list[str]:
    """Drop ``names`` over one connection, waiting at most ``retry_s`` for it (not that long per
    database: a server that is gone would hold its caller for minutes); the names not dropped.
    A failed drop does not stop the others."""
    left: list[str] = []
    with _admin(admin_dsn, retry_s=retry_s) as conn:
        for name in names:
            try:
                _drop(conn, name)
            except psycopg.Error:
                if conn.closed:
                    raise
                left.append(name)
    return left


def _drop(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def list_instances(admin_dsn: str) -> list[str]:
    with _admin(admin_dsn) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s ORDER BY 1",
                            (INSTANCE_PREFIX + "%",)).fetchall()
    return [r[0] for r in rows]


def instances_with_meta(admin_dsn: str) -> dict[str, dict[str, Any]]:
    """Every instance (a database, or a role whose database was never made: its creator died)
    with the metadata in its comment - the database's, else its role's, which exists from the
    role's creation on (``{}`` if neither has one)."""
    with _admin(admin_dsn) as conn:
        rows = conn.execute(
            "SELECT name, coalesce(shobj_description(d.oid, 'pg_database'), shobj_description(r.oid, 'pg_authid')) "
            "FROM (SELECT datname AS name FROM pg_database UNION SELECT rolname FROM pg_roles) n "
            "LEFT JOIN pg_database d ON d.datname = n.name LEFT JOIN pg_roles r ON r.rolname = n.name "
            "WHERE n.name LIKE %s ORDER BY 1", (INSTANCE_PREFIX + "%",)).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for name, comment in rows:
        try:
            meta = json.loads(comment) if comment else {}
        except ValueError:
            meta = {}
        out[name] = meta if isinstance(meta, dict) else {}
    return out


def harden_cluster(admin_dsn: str) -> None:
    """On a cluster awm owns (the embedded one): no role but the admin may connect to the
    maintenance databases, so an instance role reaches nothing but its own database."""
    with _admin(admin_dsn) as conn:
        for db in ("postgres", "template1"):
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(db)))


def provision_pod(bundle_path: str, pod: str, dsn_file: str, admin_dsn: str,
                  fleet: str = "", namespace: str = "") -> str:
    """A Kubernetes env pod's ``provision`` init container: ensure the environment's template,
    clone the pod's database and role from it, and write the instance DSN to ``dsn_file`` (mode
    0600, replaced atomically: the env server never reads a half-written file). Returns the
    database name."""
    import os
    from pathlib import Path

    with open(bundle_path, encoding="utf-8") as f:
        bundle = EnvBundle.model_validate_json(f.read())
    dbname = pod_instance_name(pod)
    meta = {"pod": pod, "fleet": fleet, "namespace": namespace}
    # One connection and no lock when the template is there (for every pod but the first of an
    # environment): the pods of a fleet start together, and the locked path queued them one at a
    # time on the roles' and then the template's advisory lock, each holding it while it opened
    # more connections (four per pod). Only a missing template takes that path, to load it.
    with _admin(admin_dsn) as conn:
        template = complete_template(conn, bundle)
        instance = _create_instance(conn, admin_dsn, template, dbname, meta) if template else None
    if instance is None:  # no complete template yet
        template = ensure_template(admin_dsn, bundle)
        instance = create_instance(admin_dsn, template, dbname, meta=meta)
    target = Path(dsn_file)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(instance.dsn)
    os.chmod(tmp, 0o600)
    os.replace(tmp, target)
    log.warning("provisioned %s from %s for %s", dbname, template.dbname, bundle.name)
    return dbname


def main(argv: list[str] | None = None) -> None:
    """``python -m awm.postgres.provision``: :func:`provision_pod` for an init container. A plain
    argparse entry rather than ``awm postgres provision-instance`` (the same thing): every pod
    start pays for this process, and the CLI's imports cost it twice the CPU."""
    import argparse
    import os
    import sys

    from awm import settings

    ap = argparse.ArgumentParser(prog="python -m awm.postgres.provision", description=main.__doc__)
    ap.add_argument("--bundle", required=True, help="the environment's bundle (JSON)")
    ap.add_argument("--name", required=True, help="pod name: the database is awm_i_<name>")
    ap.add_argument("--dsn-file", required=True, help="where to write the instance DSN (mode 0600)")
    ap.add_argument("--fleet", default=settings.AWM_FLEET, help="recorded with the database (AWM_FLEET)")
    ap.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", ""),
                    help="recorded with the database (POD_NAMESPACE)")
    args = ap.parse_args(argv)
    admin_dsn = settings.AWM_ADMIN_DSN  # never argv: visible to every user in ps
    if not admin_dsn:
        sys.exit("provision: set AWM_ADMIN_DSN to the admin DSN (CREATEDB, CREATEROLE)")
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    provision_pod(args.bundle, args.name, args.dsn_file, admin_dsn, args.fleet, args.namespace)


if __name__ == "__main__":
    main()
