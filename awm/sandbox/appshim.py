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
* The dialect learns the facts it asks a new connection for (server version, default schema,
  isolation level, ``standard_conforming_strings``) from :data:`FACTS` when the engine is made, not
  over the pipe: four round trips less on the first call of every episode. The ORM's mappers are
  configured at load. (Querying every mapped class once at load, against no rows, was tried: it
  took a few ms off an episode's first call and added 10-20 ms of CPU to every episode, since a
  worker serves one episode and an episode queries a few of its classes: docs/benchmarks.md.)

What costs a fresh worker time is mostly not the app but the frameworks' first use (lazy imports,
schema builders, compilers, caches): a first app loaded in a process took ~80 ms, a second one
~10 ms. :func:`warm_up` pays that once in the fork server, with an app of our own (never an
environment's code), so that every worker starts from frameworks already used
(docs/benchmarks.md, "Tool-call tail and memory per instance").
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
# A statement that changes no data (what SQLAlchemy sends to read): its transaction's rollback
# need not reach the database. Anything else counts as a change, whatever it does.
_READ = re.compile(r"^\s*SELECT\b", re.IGNORECASE)
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
        reply = self._owner.run(text, _plain(params))
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

# What SQLAlchemy's PostgreSQL dialect asks a new connection (``Dialect.initialize``), answered
# without a round trip. The instance's connection sets ``search_path=public``; every transaction
# is the server's default READ COMMITTED; ``standard_conforming_strings`` has been on since 9.1;
# the version is the one ``connection.info`` reports (:data:`SERVER_VERSION`), so the dialect
# sees one version, not two.
FACTS = {
    "select pg_catalog.version()": f"PostgreSQL {SERVER_VERSION // 10000}.{SERVER_VERSION % 10000}",
    "select current_schema()": "public",
    "show transaction isolation level": "read committed",
    "show standard_conforming_strings": "on",
}


class PipeConnection:
    """What SQLAlchemy sees as a DBAPI connection: a savepoint on the episode's connection, held by
    the server. It never commits, rolls back or closes the episode transaction.

    Round trips on the pipe are most of a call's cost, so a transaction costs as few as its
    meaning needs: its savepoint is opened by the server just before its first statement, in the
    same request (``"savepoint"``); a commit sends nothing (the savepoint stays open inside the
    tool call's own, which the server releases or rolls back when the call ends, like every
    savepoint nested in it); a rollback sends ``ROLLBACK TO SAVEPOINT`` only if the transaction
    ran something that may have changed data (a statement that is not a ``SELECT``) or failed (a
    failed statement leaves the savepoint aborted), and nothing otherwise. A read-only request of
    an app is then one round trip, not four (SAVEPOINT, SELECT, ROLLBACK TO, RELEASE)."""

    _counter = 0

    def __init__(self) -> None:
        import psycopg

        self.savepoint: str | None = None
        self._opened = False  # the server has opened self.savepoint
        self._dirty = False  # a statement since then may have changed data, or failed
        self.closed = False
        self.broken = False
        self.info = _Info(self)
        self.adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)

    def begin(self) -> None:
        if self.savepoint is None:
            PipeConnection._counter += 1
            self.savepoint = f"awm_app_{PipeConnection._counter}"
            self._opened = self._dirty = False
            _OPEN.append(self)

    def run(self, text: str, params: Any) -> dict[str, Any]:
        """One statement in this connection's transaction (begun by its first statement)."""
        self.begin()
        extra = {} if self._opened else {"savepoint": self.savepoint}
        if not _READ.match(text):
            self._dirty = True
        try:
            return channel.sql_request(text, params, fetch="tuples", **extra)
        except channel.DatabaseError as exc:
            self._dirty = True
            _raise(exc)
            raise  # not reached
        finally:
            self._opened = True  # (if the server could not open it, the rollback fails: ignored)

    def _end(self, commit: bool) -> None:
        name, self.savepoint = self.savepoint, None
        if name is None:
            return
        if self in _OPEN:
            _OPEN.remove(self)
        if not commit and self._opened and self._dirty:
            with contextlib.suppress(channel.DatabaseError):  # e.g. gone with an outer rollback
                channel.sql_request(f"ROLLBACK TO SAVEPOINT {name}", None, fetch="none")

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


class _FactsCursor(PipeCursor):
    def _send(self, query: Any, params: Any) -> None:
        text = query.decode() if isinstance(query, bytes) else str(query)
        if text.strip() not in FACTS:
            raise RuntimeError(f"not a dialect fact: {text[:80]!r}")
        self._rows, self._index, self.rowcount = [(FACTS[text.strip()],)], 0, 1
        self.description = [_Column(("fact", 25, None, None, None, None, None))]


class _FactsConnection(PipeConnection):
    """The connection the dialect is initialized on: it answers :data:`FACTS` and nothing else."""

    def begin(self) -> None:
        pass

    def _end(self, commit: bool) -> None:
        pass

    def cursor(self, *_: Any, **__: Any) -> PipeCursor:
        return _FactsCursor(self)


_initializing = False


def _connect() -> PipeConnection:
    return _FactsConnection() if _initializing else PipeConnection()


# -- loading the app -----------------------------------------------------------------------------


def _engine(create_engine: Any) -> Any:
    """The one engine the app gets, over the pipe, with SQLite's LIKE semantics."""
    from sqlalchemy.dialects.postgresql.base import PGCompiler
    from sqlalchemy.pool import NullPool

    global _initializing
    engine = create_engine("postgresql+psycopg://", creator=_connect, poolclass=NullPool,
                           use_native_hstore=False)
    _initializing = True
    try:  # the dialect's first connection: on FACTS, not over the pipe
        engine.connect().close()
    except Exception:  # noqa: BLE001 - e.g. a dialect asking something new: it asks the database then
        pass
    finally:
        _initializing = False
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
    from sqlalchemy.orm import configure_mappers

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
    # The ORM's mappers are configured on their first query; here instead, while the worker is
    # made ahead of its episode, not on the episode's first call. An app whose mappers do not
    # configure fails on that query, as it did.
    with contextlib.suppress(Exception):
        configure_mappers()
    return module, app


class AppHost:
    """One loaded app and the requests into it.

    A request is one ASGI call made here (the scope, ``receive`` and ``send`` of
    :func:`_asgi_request`), as httpx's ``ASGITransport`` makes it, without an HTTP client around
    it: httpx's request and response machinery cost about as much per call as the app itself."""

    def __init__(self, code: str, name: str) -> None:
        self.module, self.app = load_app(code, f"awm_app_{name}")

    def request(self, method: str, url: str, query: list[Any], body: Any) -> tuple[int, str]:
        assert _LOOP is not None
        try:
            return _LOOP.run_until_complete(_asgi_request(self.app, method, url, query, body))
        finally:
            # A session the app never committed nor closed: SQLite would have rolled it back when
            # the connection went back to the pool, so must we (the tool's savepoint would keep it).
            for conn in list(_OPEN):
                conn.rollback()


async def _asgi_request(app: Any, method: str, url: str, query: list[Any], body: Any) -> tuple[int, str]:
    """One HTTP request into ``app`` (an ASGI 3 application): ``url`` is the request's path
    (percent-encoded), ``query`` its parameters as (name, text) pairs, ``body`` the JSON body or
    None. Returns the status and the body as text. Exceptions of the app propagate (Starlette
    sends its 500 answer first). The scope has what httpx's ``ASGITransport`` (which this replaces)
    gave the app; no ``accept-encoding``, so a compressing middleware leaves the body as it is."""
    import json
    import urllib.parse

    data = b"" if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                                               allow_nan=False).encode()
    headers = [(b"host", BASE_URL.split("://", 1)[1].encode()), (b"accept", b"*/*"),
               (b"connection", b"keep-alive"), (b"user-agent", b"awm-appshim")]
    if body is not None:
        headers += [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]
    path, _, inline = url.partition("?")
    query_string = urllib.parse.urlencode([(k, "" if v is None else v) for k, v in query]).encode()
    if inline:
        query_string = inline.encode() + (b"&" + query_string if query_string else b"")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "headers": headers, "scheme": "http", "path": urllib.parse.unquote(path), "raw_path": path.encode(),
             "query_string": query_string, "server": (BASE_URL.split("://", 1)[1], None),
             "client": ("127.0.0.1", 123), "root_path": ""}
    status: int | None = None
    parts: list[bytes] = []
    sent = False
    complete = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await complete.wait()
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": data, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = int(message["status"])
        elif message["type"] == "http.response.body":
            if message.get("body") and method != "HEAD":
                parts.append(bytes(message["body"]))
            if not message.get("more_body", False):
                complete.set()

    await app(scope, receive, send)
    if status is None:
        raise RuntimeError("the app sent no response")
    return status, b"".join(parts).decode("utf-8", errors="replace")


# -- warming the frameworks up in the fork server ----------------------------------------------

# An app of our own in the style of the generated ones (declarative models of the common column
# types, a relationship, Pydantic v2 models, routes with path, query and body parameters, a
# dependency, sync and async handlers, errors), run once in the fork server so that the
# frameworks' first-use work is done there. It is this project's code, the same for every
# environment: the fork server never runs an environment's code.
_WARM_APP = r'''
import enum
from datetime import date, datetime
from decimal import Decimal
from typing import List, Optional

from fastapi import Body, Depends, FastAPI, HTTPException, Path, Query, status
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import (JSON, Boolean, Column, Date, DateTime, Enum, Float, ForeignKey, Integer, Numeric, String,
                        Text, UniqueConstraint, and_, create_engine, func, or_)
from sqlalchemy.orm import Session, declarative_base, joinedload, relationship, sessionmaker

engine = create_engine("sqlite:///warm.db", connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(autocommit=False, autoflush=False, bind=engine)
Base = declarative_base()


class Kind(str, enum.Enum):
    open = "open"
    closed = "closed"


class Owner(Base):
    __tablename__ = "owners"
    id = Column(Integer, primary_key=True, autoincrement=True)
    email = Column(String(255), unique=True, nullable=False)
    items = relationship("Item", back_populates="owner")


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (UniqueConstraint("name", "owner_id"),)
    id = Column(Integer, primary_key=True, autoincrement=True)
    name = Column(String(100), nullable=False, index=True)
    notes = Column(Text)
    price = Column(Numeric(10, 2))
    weight = Column(Float, default=0.0)
    active = Column(Boolean, default=True)
    status = Column(Enum(Kind), default=Kind.open)
    tags = Column(JSON)
    due_date = Column(Date)
    created_at = Column(DateTime, default=datetime.utcnow)
    owner_id = Column(Integer, ForeignKey("owners.id"))
    owner = relationship("Owner", back_populates="items")


Base.metadata.create_all(bind=engine)
app = FastAPI(title="warm-up")


def get_db():
    db = SessionLocal()
    try:
        yield db
    finally:
        db.close()


class ItemIn(BaseModel):
    name: str = Field(..., min_length=1, max_length=100, description="Name.")
    notes: Optional[str] = None
    price: Optional[Decimal] = Field(None, ge=0)
    weight: float = 0.0
    status: Kind = Kind.open
    tags: Optional[dict] = None
    due_date: Optional[date] = None
    owner_id: Optional[int] = None

    @field_validator("name")
    @classmethod
    def strip(cls, value: str) -> str:
        return value.strip()


class ItemOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    notes: Optional[str] = None
    price: Optional[Decimal] = None
    weight: Optional[float] = None
    active: Optional[bool] = None
    status: Optional[Kind] = None
    tags: Optional[dict] = None
    due_date: Optional[date] = None
    created_at: Optional[datetime] = None
    owner_id: Optional[int] = None


class Page(BaseModel):
    total: int
    items: List[ItemOut]


@app.get("/items", response_model=Page, operation_id="list_items")
def list_items(q: Optional[str] = Query(None), active: Optional[bool] = Query(None),
               limit: int = Query(10, ge=1, le=100), db: Session = Depends(get_db)):
    query = db.query(Item).options(joinedload(Item.owner))
    if q:
        query = query.filter(or_(Item.name.like(f"%{q}%"), Item.notes.like(f"%{q}%")))
    if active is not None:
        query = query.filter(and_(Item.active == active, Item.weight >= 0))
    total = db.query(func.count(Item.id)).scalar() or 0
    return {"total": total, "items": query.order_by(Item.created_at.desc()).limit(limit).all()}


@app.get("/items/{item_id}", response_model=ItemOut, operation_id="get_item")
async def get_item(item_id: int = Path(..., ge=1)):
    db = SessionLocal()
    try:
        item = db.query(Item).filter(Item.id == item_id).first()
        if item is None:
            raise HTTPException(status_code=404, detail="Item not found")
        return item
    finally:
        db.close()


@app.post("/items", response_model=ItemOut, status_code=status.HTTP_201_CREATED, operation_id="create_item")
def create_item(body: ItemIn = Body(...), db: Session = Depends(get_db)):
    item = Item(**body.model_dump())
    db.add(item)
    db.commit()
    db.refresh(item)
    return item


@app.put("/items/{item_id}", response_model=ItemOut, operation_id="update_item")
async def update_item(item_id: int, name: Optional[str] = Body(None, embed=True), db: Session = Depends(get_db)):
    item = db.get(Item, item_id)
    if item is None:
        raise HTTPException(status_code=404, detail="Item not found")
    if name is not None:
        item.name = name
    db.commit()
    db.refresh(item)
    return item


@app.delete("/items/{item_id}", operation_id="delete_item")
def delete_item(item_id: int, db: Session = Depends(get_db)):
    item = db.query(Item).filter_by(id=item_id).one_or_none()
    if item is None:
        raise HTTPException(status_code=404, detail="Item not found")
    db.delete(item)
    db.commit()
    return {"deleted": item_id}
'''

_WARM_REQUESTS: list[tuple[str, str, list[Any], Any]] = [
    ("GET", "/items", [("q", "a"), ("active", "true"), ("limit", "5")], None),
    ("GET", "/items/1", [], None),
    ("POST", "/items", [], {"name": " x ", "price": 1.5, "tags": {"a": 1}, "due_date": "2025-01-02",
                            "status": "open", "owner_id": 1}),
    ("PUT", "/items/1", [], {"name": "y"}),
    ("DELETE", "/items/1", [], None),
    ("GET", "/items/0", [], None),  # a validation error
    ("POST", "/items", [], {"name": ""}),  # another
]


class _WarmChannel:
    """The warm-up's database: answers the warm-up app's statements in the fork server, which has
    no connection. A row for a ``SELECT`` has a value per column of its select list."""

    def __init__(self) -> None:
        import datetime as dt
        from decimal import Decimal

        # column -> (value, type OID as Postgres describes it)
        self.values = {"id": (1, 23), "email": ("a@example.com", 25), "name": ("warm", 25), "notes": ("n", 25),
                       "price": (Decimal("1.50"), 1700), "weight": (0.5, 701), "active": (True, 16),
                       "status": ("open", 25), "tags": ({"a": 1}, 114), "due_date": (dt.date(2025, 1, 2), 1082),
                       "created_at": (dt.datetime(2025, 1, 1), 1114), "owner_id": (1, 23)}

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        text = str(message.get("sql") or "")
        if text.lstrip()[:6].upper() == "SELECT":
            columns = re.findall(r"(\w+)\.(\w+)(?:\s+AS\s+(\w+))?", text.split(" FROM ", 1)[0])
            if not columns:
                return {"rows": [[1]], "columns": [["value", 20]], "rowcount": 1}
            found = [self.values.get(column, (1, 23)) for _, column, _ in columns]
            return {"rows": [[value for value, _ in found]],
                    "columns": [[label or column, oid] for (_, column, label), (_, oid) in zip(columns, found)],
                    "rowcount": 1}
        if " RETURNING " in text.upper():
            return {"rows": [[1]], "columns": [["id", 23]], "rowcount": 1}
        return {"rows": None, "columns": None, "rowcount": 1}


def warm_up() -> list[int]:
    """Run :data:`_WARM_APP` once in this process (the fork server, before any child exists): load
    it as an environment's app is loaded and send it requests, answered by :class:`_WarmChannel`.
    What stays is what the frameworks keep after a first use (imported submodules, built schema
    and serializer machinery, the dialect's compilers); the app itself is dropped, and the event
    loop it ran on is closed (a child makes its own: :func:`make_loop`). Returns the requests'
    statuses (a test checks them against the installed frameworks). Best effort: a failure here
    costs only speed."""
    global _LOOP
    import gc
    import warnings

    saved = channel.CHANNEL
    channel.CHANNEL = _WarmChannel()  # type: ignore[assignment]
    make_loop()
    assert _LOOP is not None
    statuses: list[int] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            host = AppHost(_WARM_APP, "awm_warm_up")
            for method, url, query, body in _WARM_REQUESTS:
                statuses.append(host.request(method, url, query, body)[0])
    except Exception:  # noqa: BLE001
        pass
    finally:
        channel.CHANNEL = saved
        sys.modules.pop("awm_app_awm_warm_up", None)
        _OPEN.clear()
        PipeConnection._counter = 0
        _LOOP.close()
        asyncio.set_event_loop(None)
        _LOOP = None
        host = None  # noqa: F841 - dropped before the collection
        gc.collect()
    return statuses


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
