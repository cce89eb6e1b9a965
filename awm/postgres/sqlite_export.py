"""SQLite files of an episode's database, for verifiers written against SQLite (AWM-1K).

Such a verifier takes two paths, ``initial_db_path`` and ``final_db_path``, and opens them with
``sqlite3``. The server builds both from Postgres (the snapshot copy and the live tables) into
SQLite databases created from the bundle's ``database.sqlite_ddl``, so column names, order and
declared types (hence SQLite's affinities) are those the verifier was written for. Values are
converted the way SQLite stored them: booleans as 0/1, timestamps as ``YYYY-MM-DD HH:MM:SS``.

Nothing is written to disk: the two databases travel to the verifier's confined worker as
bytes, which it opens in memory, read-only (``awm/sandbox/worker.py``); the verifier sees two
fictional paths that only its ``sqlite3.connect`` understands.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
import sqlite3
from typing import Any

import psycopg
from psycopg import sql

Tables = dict[str, tuple[list[str], list[tuple[Any, ...]]]]


def read_tables(conn: psycopg.Connection, schema: str, tables: list[str]) -> Tables:
    """Every row of ``tables`` in ``schema``, with column names."""
    out: Tables = {}
    for table in tables:
        cur = conn.execute(sql.SQL("SELECT * FROM {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        out[table] = ([d.name for d in cur.description or []], cur.fetchall())
    return out


def sqlite_value(value: Any) -> Any:
    """A Postgres value as SQLite (and the dataset's inserts) would have stored it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def build_sqlite(sqlite_ddl: str, tables: Tables) -> bytes:
    """A SQLite database (as bytes) with ``sqlite_ddl``'s tables filled from ``tables``."""
    db = sqlite3.connect(":memory:")
    try:
        db.executescript(sqlite_ddl)
        known = {row[0]: [c[1] for c in db.execute(f"PRAGMA table_info({_quote(row[0])})")]
                 for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, (columns, rows) in tables.items():
            if table not in known or not rows:
                continue
            keep = [i for i, c in enumerate(columns) if c in known[table]]
            names = ", ".join(_quote(columns[i]) for i in keep)
            marks = ", ".join("?" * len(keep))
            db.executemany(f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})",
                           [tuple(sqlite_value(row[i]) for i in keep) for row in rows])
        db.commit()
        return db.serialize()
    finally:
        db.close()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
