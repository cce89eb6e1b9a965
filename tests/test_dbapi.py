"""The tool-side database handle's statement guard and value conversion (no database)."""

import datetime as dt
import decimal

import pytest

from awm.envserver.dbapi import SqlForbidden, check_statement, to_json_value


@pytest.mark.parametrize("sql", [
    "COMMIT", "  rollback", "BEGIN", "/* hi */ commit", "-- x\nCOMMIT", "SET ROLE postgres", "RESET ROLE",
    "SAVEPOINT x", "RELEASE SAVEPOINT x", "select set_config('role', 'postgres', false)",
    "SELECT pg_advisory_lock(1)", "COPY notes TO '/tmp/x'", "DO $$ BEGIN END $$", "grant all on notes to public",
    "ALTER ROLE x SUPERUSER", "CREATE DATABASE evil",
])
def test_transaction_and_session_control_is_refused(sql):
    with pytest.raises(SqlForbidden):
        check_statement(sql)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM notes", "INSERT INTO notes (title) VALUES (%s)", "UPDATE notes SET settings = 1",
    "WITH x AS (SELECT 1) SELECT * FROM x", "DELETE FROM tags WHERE note_id = %s", "select 'commit'",
])
def test_ordinary_statements_pass(sql):
    check_statement(sql)


def test_values_become_json_ready():
    assert to_json_value(decimal.Decimal("19.90")) == 19.9
    assert to_json_value(decimal.Decimal("3")) == 3
    assert to_json_value(dt.date(2026, 1, 2)) == "2026-01-02"
    assert to_json_value({"a": [dt.datetime(2026, 1, 2, 3, 4)]}) == {"a": ["2026-01-02T03:04:00"]}
