"""The statement guard's allow-list against the real server's catalog."""

from __future__ import annotations

import psycopg

from awm.envserver import sqlguard
from awm.envserver.sql_allowlist import FUNCTIONS, OPERATORS


def test_the_allow_list_is_generated_from_this_servers_catalog(admin_dsn: str) -> None:
    """envserver/sql_allowlist.py is what `python -m awm.envserver.sqlguard --write` makes from
    the server the tests run (same major version): a new PostgreSQL's functions are reviewed by
    regenerating, never picked up silently."""
    functions, operators, version = sqlguard.generate(admin_dsn)
    assert sorted(FUNCTIONS) == functions, "run `python -m awm.envserver.sqlguard --write`"
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
                 "pg_ls_dir", "pg_stat_get_activity", "dblink", "setseed", "pg_reload_conf"):
        assert name not in FUNCTIONS, name
    for name in ("count", "sum", "lower", "now", "date_trunc", "extract", "jsonb_build_object", "string_agg",
                 "row_number", "generate_series", "nextval", "random", "to_char", "round", "array_agg"):
        assert name in FUNCTIONS, name
