"""The tool-side database handle's statement guard and value conversion (no database; the
allow-list against a real server's catalog: tests/test_sqlguard.py)."""

import datetime as dt
import decimal

import pytest

from awm.envserver.dbapi import SqlForbidden, check_statement, to_json_value


@pytest.mark.parametrize("sql", [
    "COMMIT", "  rollback", "BEGIN", "/* hi */ commit", "-- x\nCOMMIT", "SET ROLE postgres", "RESET ROLE",
    "SAVEPOINT x", "RELEASE SAVEPOINT x", "select set_config('role', 'postgres', false)",
    "SELECT pg_advisory_lock(1)", "COPY notes TO '/tmp/x'", "DO $$ BEGIN END $$", "grant all on notes to public",
    "ALTER ROLE x SUPERUSER", "CREATE DATABASE evil",
    # the allow-list: functions however spelt or placed, writes to anything but the instance's tables
    'SELECT U&"\\0070g_advisory_xact_lock"(1)', "SELECT * FROM notes ORDER BY set_config('a', 'b', true)",
    "VALUES (pg_catalog.pg_sleep(1))", "SELECT public.evil()", "SELECT ts_stat('select 1')",
    "UPDATE pg_settings SET setting = 0", "WITH d AS (DELETE FROM pg_catalog.pg_class RETURNING 1) SELECT 1",
    "MERGE INTO pg_settings s USING (SELECT 1) v ON true WHEN MATCHED THEN UPDATE SET setting = '0'",
    "select * into t2 from notes", "SELECT 1; SELECT 2", "SELECT 1 OPERATOR(public.+) 2", "", "   ",
    "SELECT %q", "SELECT 1 FROM",
])
def test_transaction_and_session_control_is_refused(sql):
    with pytest.raises(SqlForbidden):
        check_statement(sql)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM notes", "INSERT INTO notes (title) VALUES (%s)", "UPDATE notes SET settings = 1",
    "WITH x AS (SELECT 1) SELECT * FROM x", "DELETE FROM tags WHERE note_id = %s", "select 'commit'",
    "SELECT count(*), lower(title) FROM notes WHERE title LIKE 'a%%' AND id BETWEEN 1 AND 3 GROUP BY 2",
    "SELECT extract(year from now()), substring('abc' from 1 for 2), trim(' a '), pg_typeof(1)",
    "SHOW statement_timeout", "VALUES (1)", "TABLE notes", "SELECT x FROM notes WHERE id = ANY(%(ids)s)",
    'SELECT "title" FROM "public"."notes" FOR UPDATE', "SELECT jsonb_build_object('a', 1) ->> 'a'",
    "INSERT INTO public.notes (title) VALUES (%s) ON CONFLICT DO NOTHING RETURNING id",
    "SELECT row_number() OVER (ORDER BY id), coalesce(title, '') FROM notes",
])
def test_ordinary_statements_pass(sql):
    check_statement(sql)


def test_only_queries_that_read_may_be_capped():
    """check_statement says whether a LIMIT may wrap the statement: a SELECT with no write in it."""
    assert check_statement("SELECT * FROM notes") is True
    assert check_statement("WITH d AS (DELETE FROM notes RETURNING id) SELECT * FROM d") is False
    assert check_statement("UPDATE notes SET title = 'x' RETURNING id") is False
    assert check_statement("SHOW work_mem") is False


def test_placeholders_are_read_as_psycopg_sends_them():
    """With parameters, %s and %(name)s are placeholders and %% a percent sign; without, the
    text is parsed as it is (psycopg sends it unchanged)."""
    assert check_statement("SELECT * FROM notes WHERE title LIKE %s AND id = %(id)s AND 5 %% 2 = 1")
    assert check_statement("SELECT * FROM notes WHERE title LIKE 'a%'", with_params=False)
    with pytest.raises(SqlForbidden):
        check_statement("SELECT %s", with_params=False)


def test_values_become_json_ready():
    assert to_json_value(decimal.Decimal("19.90")) == 19.9
    assert to_json_value(decimal.Decimal("3")) == 3
    assert to_json_value(dt.date(2026, 1, 2)) == "2026-01-02"
    assert to_json_value({"a": [dt.datetime(2026, 1, 2, 3, 4)]}) == {"a": ["2026-01-02T03:04:00"]}


def test_the_guard_remembers_only_short_statements():
    """Statements are remembered by text (tools repeat theirs), but not long ones: untrusted code
    sending thousands of distinct large statements cannot grow the server's memory through it."""
    from awm.envserver import sqlguard

    sqlguard._check.cache_clear()
    long_sql = "SELECT 1 WHERE " + " AND ".join(["1 = 1"] * 3000)
    assert len(long_sql) > sqlguard.CACHED_TEXT and check_statement(long_sql)
    check_statement("SELECT 2")
    info = sqlguard._check.cache_info()
    assert info.currsize == 1
