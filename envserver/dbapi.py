"""The database handle that tool code receives as ``db``.

Tool code is untrusted. The handle exposes four calls, executes exactly one statement per call
(psycopg's extended protocol refuses a second one), and refuses statements that would end or
escape the episode transaction (COMMIT, ROLLBACK, SET ROLE, ...). Values come back JSON-ready.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from typing import Any

import psycopg
from psycopg.rows import dict_row

# Statements a tool may never run: they end or alter the episode transaction or the session.
_FORBIDDEN = re.compile(
    r"^\s*(commit|rollback|begin|start|end|abort|savepoint|release|prepare|set|reset|discard|"
    r"listen|notify|unlisten|lock|copy|do|call|vacuum|checkpoint|load|grant|revoke|create\s+role|"
    r"alter\s+(role|system|user|database)|drop\s+database|create\s+database)\b",
    re.IGNORECASE,
)
# Functions that change session state from inside an ordinary SELECT.
_FORBIDDEN_CALL = re.compile(r"\b(set_config|pg_advisory\w*|dblink\w*|lo_\w+|pg_read\w*|pg_ls_\w+)\s*\(",
                             re.IGNORECASE)
_COMMENT = re.compile(r"(--[^\n]*\n?)|(/\*.*?\*/)", re.DOTALL)


class ToolError(Exception):
    """An error meant for the agent: the message is returned as the tool's error text."""


class SqlForbidden(ToolError):
    pass


def check_statement(sql: str) -> None:
    head = _COMMENT.sub(" ", sql).lstrip().lstrip("(")
    if _FORBIDDEN.match(head):
        raise SqlForbidden(f"statement not allowed in an environment tool: {head.split()[0].upper()}")
    call = _FORBIDDEN_CALL.search(sql)
    if call:
        raise SqlForbidden(f"function not allowed in an environment tool: {call.group(1)}")


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


class Db:
    """``query``/``one``/``scalar``/``execute`` with ``%s`` placeholders, on one connection."""

    __slots__ = ("_conn",)

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def _run(self, sql: str, params: tuple[Any, ...]) -> psycopg.Cursor:
        check_statement(sql)
        cur = self._conn.cursor(row_factory=dict_row)
        # A prepared statement holds exactly one SQL statement, so "SELECT 1; COMMIT" is refused
        # by the server itself; preparing also makes the repeated statements of a tool cheaper.
        cur.execute(sql, params, prepare=True)
        return cur

    def query(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        cur = self._run(sql, params)
        if cur.description is None:
            return []
        return [{k: to_json_value(v) for k, v in row.items()} for row in cur.fetchall()]

    def one(self, sql: str, *params: Any) -> dict[str, Any] | None:
        rows = self.query(sql, *params)
        return rows[0] if rows else None

    def scalar(self, sql: str, *params: Any) -> Any:
        row = self.one(sql, *params)
        return next(iter(row.values())) if row else None

    def execute(self, sql: str, *params: Any) -> int:
        """Run a write; returns the number of rows affected."""
        return self._run(sql, params).rowcount
