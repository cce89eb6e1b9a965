"""Serving a FastAPI + SQLAlchemy app (AWM-1K environments) as tools, inside the episode transaction.

An imported AWM environment is one generated FastAPI module whose routes are the tools and whose
SQLAlchemy ORM was written for SQLite. The reference system starts a fresh server process per
episode (~2 s) and reaches it through two HTTP hops; here the module is executed **once** per env
server and every tool call is one in-process ASGI request (``httpx.ASGITransport``), run on the
reset engine's thread, so that the app writes into the same episode transaction as everything else
and a reset (``ROLLBACK``) undoes it.

How the app's database access is joined to the episode, at the DBAPI level rather than per
``Session`` (``join_transaction_mode="create_savepoint"`` only covers sessions bound to a
``Connection``; generated code also uses ``Session(engine)``, ``engine.begin()`` and
``scoped_session``, and they must all behave alike):

* While the module body runs, ``sqlalchemy.create_engine`` returns one engine of ours (whatever
  URL and SQLite ``connect_args`` the code passes) and ``MetaData.create_all``/``drop_all`` do
  nothing: the schema is the bundle's DDL, loaded into the template. ``__name__`` is not
  ``"__main__"``, so the ``uvicorn.run`` block never runs.
* The engine's pool is a ``NullPool`` whose "connections" are :class:`_EpisodeConnection` facades
  over the reset engine's psycopg connection, valid for one tool call only (:class:`_CallScope`).
  A facade's transaction is a SAVEPOINT: the first statement opens it, ``commit()`` releases it,
  ``rollback()`` rolls back to it. So ``session.commit()`` in app code releases a savepoint
  inside the tool call's savepoint, and nothing the app does can end the episode transaction.
* Statements pass the same filter as the ``db`` handle of Python tools (no COMMIT, SET ROLE, ...),
  except SQLAlchemy's own ``sa_savepoint_N`` statements; SQLite ``PRAGMA`` statements (the usual
  ``foreign_keys=ON`` connect hook) are ignored. ``LIKE`` compiles to ``ILIKE``: SQLite's LIKE is
  case-insensitive and the apps (and their tasks) rely on it.

Response classes: 2xx is the result; 4xx is ``tool_error`` (the agent's request was refused);
5xx or an exception is ``tool_crashed``, except that a database constraint or data error caused
by the arguments is ``tool_error`` (as for Python tools) and a lost connection propagates so
that the reset engine voids the episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
import threading
import types
import urllib.parse
from typing import Any, Callable, Iterator

import psycopg

from awm.bundle import App, Route
from envserver.dbapi import Db, SqlForbidden, check_statement, to_json_value
from envserver.tools import ToolFailure

_SA_SAVEPOINT = re.compile(r"^\s*(SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK\s+TO\s+SAVEPOINT)\s+sa_savepoint_\d+\s*;?\s*$",
                           re.IGNORECASE)
_PRAGMA = re.compile(r"^\s*PRAGMA\b", re.IGNORECASE)
BASE_URL = "http://awm-app"


class AppLoadError(RuntimeError):
    """The app's module could not be executed or has no FastAPI instance."""


class NoCallInProgress(psycopg.InterfaceError):
    """The app touched the database outside a tool call (at import time, or from a leaked session)."""


# -- the DBAPI facade ------------------------------------------------------------------------


class _CallScope:
    """The reset engine's connection for the duration of one tool call, and the app's savepoints
    on it (a stack, because releasing or rolling back a savepoint ends the ones opened after it)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn
        self.open = True
        self.stack: list[str] = []
        self._counter = 0

    def begin(self) -> str:
        self._counter += 1
        name = f"awm_app_{self._counter}"
        self.conn.execute(f"SAVEPOINT {name}")
        self.stack.append(name)
        return name

    def end(self, name: str, commit: bool) -> None:
        if not self.open or name not in self.stack or self.conn.broken:
            return
        index = self.stack.index(name)
        if not commit:
            self.conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
        self.conn.execute(f"RELEASE SAVEPOINT {name}")
        del self.stack[index:]


class _EpisodeCursor:
    """A psycopg cursor behind the statement filter; opens the owner's savepoint lazily."""

    def __init__(self, owner: _EpisodeConnection, cursor: psycopg.Cursor) -> None:
        self._owner = owner
        self._cursor = cursor
        self._skipped = False

    def _admit(self, query: Any) -> bool:
        text = query.decode() if isinstance(query, bytes) else str(query)
        if _PRAGMA.match(text):
            self._skipped = True
            return False
        if not _SA_SAVEPOINT.match(text):
            check_statement(text)
        self._skipped = False
        self._owner._begin()
        return True

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> _EpisodeCursor:
        if self._admit(query):
            self._cursor.execute(query, params, **kwargs)
        return self

    def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> _EpisodeCursor:
        if self._admit(query):
            self._cursor.executemany(query, params_seq, **kwargs)
        return self

    @property
    def description(self) -> Any:
        return None if self._skipped else self._cursor.description

    @property
    def rowcount(self) -> int:
        return -1 if self._skipped else self._cursor.rowcount

    def fetchall(self) -> list[Any]:
        return [] if self._skipped else self._cursor.fetchall()

    def fetchone(self) -> Any:
        return None if self._skipped else self._cursor.fetchone()

    def fetchmany(self, size: int = 0) -> list[Any]:
        return [] if self._skipped else self._cursor.fetchmany(size) if size else self._cursor.fetchmany()

    def __iter__(self) -> Iterator[Any]:
        return iter(()) if self._skipped else iter(self._cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)


class _EpisodeConnection:
    """What SQLAlchemy sees as a DBAPI connection: a savepoint-scoped view of the episode's
    connection that lives for one tool call. It never commits, rolls back or closes the real one."""

    def __init__(self, scope: _CallScope) -> None:
        self._scope = scope
        self._savepoint: str | None = None

    def _live(self) -> psycopg.Connection:
        if not self._scope.open:
            raise NoCallInProgress("database handle used after its tool call ended")
        return self._scope.conn

    def _begin(self) -> None:
        self._live()
        if self._savepoint is None or self._savepoint not in self._scope.stack:
            self._savepoint = self._scope.begin()

    def cursor(self, *args: Any, **kwargs: Any) -> _EpisodeCursor:
        return _EpisodeCursor(self, self._live().cursor(*args, **kwargs))

    def commit(self) -> None:
        if self._savepoint is not None:
            self._scope.end(self._savepoint, commit=True)
            self._savepoint = None

    def rollback(self) -> None:
        if self._savepoint is not None:
            self._scope.end(self._savepoint, commit=False)
            self._savepoint = None

    def close(self) -> None:
        self.rollback()  # like a DBAPI connection: closing discards what was not committed

    # Read by SQLAlchemy's psycopg dialect; settings it would change are the episode's, not ours.
    @property
    def info(self) -> Any:
        return self._live().info

    @property
    def adapters(self) -> Any:
        return self._live().adapters

    @property
    def closed(self) -> bool:
        return not self._scope.open or self._scope.conn.closed

    @property
    def broken(self) -> bool:
        return self._scope.conn.broken

    autocommit = False
    isolation_level = None
    read_only = None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)  # autocommit, isolation_level, ...: ignored

    def add_notice_handler(self, callback: Callable[..., Any]) -> None:
        pass


# -- loading the app -------------------------------------------------------------------------


def _episode_engine(creator: Callable[[], _EpisodeConnection]) -> Any:
    """The one engine the app gets, on the episode's connection, with SQLite's LIKE semantics."""
    import sqlalchemy
    from sqlalchemy.dialects.postgresql.base import PGCompiler
    from sqlalchemy.pool import NullPool

    engine = _REAL_CREATE_ENGINE[0]("postgresql+psycopg://", creator=creator, poolclass=NullPool,
                                    use_native_hstore=False)
    base = engine.dialect.statement_compiler

    class EpisodeCompiler(base):  # type: ignore[misc, valid-type]
        def visit_like_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
            return PGCompiler.visit_ilike_op_binary(self, binary, operator, **kw)

        def visit_not_like_op_binary(self, binary: Any, operator: Any, **kw: Any) -> str:
            return PGCompiler.visit_not_ilike_op_binary(self, binary, operator, **kw)

    engine.dialect.statement_compiler = EpisodeCompiler
    assert isinstance(engine, sqlalchemy.engine.Engine)
    return engine


_REAL_CREATE_ENGINE: list[Any] = []
_LOAD_LOCK = threading.Lock()


@contextlib.contextmanager
def _patched_sqlalchemy(engine_for: Callable[[], Any]) -> Iterator[None]:
    """While the module body runs: our engine for every create_engine, no create_all/drop_all."""
    import sqlalchemy
    import sqlalchemy.engine
    import sqlalchemy.engine.create
    from sqlalchemy import MetaData

    if not _REAL_CREATE_ENGINE:
        _REAL_CREATE_ENGINE.append(sqlalchemy.engine.create.create_engine)

    def create_engine(*args: Any, **kwargs: Any) -> Any:
        return engine_for()

    def no_ddl(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    saved = [(sqlalchemy, "create_engine", sqlalchemy.create_engine),
             (sqlalchemy.engine, "create_engine", sqlalchemy.engine.create_engine),
             (sqlalchemy.engine.create, "create_engine", sqlalchemy.engine.create.create_engine),
             (MetaData, "create_all", MetaData.create_all), (MetaData, "drop_all", MetaData.drop_all)]
    previous_env = os.environ.get("DATABASE_PATH")
    try:
        for target, attribute, _ in saved[:3]:
            setattr(target, attribute, create_engine)
        MetaData.create_all = no_ddl  # type: ignore[method-assign]
        MetaData.drop_all = no_ddl  # type: ignore[method-assign]
        # The generated code reads the database location from here; nothing ever opens it.
        os.environ["DATABASE_PATH"] = "sqlite:///:memory:"
        yield
    finally:
        for target, attribute, value in saved:
            setattr(target, attribute, value)
        if previous_env is None:
            os.environ.pop("DATABASE_PATH", None)
        else:
            os.environ["DATABASE_PATH"] = previous_env


def load_app(code: str, module_name: str, engine_for: Callable[[], Any]) -> tuple[types.ModuleType, Any]:
    """Execute the app's source as a module (so Pydantic and FastAPI resolve its annotations);
    returns the module and its FastAPI instance."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    module = types.ModuleType(module_name)
    module.__file__ = f"<awm app {module_name}>"
    sys.modules[module_name] = module
    with _LOAD_LOCK, _patched_sqlalchemy(engine_for):
        try:
            exec(compile(code, module.__file__, "exec"), module.__dict__)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise AppLoadError(f"the app's code failed to load: {type(exc).__name__}: {exc}") from exc
    app = module.__dict__.get("app")
    if not isinstance(app, FastAPI):
        app = next((v for v in module.__dict__.values() if isinstance(v, FastAPI)), None)
    if app is None:
        raise AppLoadError("the app's code defines no FastAPI instance")
    for value in list(module.__dict__.values()):  # forward references between response models
        if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module_name:
            with contextlib.suppress(Exception):
                value.model_rebuild()
    return module, app


# -- calling routes --------------------------------------------------------------------------


class AppRuntime:
    """One loaded app and the calls into it; used from the reset engine's thread only."""

    def __init__(self, app_spec: App, name: str) -> None:
        self._scope: _CallScope | None = None
        self._engine: Any = None
        self.module, self.app = load_app(app_spec.code, f"awm_app_{name}", self._engine_for)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: Any = None

    def _engine_for(self) -> Any:
        if self._engine is None:
            self._engine = _episode_engine(self._connect)
        return self._engine

    def _connect(self) -> _EpisodeConnection:
        scope = self._scope
        if scope is None or not scope.open:
            raise NoCallInProgress("the app may reach the database only while a tool call runs")
        return _EpisodeConnection(scope)

    def bind(self, tool: str, route: Route, arguments: dict[str, Any]) -> Callable[[Db], Any]:
        """A callable for the reset engine's ``tool_call``, like ``ToolRuntime.bind``."""
        method, url, query, body = build_request(route, arguments)

        def call(db: Db) -> Any:
            return self._call(db._conn, tool, method, url, query, body)

        return call

    def _call(self, conn: psycopg.Connection, tool: str, method: str, url: str,
              query: list[tuple[str, Any]], body: dict[str, Any] | None) -> Any:
        import httpx

        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL,
                                             timeout=None)
        scope = self._scope = _CallScope(conn)
        try:
            response = self._loop.run_until_complete(
                self._client.request(method, url, params=query, json=body))
        except Exception as exc:  # noqa: BLE001 - untrusted code; classified below
            raise _classify_exception(tool, exc) from exc
        finally:
            if scope.stack and not conn.broken:
                # A session the app never committed nor closed: SQLite would have rolled it back
                # when the connection went back to the pool, so must we (the tool's savepoint
                # would otherwise keep its writes).
                with contextlib.suppress(psycopg.Error):
                    scope.end(scope.stack[0], commit=False)
            scope.open = False
            self._scope = None
        return _result(tool, response)

    def close(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(self._client.aclose())
            self._loop.close()
            self._loop = None


def build_request(route: Route, arguments: dict[str, Any]) -> tuple[str, str, list[tuple[str, Any]], dict[str, Any] | None]:
    """Split validated arguments into path, query and JSON body. ``None`` means "not given":
    generated update routes use ``exclude_unset``, so an explicit null would clear a field."""
    path = route.path
    query: list[tuple[str, Any]] = []
    body: dict[str, Any] = {}
    for name, value in arguments.items():
        if value is None:
            continue
        where = route.params.get(name, "body" if route.method in ("POST", "PUT", "PATCH") else "query")
        if where == "path":
            path = path.replace("{" + name + "}", urllib.parse.quote(_scalar_text(value), safe=""))
        elif where == "query":
            for item in value if isinstance(value, list) else [value]:
                query.append((name, _scalar_text(item)))
        else:
            body[name] = value
    missing = re.findall(r"{([^}]+)}", path)
    if missing:
        raise ToolFailure("invalid_arguments", f"missing path argument(s): {', '.join(missing)}")
    send_body = bool(body) or route.method in ("POST", "PUT", "PATCH") and "body" in route.params.values()
    return route.method, path, query, body if send_body else None


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _result(tool: str, response: Any) -> Any:
    status = response.status_code
    text = response.text
    try:
        payload = response.json() if text else None
    except ValueError:
        payload = text
    if status < 400:
        return to_json_value(payload)
    detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
    message = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False, default=str)
    kind = "tool_error" if status < 500 else "tool_crashed"
    raise ToolFailure(kind, f"{tool}: HTTP {status}: {message[:2000]}")


def _classify_exception(tool: str, exc: Exception) -> BaseException:
    """Map what escaped the app to a failure class (or let a lost connection through)."""
    if isinstance(exc, ToolFailure):
        return exc
    orig = getattr(exc, "orig", None)  # sqlalchemy.exc.DBAPIError wraps the psycopg error
    if isinstance(exc, SqlForbidden) or isinstance(orig, SqlForbidden):
        return ToolFailure("tool_crashed", f"{tool}: {orig or exc}")
    if isinstance(orig, psycopg.OperationalError) or isinstance(exc, psycopg.OperationalError):
        return orig if isinstance(orig, psycopg.OperationalError) else exc
    if isinstance(orig, (psycopg.errors.IntegrityError, psycopg.errors.DataError)):
        first = (orig.diag.message_primary or str(orig)).strip()
        return ToolFailure("tool_error", f"{tool}: database rejected the request: {first}")
    if isinstance(orig, psycopg.Error):
        first = (orig.diag.message_primary or str(orig)).strip()
        return ToolFailure("tool_crashed", f"{tool}: {type(orig).__name__}: {first}")
    return ToolFailure("tool_crashed", f"{tool}: {type(exc).__name__}: {str(exc)[:2000]}")
