"""The server side of untrusted code's SQL: its one way to run.

Tool, verifier and app code runs in a confined worker (``awm/sandbox``) and sends statements over
a pipe; :func:`execute_untrusted` runs each on the instance's connection (one statement per call,
psycopg's extended protocol refuses a second), after ``sqlguard.check_statement`` refuses anything
but a data statement on the allow-list. Values come back JSON-ready for Python tools.
"""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row, tuple_row

from awm.envserver.sqlguard import SqlForbidden, ToolError, check_statement, is_app_savepoint

__all__ = ["ResultTooLarge", "SqlForbidden", "ToolError", "check_statement", "execute_untrusted", "to_json_value"]

class ResultTooLarge(ToolError):
    pass


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
    query = False if is_app_savepoint(sql) else check_statement(sql, with_params=params is not None)
    args = _params(params)
    if fetch != "none" and query:
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
