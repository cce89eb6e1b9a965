"""The database as a deterministic world: what an episode sees depends only on what it did.

A rollback restores rows, not their places or transaction ids: a new row's ``ctid``/``xmin``
reveals rows an earlier episode inserted and rolled back, ``txid_current_snapshot()`` another
instance's open transaction, ``lastval()`` the last episode's ids. Each is refused by what it is
(the statement guard's parse tree; functions by implementation, against this server's pg_proc),
and two episodes with identical actions get identical results and verdicts whatever ran before.
Real PostgreSQL, real confined workers.
"""

from __future__ import annotations

import re
from typing import Any, Iterator

import psycopg
import pytest

from awm.envserver import sqlguard
from awm.envserver.reset import EpisodeDatabase
from awm.envserver.sql_allowlist import FUNCTIONS, REVOKED_OVERLOADS
from awm.envserver.verify import verify_in_worker
from awm.postgres import provision
from awm.sandbox.pool import WorkerPool, WorkerSpec

TOOLS = {
    "run": """
def run(db, sql, fetch="query"):
    return db.query(sql) if fetch == "query" else db.execute(sql)
""",
    "churn": """
def churn(db):
    for i in range(60):
        db.execute("INSERT INTO notes (user_id, title, body) VALUES (1, %s, %s)", f"churn {i}", "x" * 500)
    db.execute("UPDATE notes SET body = body || 'y'")
    db.execute("DELETE FROM tags")
""",
}

# One episode's actions, each a tool call: identical in every episode of the test.
SCRIPT: list[dict[str, Any]] = [
    {"sql": "SELECT lastval()"},  # session state: not yet defined in any episode (DISCARD SEQUENCES)
    {"sql": "INSERT INTO notes (user_id, title) VALUES (1, 'same') RETURNING id", "fetch": "query"},
    {"sql": "SELECT * FROM notes ORDER BY id"},
    {"sql": "SELECT lastval()"},
    {"sql": "SELECT currval('notes_id_seq')"},
    # the physical-layout and transaction channels: refused, the same way each time
    {"sql": "SELECT ctid, xmin, xmax FROM notes WHERE title = 'same'"},
    {"sql": "SELECT n.ctid FROM notes n"},
    {"sql": "SELECT (n).xmin FROM notes n"},
    {"sql": "SELECT ctid(n) FROM notes n"},
    {"sql": "INSERT INTO tags (note_id, tag) VALUES (1, 't') RETURNING tableoid, cmin"},
    {"sql": "SELECT txid_current_snapshot()"},
    {"sql": "SELECT txid_current()"},
    {"sql": "SELECT age('1'::xid)"},
    {"sql": "SELECT mxid_age('1')"},
    {"sql": "SELECT * FROM notes TABLESAMPLE SYSTEM (50) REPEATABLE (1)"},
    {"sql": "SELECT relpages, reltuples FROM pg_class WHERE relname = 'notes'"},
    {"sql": "SELECT n_tup_ins, n_dead_tup FROM pg_stat_user_tables"},
    {"sql": "SELECT count(*) FROM pg_locks"},
    {"sql": "SELECT count(*) FROM pg_catalog.pg_stat_activity"},
]
VERIFIERS = {
    "rows": """
def verify(final, initial, answer):
    rows = final.query("SELECT id, title FROM notes ORDER BY id")
    return len(rows) == 5, str(rows)
""",
    "ctid": """
def verify(final, initial, answer):
    rows = final.query("SELECT max(ctid::text) AS c FROM notes")
    return rows[0]["c"] == "(0,4)", str(rows)
""",
    "xmin": """
def verify(final, initial, answer):
    return final.query("SELECT count(*) AS n FROM notes WHERE xmin::text::bigint > 1")[0]["n"] == 0, "fresh"
""",
}


@pytest.fixture(scope="module")
def pool() -> Iterator[WorkerPool]:
    spec = WorkerSpec(load={"prelude": "", "tools": [{"name": k, "code": v} for k, v in TOOLS.items()]})
    workers = WorkerPool(spec)
    workers.start()
    yield workers
    workers.close()


def _instance(admin_dsn: str, bundle: Any, name: str) -> tuple[EpisodeDatabase, provision.Instance]:
    template = provision.ensure_template(admin_dsn, bundle)
    instance = provision.create_instance(admin_dsn, template, name)
    db = EpisodeDatabase(instance.dsn)
    db.connect()
    db.reset(verify=True)
    return db, instance


def _call(db: EpisodeDatabase, pool: WorkerPool, tool: str, **arguments: Any) -> dict[str, Any]:
    reply, _ = db.run_code(pool, {"op": "call", "tool": tool, "arguments": arguments}, 10, writes=True)
    return reply


def _episode(db: EpisodeDatabase, pool: WorkerPool) -> list[Any]:
    """The script's replies and every verifier's verdict, from a plain reset on."""
    db.reset()
    replies: list[Any] = [_call(db, pool, "run", **step) for step in SCRIPT]
    for name, code in VERIFIERS.items():
        verdict = verify_in_worker(db, pool, code, "verify", None, 10)
        replies.append((name, verdict.verdict, verdict.kind, verdict.reason))
    return replies


def test_identical_episodes_get_identical_results_whatever_ran_before(admin_dsn, notes_bundle, pool):
    """Episode 1 on a fresh instance; then an episode that inserts, updates and deletes (rolled
    back by the reset, its dead rows left in place); then episode 1's actions again: every reply
    and every verdict is the same, and every channel in the script was refused."""
    db, instance = _instance(admin_dsn, notes_bundle, "awm_i_isolation_a")
    try:
        first = _episode(db, pool)
        for _ in range(3):
            db.reset()
            assert _call(db, pool, "churn")["op"] == "result"
        again = _episode(db, pool)
    finally:
        db.close()
        provision.drop_instance(admin_dsn, instance.dbname)
    assert again == first
    assert first[0]["op"] != "result" and "lastval" in str(first[0]), first[0]
    inserted = first[1]["value"][0]["id"]
    assert first[2]["op"] == "result" and [r["id"] for r in first[2]["value"]][-1] == inserted
    assert first[3]["value"] == [{"lastval": inserted}] and first[4]["value"] == [{"currval": inserted}]
    channels = first[5:len(SCRIPT)]
    assert all(r["op"] != "result" for r in channels), channels
    refused = [r for r in channels if re.search(r"not allowed|only the environment", str(r))]
    assert len(refused) == len(channels) - 1, channels  # age('1'::xid): refused by the server (revoked)
    verdicts = {name: (verdict, kind) for name, verdict, kind, _ in first[len(SCRIPT):]}
    assert verdicts == {"rows": ("complete", ""), "ctid": ("error", "query"), "xmin": ("error", "query")}


def test_two_instances_of_one_environment_agree(admin_dsn, notes_bundle, pool):
    """The same actions on two instances, one of which has churned: the same replies."""
    a, ia = _instance(admin_dsn, notes_bundle, "awm_i_isolation_b")
    b, ib = _instance(admin_dsn, notes_bundle, "awm_i_isolation_c")
    try:
        a.reset()
        _call(a, pool, "churn")
        assert _episode(a, pool) == _episode(b, pool)
    finally:
        for db, inst in ((a, ia), (b, ib)):
            db.close()
            provision.drop_instance(admin_dsn, inst.dbname)


# -- functions, by implementation, against this server's catalog -------------------------------

# Every function of the transaction-id, snapshot and multixact families that stays allowed: each
# computes on the value it is given (compare, hash, send, take apart a snapshot value) and reads
# nothing of the server's state.
PURE_XID_FUNCTIONS = {
    "xid", "xideq", "xidneq", "xideqint4", "xidneqint4", "xidsend", "xid8cmp", "xid8eq", "xid8ne", "xid8lt",
    "xid8le", "xid8gt", "xid8ge", "xid8send", "xid8_larger", "xid8_smaller", "hashxid", "hashxidextended",
    "hashxid8", "hashxid8extended", "pg_snapshot_send", "pg_snapshot_xip", "pg_snapshot_xmax",
    "pg_snapshot_xmin", "pg_visible_in_snapshot", "txid_snapshot_send", "txid_snapshot_xip", "txid_snapshot_xmax",
    "txid_snapshot_xmin", "txid_visible_in_snapshot", "age",  # age: age(xid) is revoked (REVOKED_OVERLOADS)
}
_XID_FAMILY = re.compile(r"txid|xact|xid|snapshot|multixact|mxid|toast_chunk")


def _overloads(admin_dsn: str) -> list[sqlguard.Overload]:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return sqlguard.read_overloads(conn)


def test_every_transaction_and_snapshot_function_is_classified(admin_dsn):
    """The families that read the transaction machinery (txid_*, pg_*snapshot*, *xact*, xid,
    multixact): each function, by name or by implementation symbol, is refused, or one of the
    reviewed pure ones. A new alias in a new PostgreSQL fails here until it is classified."""
    overloads = _overloads(admin_dsn)
    family = {o.name for o in overloads if _XID_FAMILY.search(o.name) or _XID_FAMILY.search(o.symbol)}
    assert {"txid_current_snapshot", "txid_current", "pg_current_snapshot", "mxid_age", "pg_xact_status"} <= family
    assert sorted(family & FUNCTIONS) == sorted(PURE_XID_FUNCTIONS & family)


def test_an_alias_is_refused_with_its_implementation(admin_dsn):
    """Every overload that shares an implementation (C symbol) with a refused one is refused
    too: a refused name is off the list, a refused overload of an allowed name is revoked."""
    overloads = _overloads(admin_dsn)
    refused = sqlguard.refused_overloads(overloads)
    refused_impls = {o.implementation() for o in overloads if o.oid in refused}
    for o in overloads:
        if o.implementation() in refused_impls:
            assert o.oid in refused, o
        if o.oid in refused:
            assert o.name not in FUNCTIONS or o.signature in REVOKED_OVERLOADS, o
    assert "txid_current_snapshot" not in FUNCTIONS and "pg_current_snapshot" not in FUNCTIONS


def test_revoked_overloads_are_revoked_in_every_instance(admin_dsn, notes_bundle):
    """The overloads the guard cannot tell apart by name are revoked from PUBLIC in the template
    (so in every clone): the instance role cannot run age(xid), and still runs age(timestamp)."""
    assert set(REVOKED_OVERLOADS) <= set(provision.REVOKED_FUNCTIONS)
    db, instance = _instance(admin_dsn, notes_bundle, "awm_i_isolation_d")
    db.close()
    try:
        with psycopg.connect(admin_dsn, dbname=instance.dbname, autocommit=True) as admin:
            for signature in REVOKED_OVERLOADS:
                allowed = admin.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')",
                                        (instance.role, f"pg_catalog.{signature}")).fetchone()
                assert allowed == (False,), signature
        with psycopg.connect(instance.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT age(timestamp '2026-01-02', timestamp '2026-01-01')").fetchone()
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT age('1'::xid)")
            # TRIM(x) is btrim(text), allowed; TRIM(BOTH set FROM x) is btrim(text, text), which
            # never checks for a cancel (sqlguard.UNCANCELLABLE)
            assert conn.execute("SELECT trim('  a '), ltrim('  a'), rtrim('a  ')").fetchone() == ("a", "a", "a")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT trim(both 'x' from 'xax')")
    finally:
        provision.drop_instance(admin_dsn, instance.dbname)


# -- caps on every result --------------------------------------------------------------------------

CAPPED = [
    # db.execute() of a SELECT: the rows are not fetched, but they are capped all the same
    ("SELECT i FROM generate_series(1, 20000) i", "execute", "rows"),
    ("SELECT repeat('x', 1000000) FROM generate_series(1, 40)", "execute", "MiB"),
    # sized to dodge an estimate from 16 sampled rows: every value is counted as it arrives
    ("SELECT CASE WHEN mod(i, 16) = 1 THEN repeat('x', 200000) ELSE '' END AS v FROM generate_series(1, 4000) i",
     "query", "MiB"),
    # a write's RETURNING rows
    ("UPDATE notes SET body = repeat('y', 6000000) RETURNING body", "query", "MiB"),
    ("UPDATE notes SET body = repeat('y', 6000000) RETURNING body", "execute", "MiB"),
]


@pytest.fixture
def episode(admin_dsn, notes_bundle) -> Iterator[EpisodeDatabase]:
    db, instance = _instance(admin_dsn, notes_bundle, "awm_i_isolation_caps")
    yield db
    db.close()
    provision.drop_instance(admin_dsn, instance.dbname)


@pytest.mark.parametrize("sql,fetch,unit", CAPPED)
def test_every_result_is_capped_fetched_or_not(episode, pool, sql, fetch, unit):
    """A result over the row or byte cap is refused however it is asked for, the statement's
    transaction stays usable (the next statement of the same call runs), and the episode's
    writes before it are kept or rolled back with the call as usual."""
    from awm.envserver.dbapi import ResultTooLarge, execute_untrusted

    episode.reset()
    conn = episode.conn
    assert conn is not None
    with pytest.raises(ResultTooLarge, match=unit):
        execute_untrusted(conn, sql, None, "dicts" if fetch == "query" else "none")
    assert execute_untrusted(conn, "SELECT count(*) AS n FROM notes", None, "dicts")["rows"] == [{"n": 4}]
    reply = _call(episode, pool, "run", sql=sql, fetch=fetch)
    assert reply["op"] != "result" and unit in str(reply), reply
    assert episode.checksum()["pristine"] is False or "UPDATE" not in sql  # the tool's own write, kept
    episode.reset()
    assert episode.checksum()["pristine"]


def test_results_under_the_caps_are_unchanged(episode):
    """Rows, row counts and column types are what psycopg's own execute returns."""
    from awm.envserver.dbapi import MAX_ROWS, execute_untrusted

    episode.reset()
    conn = episode.conn
    assert conn is not None
    many = execute_untrusted(conn, f"SELECT i FROM generate_series(1, {MAX_ROWS}) i", None, "dicts")
    assert many["rowcount"] == MAX_ROWS and many["rows"][-1] == {"i": MAX_ROWS}
    assert execute_untrusted(conn, "SELECT i FROM generate_series(1, 3) i", None, "none")["rowcount"] == 3
    typed = execute_untrusted(conn, "SELECT id, title FROM notes WHERE id = %s", [1], "tuples")
    assert typed["rows"] == [(1, "todo")] and [c[0] for c in typed["columns"]] == ["id", "title"]
    empty = execute_untrusted(conn, "SELECT id FROM notes WHERE false", None, "tuples")
    assert empty["rows"] == [] and empty["columns"] and empty["rowcount"] == 0
    written = execute_untrusted(conn, "UPDATE notes SET body = 'b' WHERE id < %s", [3], "none")
    assert written["rowcount"] == 2
    for _ in range(8):  # prepared after a few runs, as before: the same answers
        again = execute_untrusted(conn, "SELECT title FROM notes WHERE id = %s", [2], "dicts")
        assert again["rows"] == [{"title": "ideas"}]


def test_a_rolled_back_app_savepoint_keeps_prepared_statements_usable(episode):
    """An app's ROLLBACK TO SAVEPOINT makes psycopg forget its prepared statements and queue a
    DEALLOCATE ALL; run late, it deleted the statement prepared next and the app's following
    call failed with "prepared statement does not exist" (SQLAlchemy's session.rollback())."""
    from awm.envserver.dbapi import execute_untrusted

    episode.reset()
    conn = episode.conn
    assert conn is not None
    for round_ in range(3):
        execute_untrusted(conn, f"SAVEPOINT awm_app_{round_}", None, "none")
        for _ in range(8):  # past psycopg's prepare threshold: prepared on the server
            assert execute_untrusted(conn, "SELECT title FROM notes WHERE id = %s", [2], "dicts")["rows"] == [
                {"title": "ideas"}]
        execute_untrusted(conn, f"ROLLBACK TO SAVEPOINT awm_app_{round_}", None, "none")
        for _ in range(8):
            assert execute_untrusted(conn, "SELECT id FROM notes WHERE title = %s", ["ideas"], "dicts")["rows"] == [
                {"id": 2}]
        conn.execute("SELECT 1")  # the server's own statements between calls (RELEASE SAVEPOINT awm_tool)
        assert execute_untrusted(conn, "SELECT id FROM notes WHERE title = %s", ["ideas"], "dicts")["rows"] == [
            {"id": 2}]


# -- an environment's DDL and seed are untrusted ---------------------------------------------------

HOSTILE_DDL = {
    "copy_from_program": "CREATE TABLE x (line text); COPY x FROM PROGRAM 'id';",
    # plpython3u is not installed here; a language of our own needs a superuser the same way
    "untrusted_language": "CREATE TRUSTED LANGUAGE evil HANDLER plpgsql_call_handler;",
    "untrusted_function": "CREATE FUNCTION f() RETURNS int LANGUAGE c AS '$libdir/plpgsql', 'plpgsql_call_handler';",
    "alter_role_superuser": "CREATE TABLE x (id int); ALTER ROLE CURRENT_USER SUPERUSER;",
    "grant_admin_role": "CREATE TABLE x (id int); GRANT pg_execute_server_program TO CURRENT_USER;",
    "reset_role": "RESET ROLE; RESET SESSION AUTHORIZATION; COPY (SELECT 1) TO PROGRAM 'true';",
    "read_server_file": "CREATE TABLE x (line text); COPY x FROM '/etc/passwd';",
    "other_database": "CREATE TABLE x (id int); ALTER DATABASE postgres OWNER TO CURRENT_USER;",
}


def _with_ddl(bundle: Any, ddl: str) -> Any:
    changed = type(bundle).model_validate_json(bundle.model_dump_json())
    changed.database.ddl = bundle.database.ddl + "\n" + ddl
    return changed


@pytest.mark.parametrize("attack", sorted(HOSTILE_DDL))
def test_hostile_ddl_fails_clearly_and_makes_no_template(admin_dsn, notes_bundle, attack):
    """A schema that needs a superuser (a program, a file, an untrusted language, a role
    change, another database) fails with a clear error, leaves no template and no owner role."""
    bundle = _with_ddl(notes_bundle, HOSTILE_DDL[attack])
    name = provision.template_name(bundle)
    with pytest.raises(provision.ProvisionError, match=r"DDL failed: .*(permission denied|must be|superuser|owner)"):
        provision.ensure_template(admin_dsn, bundle)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                            (provision.owner_role(name),)).fetchone() == (0,)
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (True,)


def test_a_template_is_owned_by_an_unprivileged_role_that_cannot_log_in(admin_dsn, notes_bundle):
    """The template's objects belong to its owner role (so a SECURITY DEFINER function or a
    trigger the schema planted runs as that role, never as the admin), which may no longer log
    in; instances cloned from it serve as before."""
    bundle = _with_ddl(notes_bundle, "CREATE FUNCTION who() RETURNS text LANGUAGE sql SECURITY DEFINER "
                                     "AS 'SELECT current_user::text';")
    template = provision.ensure_template(admin_dsn, bundle)
    owner = provision.owner_role(template.dbname)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        role = conn.execute("SELECT rolsuper, rolcanlogin, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = %s",
                            (owner,)).fetchone()
        assert role == (False, False, False, False)
        assert conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s",
                            (template.dbname,)).fetchone() == (owner,)
    instance = provision.create_instance(admin_dsn, template, "awm_i_isolation_owner")
    try:
        with psycopg.connect(instance.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT who()").fetchone() == (owner,)
            assert conn.execute("SELECT count(*) FROM notes").fetchone() == (4,)
    finally:
        provision.drop_instance(admin_dsn, instance.dbname)


def test_a_deeply_nested_value_is_a_tool_error(episode, pool):
    """jsonb nested 3,000 deep (valid in the database) cannot be decoded: the statement's error
    is the agent's (a refusal with a reason), not an internal error, and the episode goes on."""
    from awm.envserver.dbapi import ResultTooLarge, execute_untrusted

    episode.reset()
    conn = episode.conn
    assert conn is not None
    deep = "SELECT (repeat('[', 3000) || repeat(']', 3000))::jsonb AS v"
    for fetch in ("dicts", "tuples"):
        with pytest.raises(ResultTooLarge, match="nested too deeply"):
            execute_untrusted(conn, deep, None, fetch)
    reply = _call(episode, pool, "run", sql=deep)
    assert reply["op"] == "failed" and "nested too deeply" in str(reply), reply
    assert _call(episode, pool, "run", sql="SELECT count(*) AS n FROM notes")["value"] == [{"n": 4}]
