"""An AWM-style app in a real worker: what its fork server prepares (the frameworks warmed up with
an app of ours, never an environment's), what a request into it costs in round trips on the pipe,
and that its transactions keep their meaning (a commit stays, a rollback undoes, a failed statement
does not poison the call) on the real episode transaction.

Every process is real: the fork server and its confined worker, the server side of the pipe
(``EpisodeDatabase.run_code``: the guard, the tool's savepoint) and the session's Postgres.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx
import pytest

from awm.envserver.reset import EpisodeDatabase
from awm.postgres import provision
from awm.sandbox import appshim
from awm.sandbox.pool import WorkerPool, WorkerSpec

APP = r'''
from typing import Optional

from fastapi import Body, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import BigInteger, Boolean, Column, ForeignKey, String, create_engine, text
from sqlalchemy.orm import declarative_base, sessionmaker

engine = create_engine("sqlite:///notes.db", connect_args={"check_same_thread": False})
SessionLocal = sessionmaker(autocommit=False, autoflush=False, bind=engine)
Base = declarative_base()


class User(Base):
    __tablename__ = "users"
    id = Column(BigInteger, primary_key=True)
    name = Column(String, nullable=False)


class Note(Base):
    __tablename__ = "notes"
    id = Column(BigInteger, primary_key=True, autoincrement=True)
    user_id = Column(BigInteger, ForeignKey("users.id"), nullable=False)
    title = Column(String, nullable=False)
    body = Column(String, nullable=False, default="")
    archived = Column(Boolean, nullable=False, default=False)


app = FastAPI()


class NoteOut(BaseModel):
    id: int
    title: str


@app.get("/notes/{note_id}", response_model=NoteOut)
def get_note(note_id: int):
    db = SessionLocal()
    try:
        note = db.query(Note).filter(Note.id == note_id).first()
        if note is None:
            raise HTTPException(status_code=404, detail="no such note")
        return NoteOut(id=note.id, title=note.title)
    finally:
        db.close()


@app.post("/notes", response_model=NoteOut)
def add_note(title: str = Body(..., embed=True)):
    db = SessionLocal()
    try:
        note = Note(user_id=1, title=title)
        db.add(note)
        db.commit()
        db.refresh(note)
        return NoteOut(id=note.id, title=note.title)
    finally:
        db.close()


@app.post("/notes/refused")
def add_then_refuse(title: str = Body(..., embed=True)):
    db = SessionLocal()
    try:
        db.add(Note(user_id=1, title=title))
        db.flush()  # written, then the request is refused: the session is closed uncommitted
        raise HTTPException(status_code=409, detail="refused")
    finally:
        db.close()


@app.post("/notes/after-error", response_model=NoteOut)
def add_after_error(title: str = Body(..., embed=True)):
    db = SessionLocal()
    try:
        try:
            db.execute(text("SELECT 1 / 0"))
        except Exception:
            db.rollback()  # the app recovers from its failed statement and goes on
        note = Note(user_id=1, title=title)
        db.add(note)
        db.commit()
        db.refresh(note)
        return NoteOut(id=note.id, title=note.title)
    finally:
        db.close()
'''


class RecordingPool(WorkerPool):
    """A worker pool that keeps every request its worker sends to the server during a call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[dict[str, Any]] = []

    def run(self, message, handle, timeout_s):  # type: ignore[no-untyped-def]
        def recording(request: dict[str, Any]) -> dict[str, Any]:
            self.requests.append(dict(request))
            return handle(request)
        self.requests = []
        return super().run(message, recording, timeout_s)


@pytest.fixture(scope="module")
def pool() -> Iterator[RecordingPool]:
    workers = RecordingPool(WorkerSpec(load={"prelude": "", "tools": [], "app": {"code": APP, "name": "notes_app"}}))
    workers.start()
    yield workers
    workers.close()


@pytest.fixture
def episode(admin_dsn, notes_bundle) -> Iterator[EpisodeDatabase]:
    template = provision.ensure_template(admin_dsn, notes_bundle)
    instance = provision.create_instance(admin_dsn, template, "awm_i_app_worker")
    db = EpisodeDatabase(instance.dsn)
    db.connect()
    db.reset(verify=True)
    yield db
    db.close()
    provision.drop_instance(admin_dsn, instance.dbname)


def _call(db: EpisodeDatabase, pool: WorkerPool, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    message = {"op": "call", "tool": "t", "request": {"method": method, "url": url, "query": [], "body": body}}
    reply, state = db.run_code(pool, message, 10, writes=True)
    assert reply.get("op") == "result", reply
    assert not state.get("rolled_back"), state
    return reply["status"], json.loads(reply["body"])


def _titles(db: EpisodeDatabase) -> list[str]:
    assert db.conn is not None
    return [r[0] for r in db.conn.execute("SELECT title FROM notes WHERE user_id = 1 ORDER BY id").fetchall()]


def test_a_read_is_one_round_trip_and_the_dialect_asks_the_database_nothing(episode, pool):
    """The worker's first request of an episode: its app's engine was initialized on the dialect's
    facts, not over the pipe; the transaction's savepoint travels with its first statement; a
    transaction that only read ends without a statement."""
    pool.renew()  # the next call on a worker that has served nothing
    status, body = _call(episode, pool, "GET", "/notes/1")
    assert status == 200 and body["id"] == 1
    assert [r["op"] for r in pool.requests] == ["sql"], pool.requests
    (read,) = pool.requests
    assert read["sql"].lstrip().upper().startswith("SELECT") and read["savepoint"].startswith("awm_app_")
    status, _ = _call(episode, pool, "GET", "/notes/999999")
    assert status == 404 and len(pool.requests) == 1


def test_app_transactions_keep_their_meaning_on_the_episode_transaction(episode, pool):
    before = _titles(episode)
    # A commit stays, and costs no statement of its own (no RELEASE).
    status, body = _call(episode, pool, "POST", "/notes", {"title": "kept"})
    assert status == 200 and body["title"] == "kept"
    sent = [r["sql"].split()[0].upper() for r in pool.requests]
    assert "RELEASE" not in sent and "SAVEPOINT" not in sent, sent
    assert _titles(episode) == before + ["kept"]
    # Written, then refused uncommitted: undone (the rollback reaches the database).
    status, _ = _call(episode, pool, "POST", "/notes/refused", {"title": "undone"})
    assert status == 409
    assert [r["sql"].split()[:3] for r in pool.requests][-1] == ["ROLLBACK", "TO", "SAVEPOINT"]
    assert _titles(episode) == before + ["kept"]
    # A failed statement, recovered by the app's rollback: the rest of the call still writes.
    status, body = _call(episode, pool, "POST", "/notes/after-error", {"title": "after"})
    assert status == 200 and body["title"] == "after"
    assert _titles(episode) == before + ["kept", "after"]
    # All of it is the episode's: the next reset leaves the snapshot.
    episode.reset()
    assert _titles(episode) == before


def test_a_savepoint_named_by_a_worker_must_be_an_app_savepoint(episode, pool):
    """The ``savepoint`` of a request is the facade's own name or nothing: the server refuses any
    other text (it is put into SQL)."""
    handled: list[dict[str, Any]] = []

    class Hostile(WorkerPool):
        def run(self, message, handle, timeout_s):  # type: ignore[no-untyped-def]
            for name in ("awm_app_1; DROP TABLE notes", "sa_savepoint_1", "x", 7):
                handled.append(handle({"op": "sql", "sql": "SELECT 1 AS one", "params": None, "fetch": "tuples",
                                       "savepoint": name}))
            handled.append(handle({"op": "sql", "sql": "SELECT 1 AS one", "params": None, "fetch": "tuples",
                                   "savepoint": "awm_app_77"}))
            return {"op": "result", "value": None}

    hostile = Hostile(WorkerSpec())
    try:
        episode.run_code(hostile, {"op": "call", "tool": "t", "arguments": {}}, 10, writes=True)
    finally:
        hostile.close()
    assert [h.get("error", {}).get("kind") for h in handled[:4]] == ["forbidden"] * 4
    assert [list(row) for row in handled[4]["rows"]] == [[1]]
    assert _titles(episode) == ["todo", "ideas", "books"]  # nothing else ran


def test_the_fork_server_warm_up_runs_our_app_and_leaves_nothing_running():
    """The warm-up's app (ours, never an environment's) answers every request as the installed
    FastAPI, Pydantic and SQLAlchemy should; afterwards no loop, thread, channel or module of it is
    left for a child to inherit."""
    script = (
        "import json, sys, threading\n"
        "from awm.sandbox import appshim, channel\n"
        "appshim.import_frameworks()\n"
        "statuses = appshim.warm_up()\n"
        "print(json.dumps({'statuses': statuses, 'loop': appshim._LOOP is not None,\n"
        "    'threads': threading.active_count(), 'channel': channel.CHANNEL is not None,\n"
        "    'apps': [m for m in sys.modules if m.startswith('awm_app_')], 'open': len(appshim._OPEN),\n"
        "    'counter': appshim.PipeConnection._counter}))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    state = json.loads(out.stdout.strip().splitlines()[-1])
    assert state == {"statuses": [200, 200, 201, 200, 200, 422, 422], "loop": False, "threads": 1,
                     "channel": False, "apps": [], "open": 0, "counter": 0}


def test_loading_an_app_sends_nothing_to_the_server():
    """What a load prepares (the dialect's facts, the mappers) needs no statement: a worker is
    made ahead of its episode, before any server is listening."""
    from awm.sandbox import channel

    class Refuse:
        def request(self, message: dict[str, Any]) -> dict[str, Any]:
            raise AssertionError(f"sent while loading: {message}")

    saved, channel.CHANNEL = channel.CHANNEL, Refuse()  # type: ignore[assignment]
    try:
        module, app = appshim.load_app(APP, "awm_app_load_test")
    finally:
        channel.CHANNEL = saved
        sys.modules.pop("awm_app_load_test", None)
    assert app.title == "FastAPI" and module.Note.__tablename__ == "notes"


def test_a_request_into_the_app_is_what_httpx_would_have_sent():
    """The worker calls its app directly (no HTTP client): path, query, body, status and text are
    what httpx's ASGI transport gave the app and read from it."""
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.responses import PlainTextResponse, StreamingResponse

    app = FastAPI()

    @app.api_route("/echo/{name}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def echo(name: str, request: Request) -> dict[str, Any]:
        return {"name": name, "path": request.url.path, "query": list(request.query_params.multi_items()),
                "body": (await request.body()).decode(), "type": request.headers.get("content-type"),
                "method": request.method}

    @app.get("/text")
    def plain() -> PlainTextResponse:
        return PlainTextResponse("héllo", status_code=418)

    @app.get("/stream")
    def stream() -> StreamingResponse:
        return StreamingResponse(iter([b"a", b"b", b"c"]))

    cases = [("GET", "/echo/a%20b%2Fc", [("q", "x y"), ("q", "z&w"), ("n", "1")], None),
             ("POST", "/echo/p", [], {"title": "é ✓", "n": [1, 2], "none": None}),
             ("PUT", "/echo/p", [("flag", "true")], {}),
             ("DELETE", "/echo/d", [], None),
             ("GET", "/text", [], None), ("GET", "/stream", [], None), ("GET", "/missing", [], None),
             ("POST", "/echo/p?inline=1", [("q", "2")], {"a": 1})]
    loop = asyncio.new_event_loop()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=appshim.BASE_URL)
    try:
        for method, url, query, body in cases:
            ours = loop.run_until_complete(appshim._asgi_request(app, method, url, query, body))
            theirs = loop.run_until_complete(client.request(method, url, params=query, json=body))
            assert ours == (theirs.status_code, theirs.text), (method, url)
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


def test_what_a_worker_loaded_is_out_of_the_collectors_sight():
    """A worker freezes its heap once its code is loaded: the cyclic collector never walks the
    app's modules, models and routes again during the episode's calls."""
    frozen = WorkerPool(WorkerSpec(load={"prelude": "", "tools": [
        {"name": "frozen", "code": "def frozen(db):\n    import gc\n    return gc.get_freeze_count()"}]}))
    try:
        assert frozen.run({"op": "call", "tool": "frozen", "arguments": {}}, lambda m: {}, 10)["value"] > 1000
    finally:
        frozen.close()


# -- a local fleet's template of app fork servers -------------------------------------------------


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found |= {int(p) for p in f.read().split()}
        except OSError:
            pass
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def library(admin_dsn, tmp_path_factory):
    import datetime as dt
    from pathlib import Path

    from awm import catalog
    from awm.importers.awm1k import import_awm_dir

    out = tmp_path_factory.mktemp("awm1k-template")
    fixture = Path(__file__).with_name("fixtures") / "awm1k"
    import_awm_dir(fixture, out, admin_dsn=admin_dsn, now=dt.datetime(2025, 6, 1), envs=["library_loans_1"])
    return catalog.load(out)


async def test_a_fleets_app_fork_servers_are_forked_by_its_template_and_end_with_their_server(library, admin_dsn):
    """Two instances of an app environment: their fork servers are the template's children (not
    their env servers'), each serves its instance's calls, and one whose env server dies exits
    (the restarted server gets a new one)."""
    import asyncio

    from awm.client import ControlClient, McpSession
    from awm.fleet import Database, LocalFleet

    async with LocalFleet(library, instances=2, database=Database(admin_dsn), allow_ungated=True) as fleet:
        template = fleet._template
        assert template is not None and template.poll() is None
        for handle in fleet.instances:
            control = ControlClient(handle.control_url)
            async with McpSession(handle.mcp_url) as mcp:
                await control.reset("task_0")
                found = await mcp.call_tool("search_books", {"query": "dune"})
                assert not found.is_error and [b["title"] for b in found.structured["books"]] == ["Dune"]
            await control.close()
        zygotes = _children(template.pid)
        assert len(zygotes) == 2, zygotes
        assert all(not (_children(h.pid) & zygotes) for h in fleet.instances)
        assert all(_children(z) for z in zygotes)  # each forks its instance's workers
        victim = fleet.instances[0]
        before = _children(template.pid)
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while all(_alive(z) for z in before):  # (the template's children are reaped by the kernel)
            assert time.monotonic() < deadline, "the dead server's fork server still runs"
            await asyncio.sleep(0.05)
        while victim.restarts == 0 or len(_children(template.pid)) < 2:
            assert time.monotonic() < deadline, "the restarted server has no fork server"
            await asyncio.sleep(0.05)
    assert template.poll() is not None  # stopped with the fleet


def test_a_fork_server_starts_on_its_own_when_the_template_is_unreachable(monkeypatch, tmp_path):
    from awm.sandbox.forkserver import TEMPLATE_ENV
    from awm.sandbox.pool import make_zygote

    monkeypatch.setenv(TEMPLATE_ENV, str(tmp_path / "nobody.sock"))
    pool = WorkerPool(WorkerSpec(load={"prelude": "", "tools": [], "app": {"code": APP, "name": "notes_app"}}),
                      zygote=make_zygote(True))
    try:
        pool.start()
        assert pool.zygote.pid() in _children(os.getpid())  # started here, as without a fleet
    finally:
        pool.close()
        pool.zygote.close()


def _environment_zygote(fleet) -> int:
    """The one instance's environment zygote (its workers' parent): the child of its zygote, which
    the fleet's template forked."""
    zygote = next(iter(_children(fleet._template.pid)))
    (env,) = _children(zygote)
    return env


async def test_without_a_spare_an_instance_holds_one_tool_worker_and_still_serves_every_episode(library, admin_dsn):
    """``spare_workers=0`` (``awm openenv serve --spare-workers 0``): an app instance keeps one
    tool worker and its verifier's, not two tool workers; each episode still gets a fresh worker
    (forked after the reset's answer) and its calls are answered."""
    import asyncio

    from awm.client import ControlClient, McpSession
    from awm.fleet import Database, LocalFleet

    counts = {}
    for spares in (1, 0):
        async with LocalFleet(library, instances=1, database=Database(admin_dsn), allow_ungated=True,
                              spare_workers=spares) as fleet:
            handle = fleet.instances[0]
            control = ControlClient(handle.control_url)
            seen: set[int] = set()
            for _ in range(3):
                await control.reset("task_0")
                async with McpSession(handle.mcp_url) as mcp:
                    found = await mcp.call_tool("search_books", {"query": "dune"})
                    assert not found.is_error and [b["title"] for b in found.structured["books"]] == ["Dune"]
                    pid = await mcp.call_tool("search_books", {"query": "dune"})
                    assert not pid.is_error
                seen |= _children(_environment_zygote(fleet))
            await control.close()
            zygote = _environment_zygote(fleet)
            expected = 3 if spares else 2  # tool worker + spare + verifier's, against tool worker + verifier's
            deadline = time.monotonic() + 20  # (a replacement may still be forking: the count settles)
            while len(_children(zygote)) != expected and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            counts[spares] = len(_children(zygote))
            assert len(seen) >= 3  # fresh workers came and went over the three episodes
    assert counts == {1: 3, 0: 2}, counts
