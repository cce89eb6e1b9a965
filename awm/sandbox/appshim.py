"""Serving a generated FastAPI + SQLAlchemy app (AWM-1K environments) inside a confined worker.

The app's module is executed once per worker; each tool call is one in-process ASGI request.
The app keeps its SQLAlchemy code unchanged, but its engine has no database connection: the
"DBAPI connection" SQLAlchemy's psycopg dialect receives is :class:`PipeConnection`, whose cursors
send every statement to the server over the worker's pipe. The server runs it on the instance's
one connection, inside the tool call's savepoint, after the same statement filter as Python tools.

* While the module body runs, ``create_engine`` returns our one engine whatever URL and SQLite
  ``connect_args`` the code passes, and ``MetaData.create_all``/``drop_all`` do nothing: the schema
  is the bundle's DDL. ``__name__`` is not ``"__main__"``, so a ``uvicorn.run`` block never runs.
* A connection's transaction is a SAVEPOINT (``awm_app_N``) that its first statement opens;
  ``commit()`` releases it and ``rollback()`` rolls back to it, so ``session.commit()`` in app code
  can never end the episode transaction. SQLite ``PRAGMA`` statements are ignored; ``LIKE``
  compiles to ``ILIKE`` (SQLite's LIKE is case-insensitive and the apps' tasks rely on it).
* Sync endpoints run inline on the worker's one thread (the worker may not start threads).
* Errors come back as psycopg's own exception classes (looked up by SQLSTATE), so SQLAlchemy wraps
  them as usual and app code that catches ``IntegrityError`` keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import types
from typing import Any, Iterator

from awm.sandbox import channel

_PRAGMA = re.compile(r"^\s*PRAGMA\b", re.IGNORECASE)
BASE_URL = "http://awm-app"
SERVER_VERSION = 170000  # what the dialect is told; only feature checks for very old servers read it

_LOOP: asyncio.AbstractEventLoop | None = None


def prepare() -> None:
    """Before confinement: import what apps use and build the event loop."""
    import_frameworks()
    make_loop()


def make_loop() -> None:
    """The worker's own event loop (its self-pipe needs a socketpair, which the worker may not
    create once confined). Never inherited from the fork server: an epoll instance made before a
    fork is one kernel object shared by every child."""
    global _LOOP
    _LOOP = asyncio.new_event_loop()
    asyncio.set_event_loop(_LOOP)


def import_frameworks() -> None:
    """What apps use, imported once (by the fork server, before any child exists)."""
    import anyio.to_thread
    import fastapi  # noqa: F401
    import httpx  # noqa: F401
    import psycopg  # noqa: F401 - the dialect's DBAPI module (exception classes, type adapters)
    import pydantic  # noqa: F401
    import sqlalchemy  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401
    import starlette.concurrency  # noqa: F401

    async def run_sync(func: Any, *args: Any, **_: Any) -> Any:
        return func(*args)

    anyio.to_thread.run_sync = run_sync  # type: ignore[assignment]


# -- the DBAPI facade ----------------------------------------------------------------------------


def _raise(exc: channel.DatabaseError) -> None:
    import psycopg

    if exc.kind == "forbidden":
        raise psycopg.errors.InsufficientPrivilege(str(exc)) from None
    cls = psycopg.errors.lookup(exc.sqlstate) if exc.sqlstate else None
    raise (cls or psycopg.DatabaseError)(str(exc)) from None


class _Column(tuple):
    """A ``cursor.description`` entry: (name, type_code, ...) like DBAPI's, with ``.name``."""

    @property
    def name(self) -> str:
        return self[0]


class PipeCursor:
    def __init__(self, owner: PipeConnection) -> None:
        self._owner = owner
        self._rows: list[tuple[Any, ...]] = []
        self._index = 0
        self.description: list[_Column] | None = None
        self.rowcount = -1
        self.arraysize = 1

    def _send(self, query: Any, params: Any) -> None:
        text = query.decode() if isinstance(query, bytes) else str(query)
        self._rows, self._index, self.description, self.rowcount = [], 0, None, -1
        if _PRAGMA.match(text):
            return
        self._owner.begin()
        try:
            reply = channel.sql_request(text, _plain(params), fetch="tuples")
        except channel.DatabaseError as exc:
            _raise(exc)
        columns = reply.get("columns")
        self.description = [_Column((name, oid, None, None, None, None, None)) for name, oid in columns] \
            if columns is not None else None
        self._rows = [tuple(row) for row in reply.get("rows") or []]
        self.rowcount = int(reply.get("rowcount", -1))

    def execute(self, query: Any, params: Any = None, **_: Any) -> PipeCursor:
        self._send(query, params)
        return self

    def executemany(self, query: Any, params_seq: Any, **_: Any) -> PipeCursor:
        total = 0
        for params in params_seq:
            self._send(query, params)
            total += max(self.rowcount, 0)
        self.rowcount = total
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._index >= len(self._rows):
            return None
        self._index += 1
        return self._rows[self._index - 1]

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        size = size or self.arraysize
        rows = self._rows[self._index:self._index + size]
        self._index += len(rows)
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows = self._rows[self._index:]
        self._index = len(self._rows)
        return rows

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row

    def close(self) -> None:
        self._rows = []

    def setinputsizes(self, *_: Any) -> None:
        pass

    def setoutputsize(self, *_: Any) -> None:
        pass


def _plain(params: Any) -> Any:
    """psycopg's JSON wrappers, which SQLAlchemy's dialect uses for JSON columns, as tagged values."""
    from psycopg.types.json import Json, Jsonb

    def one(value: Any) -> Any:
        if isinstance(value, (Json, Jsonb)):
            return {"$t": "jsonb" if isinstance(value, Jsonb) else "json", "v": value.obj}
        return value

    if isinstance(params, dict):
        return {k: one(v) for k, v in params.items()}
    if isinstance(params, (list, tuple)):
        return [one(v) for v in params]
    return params


class _Info:
    """What the dialect reads from ``connection.info``."""

    server_version = SERVER_VERSION
    encoding = "utf-8"
    vendor = "PostgreSQL"

    def __init__(self, owner: PipeConnection) -> None:
        self._owner = owner

    @property
    def transaction_status(self) -> Any:
        from psycopg.pq import TransactionStatus

        return TransactionStatus.INTRANS if self._owner.savepoint else TransactionStatus.IDLE

    def parameter_status(self, name: str) -> bytes | None:
        return {"standard_conforming_strings": b"on", "client_encoding": b"UTF8"}.get(name)


_OPEN: list["PipeConnection"] = []  # connections with a savepoint open, oldest first


class PipeConnection:
    """What SQLAlchemy sees as a DBAPI connection: a savepoint on the episode's connection, held by
    the server. It never commits, rolls back or closes the episode transaction."""

    _counter = 0

    def __init__(self) -> None:
        import psycopg

        self.savepoint: str | None = None
        self.closed = False
        self.broken = False
        self.info = _Info(self)
        self.adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)

    def begin(self) -> None:
        if self.savepoint is None:
            PipeConnection._counter += 1
            name = f"awm_app_{PipeConnection._counter}"
            try:
                channel.sql_request(f"SAVEPOINT {name}", None, fetch="none")
            except channel.DatabaseError as exc:
                _raise(exc)
            self.savepoint = name
            _OPEN.append(self)

    def _end(self, commit: bool) -> None:
        name, self.savepoint = self.savepoint, None
        if name is None:
            return
        if self in _OPEN:
            _OPEN.remove(self)
        with contextlib.suppress(channel.DatabaseError):  # already released by an outer rollback
            if not commit:
                channel.sql_request(f"ROLLBACK TO SAVEPOINT {name}", None, fetch="none")
            channel.sql_request(f"RELEASE SAVEPOINT {name}", None, fetch="none")

    def cursor(self, *_: Any, **__: Any) -> PipeCursor:
        if self.closed:
            import psycopg

            raise psycopg.InterfaceError("connection is closed")
        return PipeCursor(self)

    def commit(self) -> None:
        self._end(commit=True)

    def rollback(self) -> None:
        self._end(commit=False)

    def close(self) -> None:
        self.rollback()  # like a DBAPI connection: closing discards what was not committed
        self.closed = True

    autocommit = False
    isolation_level = None
    read_only = None
    deferrable = None

    def add_notice_handler(self, *_: Any) -> None:
        pass


# -- loading the app -----------------------------------------------------------------------------


def _engine(create_engine: Any) -> Any:
    """The one engine the app gets, over the pipe, with SQLite's LIKE semantics."""
    from sqlalchemy.dialects.postgresql.base import PGCompiler
    from sqlalchemy.pool import NullPool

    engine = create_engine("postgresql+psycopg://", creator=PipeConnection, poolclass=NullPool,
                           use_native_hstore=False)
    base = engine.dialect.statement_compiler

    class EpisodeCompiler(base):  # type: ignore[misc, valid-type]
        def visit_like_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
            return PGCompiler.visit_ilike_op_binary(self, binary, operator, **kw)

        def visit_not_like_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
            return PGCompiler.visit_not_ilike_op_binary(self, binary, operator, **kw)

    engine.dialect.statement_compiler = EpisodeCompiler
    return engine


@contextlib.contextmanager
def _patched_sqlalchemy(engine: Any) -> Iterator[None]:
    import sqlalchemy
    import sqlalchemy.engine
    import sqlalchemy.engine.create
    from sqlalchemy import MetaData

    def create_engine(*args: Any, **kwargs: Any) -> Any:
        return engine

    def no_ddl(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    saved = [(sqlalchemy, "create_engine", sqlalchemy.create_engine),
             (sqlalchemy.engine, "create_engine", sqlalchemy.engine.create_engine),
             (sqlalchemy.engine.create, "create_engine", sqlalchemy.engine.create.create_engine),
             (MetaData, "create_all", MetaData.create_all), (MetaData, "drop_all", MetaData.drop_all)]
    try:
        for target, attribute, _ in saved[:3]:
            setattr(target, attribute, create_engine)
        MetaData.create_all = no_ddl  # type: ignore[method-assign]
        MetaData.drop_all = no_ddl  # type: ignore[method-assign]
        os.environ["DATABASE_PATH"] = "sqlite:///:memory:"  # read by the generated code; never opened
        yield
    finally:
        for target, attribute, value in saved:
            setattr(target, attribute, value)
        os.environ.pop("DATABASE_PATH", None)


def load_app(code: str, module_name: str) -> tuple[types.ModuleType, Any]:
    """Execute the app's source as a module (so Pydantic and FastAPI resolve its annotations);
    returns the module and its FastAPI instance."""
    import sqlalchemy.engine.create
    from fastapi import FastAPI
    from pydantic import BaseModel

    engine = _engine(sqlalchemy.engine.create.create_engine)
    module = types.ModuleType(module_name)
    module.__file__ = f"<awm app {module_name}>"
    sys.modules[module_name] = module
    with _patched_sqlalchemy(engine):
        exec(compile(code, module.__file__, "exec"), module.__dict__)
    app = module.__dict__.get("app")
    if not isinstance(app, FastAPI):
        app = next((v for v in module.__dict__.values() if isinstance(v, FastAPI)), None)
    if app is None:
        raise ValueError("the app's code defines no FastAPI instance")
    for value in list(module.__dict__.values()):  # forward references between response models
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module_name:
            with contextlib.suppress(Exception):
                value.model_rebuild()
    return module, app


class AppHost:
    """One loaded app and the requests into it."""

    def __init__(self, code: str, name: str) -> None:
        import httpx

        self.module, self.app = load_app(code, f"awm_app_{name}")
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL,
                                         timeout=None)

    def request(self, method: str, url: str, query: list[Any], body: Any) -> tuple[int, str]:
        assert _LOOP is not None
        try:
            response = _LOOP.run_until_complete(self._client.request(method, url, params=query, json=body))
        finally:
            # A session the app never committed nor closed: SQLite would have rolled it back when
            # the connection went back to the pool, so must we (the tool's savepoint would keep it).
            for conn in list(_OPEN):
                conn.rollback()
        return response.status_code, response.text


def classify(exc: BaseException) -> dict[str, Any] | None:
    """A failure that escaped the app, as the worker reports it: database errors keep their
    SQLSTATE so the server can tell a rejected request from a crash."""
    import psycopg

    orig = getattr(exc, "orig", None) or exc
    if isinstance(orig, psycopg.errors.InsufficientPrivilege) and "not allowed" in str(orig):
        return {"op": "failed", "kind": "forbidden", "reason": str(orig)[:channel.MAX_REASON]}
    if isinstance(orig, psycopg.Error):
        return {"op": "failed", "kind": "db", "reason": str(orig).strip()[:channel.MAX_REASON],
                "sqlstate": orig.sqlstate}
    return None
