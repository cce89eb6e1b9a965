"""The statement guard's allow-list against the real server's catalog."""

from __future__ import annotations

import psycopg
import pytest

from awm.envserver import sqlguard
from awm.envserver.sql_allowlist import FUNCTIONS, OPERATORS, REVOKED_OVERLOADS


def test_the_allow_list_is_generated_from_this_servers_catalog(admin_dsn: str) -> None:
    """envserver/sql_allowlist.py is what `python -m awm.envserver.sqlguard --write` makes from
    the server the tests run (same major version): a new PostgreSQL's functions are reviewed by
    regenerating, never picked up silently."""
    functions, revoked, operators, version = sqlguard.generate(admin_dsn)
    assert sorted(FUNCTIONS) == functions, "run `python -m awm.envserver.sqlguard --write`"
    assert sorted(REVOKED_OVERLOADS) == revoked
    assert sorted(OPERATORS) == operators


def test_no_allowed_function_writes_outside_the_episode(admin_dsn: str) -> None:
    """Every allowed function is immutable or stable in every overload (changes nothing), or one
    of the reviewed few; none of those that run SQL text or that the template revokes is allowed."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        volatile = {r[0] for r in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace AND provolatile = 'v'")}
    assert FUNCTIONS & volatile <= sqlguard.REVIEWED
    for name in ("set_config", "pg_advisory_lock", "pg_advisory_xact_lock_shared", "pg_try_advisory_lock",
                 "ts_stat", "ts_rewrite", "query_to_xml", "table_to_xml", "database_to_xml", "pg_sleep",
                 "pg_terminate_backend", "pg_cancel_backend", "pg_notify", "lo_import", "pg_read_file",
                 "pg_ls_dir", "pg_stat_get_activity", "dblink", "setseed", "pg_reload_conf",
                 # the transaction machinery and the session's connection, under any alias
                 "txid_current", "txid_current_snapshot", "txid_current_if_assigned", "pg_current_snapshot",
                 "pg_current_xact_id", "mxid_age", "pg_column_toast_chunk_id", "inet_client_port"):
        assert name not in FUNCTIONS, name
    for name in ("count", "sum", "lower", "now", "date_trunc", "extract", "jsonb_build_object", "string_agg",
                 "row_number", "generate_series", "nextval", "random", "to_char", "round", "array_agg"):
        assert name in FUNCTIONS, name


def test_no_operator_runs_a_refused_implementation(admin_dsn: str) -> None:
    """Operators are allowed by name (built-in ones): none of them runs a refused function."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        overloads = sqlguard.read_overloads(conn)
        codes = {r[0] for r in conn.execute(
            "SELECT oprcode::oid::bigint FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace")}
    assert not codes & sqlguard.refused_overloads(overloads)


@pytest.mark.parametrize("sql", [
    "SELECT ctid FROM notes", "SELECT n.xmin FROM notes n", "SELECT (n).xmax FROM notes n",
    "SELECT ctid(n) FROM notes n",
    'SELECT "cmin" FROM notes', "SELECT * FROM notes ORDER BY tableoid", "UPDATE notes SET title = 'x' RETURNING ctid",
    "SELECT (n.*).cmax FROM notes n", 'SELECT U&"\\0063tid" FROM notes', "WITH x AS (SELECT xmin FROM notes) SELECT 1",
    "SELECT * FROM notes TABLESAMPLE BERNOULLI (50) REPEATABLE (1)", "SELECT * FROM pg_locks",
    "SELECT * FROM pg_catalog.pg_class", "SELECT * FROM information_schema.tables", "SELECT * FROM awm_snapshot.notes",
    "DELETE FROM notes USING pg_stat_activity a WHERE a.pid = 1",
])
def test_physical_layout_and_other_sessions_are_refused(sql: str) -> None:
    """System columns however reached, TABLESAMPLE, and relations that are not the environment's
    own tables (catalogs, statistics, locks: other sessions and earlier episodes)."""
    with pytest.raises(sqlguard.SqlForbidden):
        sqlguard.check_statement(sql, with_params=False)


def test_select_star_and_whole_rows_carry_no_system_column(admin_dsn: str) -> None:
    """``*``, ``t.*`` and a whole-row value never expand to system columns (checked on the
    server), so the guard may pass them."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE t (a int)")
        conn.execute("INSERT INTO t VALUES (1)")
        for sql in ("SELECT * FROM t", "SELECT t.* FROM t", "SELECT row_to_json(t)::text FROM t"):
            cur = conn.execute(sql)
            names = [c.name for c in cur.description or []]
            assert not set(names) & sqlguard.SYSTEM_COLUMNS and "ctid" not in str(cur.fetchall()), sql
            sqlguard.check_statement(sql, with_params=False)


@pytest.mark.parametrize("sql", [
    "SELECT " + "+".join(["1"] * 30_000),  # one tree level per operator: overflowed the C stack
    "SELECT 1 WHERE " + " AND ".join(["1 = 1"] * 14_000),
    "SELECT '" + "x" * (sqlguard.MAX_STATEMENT_CHARS + 1) + "'",
])
def test_long_statements_are_refused_before_parsing(sql: str) -> None:
    with pytest.raises(sqlguard.SqlForbidden, match="too long|too complex"):
        sqlguard.check_statement(sql, with_params=False)


def test_a_deep_statement_within_the_bounds_is_parsed_on_a_big_stack() -> None:
    """Under the bounds, a long statement is parsed on a thread with a big stack: 4,000
    chained operators pass (and would pass on the smallest thread stack too), a 1,200-row
    INSERT page with placeholders passes, and nesting past the parser's own limit is refused."""
    assert sqlguard.check_statement("SELECT " + "+".join(["1"] * 4000), with_params=False)
    page = "INSERT INTO notes (user_id, title) VALUES " + ",".join(f"(%(u{i})s, %(t{i})s)" for i in range(1200))
    assert len(page) > sqlguard.CACHED_TEXT and sqlguard.check_statement(page) is False
    with pytest.raises(sqlguard.SqlForbidden, match="not a valid statement"):
        sqlguard.check_statement("SELECT " + "abs(" * 12_000 + "1" + ")" * 12_000, with_params=False)
