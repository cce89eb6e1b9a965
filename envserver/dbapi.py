"""The server side of untrusted code's SQL: the statement guard and its one way to run.

Tool, verifier and app code runs in a confined worker (``awm/sandbox``) and sends statements over
a pipe; :func:`execute_untrusted` runs each on the instance's connection (one statement per call,
psycopg's extended protocol refuses a second), after :func:`check_statement` refuses anything that
would end or escape the episode transaction. Values come back JSON-ready for Python tools.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

# What untrusted code may run: data statements only. Everything else (transaction and session
# control, DDL, COPY, LISTEN, PREPARE/EXECUTE, DO, ...) is refused by its first keyword, so there
# is no list of bad spellings to keep complete. The server also sends every statement through the
# extended protocol (one statement per call) and checks the transaction after it, and the
# instance role has no DDL or TEMP privilege: this check is the first of three layers.
_ALLOWED_HEAD = re.compile(r"^(select|with|insert|update|delete|values|table|merge|show)\b", re.IGNORECASE)
# Functions that reach outside the episode transaction or the database, or run SQL text (the
# *_to_xml family executes a query string, which would bypass this check). Names are compared
# unquoted and lower-cased, so ``"pg_advisory_lock"(1)`` and ``pg_catalog.PG_ADVISORY_LOCK(1)``
# are the same call; the template database also revokes them where the admin role can.
_FORBIDDEN_FUNCTION = re.compile(
    r"^(set_config|pg_advisory\w*|pg_try_advisory\w*|dblink\w*|lo_\w+|pg_read\w*|pg_ls_\w+|pg_stat_file|"
    r"pg_file_\w+|pg_notify|pg_terminate_backend|pg_cancel_backend|pg_reload_conf|pg_rotate_logfile|"
    r"pg_logical_emit_message|pg_switch_wal|pg_create_\w+|pg_drop_\w+|pg_replication_\w+|"
    r"query_to_xml\w*|cursor_to_xml\w*|table_to_xml\w*|schema_to_xml\w*|database_to_xml\w*|"
    r"pg_import_system_collations|pg_promote|pg_log_backend_memory_contexts|ts_stat|ts_rewrite)$")
# The target of a write: only the instance's own tables (schema public, never a system view such
# as pg_settings, whose UPDATE rule would change session settings).
_WRITE_TARGET = re.compile(r'\b(?:update|insert\s+into|delete\s+from|merge\s+into)\s+(?:only\s+)?'
                           r'((?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)(?:\s*\.\s*(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*))*)',
                           re.IGNORECASE)
# An identifier (plain or double-quoted, "" inside quotes) followed by an opening parenthesis.
_CALL = re.compile(r'("(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)\s*\(')
# Comments and string literals (a name inside a string is data), dollar-quoted strings included.
_NOISE = re.compile(r"(--[^\n]*)|(/\*.*?\*/)|(\b[Ee]'(?:[^'\\]|\\.|'')*')|('(?:[^']|'')*')|"
                    r"((?<![A-Za-z0-9_$])\$([A-Za-z_][A-Za-z0-9_]*|)\$.*?\$\6\$)",
                    re.DOTALL)
_APP_SAVEPOINT = re.compile(
    r"^\s*(SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK\s+TO\s+SAVEPOINT)\s+(sa_savepoint|awm_app)_\d+\s*;?\s*$",
    re.IGNORECASE)


class ToolError(Exception):
    """An error meant for the agent: the message is returned as the tool's error text."""


class SqlForbidden(ToolError):
    pass


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def is_app_savepoint(sql: str) -> bool:
    """The savepoints an app's connection facade opens and closes inside the tool's savepoint."""
    return bool(_APP_SAVEPOINT.match(sql))


def check_statement(sql: str) -> None:
    """Refuse anything but one data statement that calls no forbidden function."""
    if "\x00" in sql:
        raise SqlForbidden("statement contains a NUL character")
    if re.search(r"\bU&[\"']", sql, re.IGNORECASE):
        raise SqlForbidden("Unicode-escaped identifiers and strings are not allowed in an environment tool")
    bare = _NOISE.sub(" ", sql)
    head = bare.lstrip().lstrip("(").lstrip()
    first = _ALLOWED_HEAD.match(head)
    if not first:
        word = head.split(None, 1)[0].upper() if head.split() else "(empty)"
        raise SqlForbidden(f"statement not allowed in an environment tool: {word[:40]}")
    if first.group(1).lower() in ("select", "with", "table", "values") and re.search(
            r"\binto\b", re.sub(r"\b(insert|merge)\s+into\b", " ", bare, flags=re.IGNORECASE), re.IGNORECASE):
        raise SqlForbidden("SELECT ... INTO (creating a table) is not allowed in an environment tool")
    for match in _WRITE_TARGET.finditer(bare):
        parts = [_unquote(x.strip()) for x in re.findall(r'"(?:[^"]|"")+"|[^.\s"]+', match.group(1))]
        if (len(parts) > 1 and parts[0] != "public") or len(parts) > 2 or parts[-1].startswith("pg_"):
            raise SqlForbidden(f"writes only to the environment's own tables, not {'.'.join(parts)[:80]}")
    for match in _CALL.finditer(bare):
        name = _unquote(match.group(1))
        if _FORBIDDEN_FUNCTION.match(name):
            raise SqlForbidden(f"function not allowed in an environment tool: {name}")


def to_json_value(value: Any) -> Any:
    """Convert a database value into something ``json.dumps`` accepts without losing meaning."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**53 else float(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {k: to_json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json_value(v) for v in value]
    return value


MAX_ROWS = 10_000  # rows one statement may return to untrusted code
_ROWS_HEAD = re.compile(r"^\s*\(*\s*(select|values|table|with)\b", re.IGNORECASE)
_WRITES = re.compile(r"\b(insert|update|delete|merge)\b", re.IGNORECASE)


class ResultTooLarge(ToolError):
    pass


MAX_RESULT_BYTES = 16 * 1024 * 1024  # bytes one statement may return to untrusted code


def _result_bytes(cur: psycopg.Cursor[Any]) -> int:
    """The size of the result's values as the server sent them (undecoded), estimated from up to
    16 sampled rows: enough to refuse a result of a few huge rows before any is decoded."""
    result = cur.pgresult
    if result is None or result.ntuples == 0:
        return 0
    rows, fields = result.ntuples, result.nfields
    step = max(1, rows // 16)
    sampled = 0
    for r in range(0, rows, step):
        for c in range(fields):
            value = result.get_value(r, c)
            sampled += len(value) if value is not None else 0
    return sampled * step


def _trim() -> None:
    """Give a big result's memory back to the system (glibc keeps freed arenas otherwise)."""
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _adapt(value: Any) -> Any:
    from psycopg.types.json import Json, Jsonb

    from awm.sandbox.codec import JsonParam

    if isinstance(value, JsonParam):
        return Jsonb(value.obj) if value.binary else Json(value.obj)
    return value


def _params(params: Any) -> Any:
    if params is None:
        return None
    if isinstance(params, dict):
        return {str(k): _adapt(v) for k, v in params.items()}
    if isinstance(params, list):
        return [_adapt(v) for v in params]
    raise SqlForbidden("query parameters must be a list or an object")


def execute_untrusted(conn: psycopg.Connection, sql: str, params: Any, fetch: str) -> dict[str, Any]:
    """Run one statement that untrusted code sent (a tool's ``db`` call or an app's cursor).

    ``fetch`` is ``dicts`` (JSON-ready rows for Python tools), ``tuples`` (typed rows and column
    descriptions for SQLAlchemy) or ``none``. The statement goes through the extended protocol, so
    the server itself refuses a second statement. Statements that only read are wrapped in a
    ``LIMIT``, so a huge result set is cut at :data:`MAX_ROWS` by the database instead of filling
    this process's memory. Raises :class:`SqlForbidden`, :class:`ResultTooLarge` or psycopg's errors.
    """
    if not isinstance(sql, str):
        raise SqlForbidden("the statement must be a string")
    if not is_app_savepoint(sql):
        check_statement(sql)
    args = _params(params)
    bare = _NOISE.sub(" ", sql)
    if fetch != "none" and _ROWS_HEAD.match(bare) and not _WRITES.search(bare):
        # A read: the database stops at MAX_ROWS + 1 rows (wrapping keeps the plan cacheable,
        # unlike a server-side cursor); the statement inside is the one the guard checked.
        sql = f"SELECT * FROM (\n{sql.rstrip().rstrip(';')}\n) AS awm_rows LIMIT {MAX_ROWS + 1}"
    cur = conn.cursor(row_factory=dict_row if fetch == "dicts" else tuple_row)
    cur.execute(sql, args, prepare=True)
    description = cur.description
    if fetch != "none" and _result_bytes(cur) > MAX_RESULT_BYTES:  # before any row is decoded
        cur.close()
        _trim()
        raise ResultTooLarge(f"the statement returned more than {MAX_RESULT_BYTES >> 20} MiB")
    rows: list[Any] = cur.fetchmany(MAX_ROWS + 1) if description is not None and fetch != "none" else []
    if len(rows) > MAX_ROWS:
        raise ResultTooLarge(f"the statement returned more than {MAX_ROWS} rows")
    rowcount = cur.rowcount
    reply: dict[str, Any] = {"rowcount": rowcount}
    if fetch == "dicts":
        reply["rows"] = [{k: to_json_value(v) for k, v in row.items()} for row in rows]
    elif fetch == "tuples":
        reply["rows"] = rows
        reply["columns"] = [[c.name, c.type_code] for c in description] if description is not None else None
    return reply
