"""The server side of untrusted code's SQL: its one way to run.

Tool, verifier and app code runs in a confined worker (``awm/sandbox``) and sends statements over
a pipe; :func:`execute_untrusted` runs each on the instance's connection (one statement per call,
psycopg's extended protocol refuses a second), after ``sqlguard.check_statement`` refuses anything
but a data statement on the allow-list. Values come back JSON-ready for Python tools.
"""

from __future__ import annotations

import datetime as dt
import decimal
import sys
import uuid
from typing import Any

import psycopg
from psycopg import generators, pq
from psycopg._preparing import Prepare
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
# Rows arrive from libpq in chunks of this many (chunked rows mode, libpq >= 17; else one by one):
# the bytes are counted as each chunk arrives, so no more than the caps and one chunk is ever held.
CHUNK_ROWS = 256


def _chunk_bytes(result: pq.abc.PGresult) -> int:
    """The size of a chunk's values as the server sent them (undecoded): every value counted."""
    rows, fields = result.ntuples, result.nfields
    total = 0
    for r in range(rows):
        for c in range(fields):
            value = result.get_value(r, c)
            total += len(value) if value is not None else 0
    return total


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
    descriptions for SQLAlchemy) or ``none`` (``db.execute``: the rowcount only). The statement
    goes through the extended protocol, so the server itself refuses a second statement.
    Statements that only read are wrapped in a ``LIMIT``, fetched or not, so the database stops at
    :data:`MAX_ROWS` + 1 rows; every result (a ``RETURNING`` too) arrives in chunks whose bytes are
    counted as they arrive, and one past :data:`MAX_ROWS` or :data:`MAX_RESULT_BYTES` is refused
    (its rest read and dropped) before any row is decoded. Raises :class:`SqlForbidden`,
    :class:`ResultTooLarge` or psycopg's errors.
    """
    if not isinstance(sql, str):
        raise SqlForbidden("the statement must be a string")
    query = False if is_app_savepoint(sql) else check_statement(sql, with_params=params is not None)
    args = _params(params)
    if query:
        # A read: the database stops at MAX_ROWS + 1 rows (wrapping keeps the plan cacheable,
        # unlike a server-side cursor); the statement inside is the one the guard checked.
        sql = f"SELECT * FROM (\n{sql.rstrip().rstrip(';')}\n) AS awm_rows LIMIT {MAX_ROWS + 1}"
    cur = conn.cursor(row_factory=dict_row if fetch == "dicts" else tuple_row)
    chunks, end, received = _run_capped(cur, sql, args)
    # rows received (a SELECT's final result in chunked mode has no count), else rows affected
    rowcount = received if end.status == pq.ExecStatus.TUPLES_OK else (
        end.command_tuples if end.command_tuples is not None else -1)
    reply: dict[str, Any] = {"rowcount": rowcount}
    try:
        rows = _decode(cur, chunks) if fetch != "none" else []
        if fetch == "dicts":
            rows = [{k: to_json_value(v) for k, v in row.items()} for row in rows]
    except RecursionError:
        # jsonb nested thousands deep is a valid value; decoding it is not: the agent's error
        # (a tool_error), never an internal one of the env server.
        raise ResultTooLarge("a value in the result is nested too deeply to return (JSON nested over "
                             f"{sys.getrecursionlimit()} levels)") from None
    if fetch == "dicts":
        reply["rows"] = rows
    elif fetch == "tuples":
        reply["rows"] = rows
        reply["columns"] = ([[end.fname(i).decode(), end.ftype(i)] for i in range(end.nfields)]
                            if end.status == pq.ExecStatus.TUPLES_OK else None)
    return reply


def _run_capped(cur: psycopg.Cursor[Any], sql: str,
                args: Any) -> tuple[list[pq.abc.PGresult], pq.abc.PGresult, int]:
    """Execute (prepared, as ``execute(prepare=True)`` would) and receive the result in chunks:
    (the row chunks, the final result, the rows received). Over a cap: the rest is received and
    dropped, then :class:`ResultTooLarge`; the statement still ends normally (no cancel), so the
    episode's transaction stays usable."""
    conn = cur.connection
    with conn.lock:
        chunks, end, received, over = conn.wait(_capped_gen(cur, sql, args))
    if over:
        _trim()
        raise ResultTooLarge(over)
    return chunks, end, received


def _capped_gen(cur: psycopg.Cursor[Any], sql: str, args: Any) -> Any:
    """psycopg's ``execute(prepare=True)`` generator (``_maybe_prepare_gen``, psycopg 3.2-3.3)
    with the rows received in chunks: public psycopg has no prepared statement in chunked mode,
    and ``Cursor.stream`` (unprepared, rows decoded one by one) costs a plan per call. Uses the
    connection's own preparation cache, so a tool's statement is planned once per connection;
    tests/test_db_isolation.py exercises each branch against a real server."""
    yield from cur._start_query(sql)
    pgq = cur._convert_query(sql, args)
    prep, name = cur._get_prepared(pgq, True)
    if prep is Prepare.NO:
        cur._execute_send(pgq, force_extended=True)
    else:
        if prep is Prepare.SHOULD:
            cur._send_prepare(name, pgq)
            for result in (yield from generators.execute(cur._pgconn)):
                if result.status == pq.ExecStatus.FATAL_ERROR:
                    raise psycopg.errors.error_from_result(result, encoding=cur._encoding)
        cur._send_query_prepared(name, pgq)
    _chunked(cur._pgconn)
    key = cur._conn._prepared.maybe_add_to_cache(pgq, prep, name)
    yield from generators.send(cur._pgconn)
    chunks: list[pq.abc.PGresult] = []
    end: pq.abc.PGresult | None = None
    rows = size = 0
    over = ""
    while (result := (yield from generators.fetch(cur._pgconn))) is not None:
        if result.status in _ROW_STATUSES:
            rows += result.ntuples
            size += _chunk_bytes(result) if not over else 0
            over = over or _over_cap(rows, size)
            if over:
                chunks.clear()  # dropped as they arrive: memory stays at one chunk
            else:
                chunks.append(result)
        else:
            end = result
    if end is None:
        raise psycopg.InternalError("got no result from the statement")
    if key is not None:
        cur._conn._prepared.validate(key, prep, name, [end])
    # A ROLLBACK (an app's ROLLBACK TO SAVEPOINT too) or a DROP makes psycopg forget its prepared
    # statements and queue DEALLOCATE ALL; run it now, as psycopg's execute does, or it would run
    # after the next statement is prepared and delete that one ("prepared statement does not exist").
    yield from cur._conn._prepared.maintain_gen(cur._conn)
    cur._check_results([end])
    return chunks, end, rows, over


_ROW_STATUSES = (pq.ExecStatus.SINGLE_TUPLE, getattr(pq.ExecStatus, "TUPLES_CHUNK", pq.ExecStatus.SINGLE_TUPLE))


def _chunked(pgconn: Any) -> None:
    """Chunked rows mode where libpq has it (17+), else single-row mode."""
    try:
        pgconn.set_chunked_rows_mode(CHUNK_ROWS)
    except (psycopg.NotSupportedError, AttributeError):
        pgconn.set_single_row_mode()


def _over_cap(rows: int, size: int) -> str:
    if rows > MAX_ROWS:
        return f"the statement returned more than {MAX_ROWS} rows"
    if size > MAX_RESULT_BYTES:
        return f"the statement returned more than {MAX_RESULT_BYTES >> 20} MiB"
    return ""


def _decode(cur: psycopg.Cursor[Any], chunks: list[pq.abc.PGresult]) -> list[Any]:
    """Rows of every chunk, decoded by the cursor's row factory (within the caps by now)."""
    rows: list[Any] = []
    for index, chunk in enumerate(chunks):
        cur.pgresult = chunk
        cur._tx.set_pgresult(chunk, set_loaders=index == 0)
        if index == 0:
            cur._make_row = cur._make_row_maker()
        rows.extend(cur._tx.load_rows(0, chunk.ntuples, cur._make_row))
    return rows
