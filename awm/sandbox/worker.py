"""The worker process: where untrusted code (tools, verifiers, imported apps) runs.

Forked by the fork server (:mod:`awm.sandbox.forkserver`) of an env server, whose environment is
empty. Before it runs any untrusted code it confines itself (:mod:`awm.sandbox.confine`): rlimits,
Landlock, seccomp, inside the fork server's namespaces. It holds no database connection and no
credential: every SQL statement becomes a request on its pipe, which the server runs inside the
episode's savepoint (and refuses if it would escape it).

Protocol (one JSON object per line, :mod:`awm.sandbox.codec`) on two private pipes; descriptors 0,
1 and 2 are ``/dev/null`` so that ``print`` reaches nobody.

* worker → server ``ready`` once, with the confinement report and how loading its code (tool
  prelude, tools, optional app: handed over by the fork server) went: ``loaded`` | ``failed``.
  Nothing is loaded when the confinement is weaker than the server accepts.
* server → worker ``call`` → any number of ``sql`` requests (each answered) → ``result`` | ``failed``.
* server → worker ``verify`` → any number of ``query`` requests → ``done`` | ``failed``.

Everything the worker sends is untrusted input to the server, which validates it and keeps its
own clock; a worker that breaks the protocol, dies or runs late is killed and replaced.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from typing import Any, Callable

from awm.sandbox import codec, confine

# Generated code imports what it needs from the standard library when it runs (Landlock leaves the
# standard library readable); nothing is imported ahead for it, which keeps each worker small.
import inspect
import sqlite3
import urllib.parse

from awm.sandbox import channel
from awm.sandbox.channel import MAX_REASON, DatabaseError, ToolError, VerifierQueryError, load_sources, sql_request

__all__ = ["DatabaseError", "MAX_REASON", "ToolError", "VerifierQueryError", "load_sources", "sql_request"]


# Code objects compiled by the fork server before it forks (compiling runs nothing): a worker
# forked for an episode finds its tools here instead of compiling ~1,000 lines each time.
COMPILED: dict[tuple[str, str], Any] = {}
SECCOMP_PROGRAM: confine.SeccompProgram | None = None  # the filter, built once by the fork server


def compiled(source: str, filename: str) -> Any:
    code = COMPILED.get((source, filename))
    return code if code is not None else compile(source, filename, "exec")


class _Rows:
    """``one`` and ``scalar`` on top of a ``query`` that returns a list of row dicts."""

    def query(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    def one(self, sql: str, *params: Any) -> dict[str, Any] | None:
        rows = self.query(sql, *params)
        return rows[0] if rows else None

    def scalar(self, sql: str, *params: Any) -> Any:
        row = self.one(sql, *params)
        return next(iter(row.values())) if row else None


class Db(_Rows):
    """The ``db`` a Python tool receives: ``%s`` placeholders, one statement per call."""

    def query(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        return sql_request(sql, list(params), fetch="dicts")["rows"]

    def execute(self, sql: str, *params: Any) -> int:
        """Run a write; returns the number of rows affected."""
        return int(sql_request(sql, list(params), fetch="none")["rowcount"])


class ReadOnlyDb(_Rows):
    """The ``final`` / ``initial`` a verifier receives: read-only queries, never writes."""

    def __init__(self, name: str) -> None:
        self._name = name

    def query(self, sql: str, *params: Any) -> list[dict[str, Any]]:
        assert channel.CHANNEL is not None
        reply = channel.CHANNEL.request({"op": "query", "db": self._name, "sql": sql, "params": list(params)})
        error = reply.get("error")
        if error:
            message = error.get("message", error) if isinstance(error, dict) else error
            raise VerifierQueryError(str(message), "query")
        return reply["rows"]


# -- AWM-style verifiers: SQLite databases handed over as bytes, opened in memory ----------------

_SQLITE_IMAGES: dict[str, bytes] = {}  # the verification's fictional paths -> database bytes
_REAL_SQLITE_CONNECT = sqlite3.connect
SQLITE_PATHS = {"initial": "/awm/verify/initial.db", "final": "/awm/verify/final.db"}


def _sqlite_connect(database: Any, *args: Any, **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect`` for verifiers: the episode's databases open in memory, read-only."""
    uri = bool(kwargs.pop("uri", False))
    name = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else None
    if name is not None and uri and name.startswith("file:"):
        name = urllib.parse.unquote(urllib.parse.urlsplit(name).path)
    image = _SQLITE_IMAGES.get(name or "")
    if image is None:
        # Anything else is an ordinary connect; Landlock refuses every real file.
        return _REAL_SQLITE_CONNECT(database, *args, uri=uri, **kwargs)
    conn = _REAL_SQLITE_CONNECT(":memory:", *args, **kwargs)
    conn.deserialize(image)
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    return conn


sqlite3.connect = _sqlite_connect  # type: ignore[assignment]
sqlite3.dbapi2.connect = _sqlite_connect  # type: ignore[assignment]


def _call_awm(fn: Callable[..., Any], answer: Any) -> Any:
    """Call an AWM verifier the way the reference does: by parameter name when it uses the
    conventional names, else positionally (initial, final, answer)."""
    values = {"initial_db_path": SQLITE_PATHS["initial"], "final_db_path": SQLITE_PATHS["final"],
              "final_answer": answer}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    named = {k: v for k, v in values.items() if k in params}
    if named:
        return fn(**named)
    kinds = [p.kind for p in params.values()]
    count = 3 if not kinds or inspect.Parameter.VAR_POSITIONAL in kinds else sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    return fn(*[SQLITE_PATHS["initial"], SQLITE_PATHS["final"], answer][:count])


def _normalise(result: Any) -> tuple[bool, str]:
    if isinstance(result, bool):
        return result, "verifier returned " + str(result)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        return result[0], str(result[1])
    if isinstance(result, dict):
        if isinstance(result.get("complete"), bool):
            return result["complete"], str(result.get("reason", ""))
        if "result" in result:  # the AWM code-mode convention: {"result": "complete" | "others"}
            return result["result"] == "complete", str(result.get("reason", result["result"]))
    raise TypeError(f"verifier returned {type(result).__name__}, expected bool, (bool, reason) or dict")


# -- the loop ------------------------------------------------------------------------------------


def _failure(exc: BaseException) -> dict[str, Any]:
    shim = sys.modules.get("awm.sandbox.appshim")
    classified = shim.classify(exc) if shim is not None else None
    if classified is not None:
        return classified
    if isinstance(exc, ToolError):
        return {"op": "failed", "kind": "tool_error", "reason": (str(exc) or type(exc).__name__)[:MAX_REASON]}
    if isinstance(exc, DatabaseError):
        return {"op": "failed", "kind": exc.kind, "reason": str(exc)[:MAX_REASON], "sqlstate": exc.sqlstate}
    if isinstance(exc, MemoryError):
        return {"op": "failed", "kind": "memory", "reason": "ran out of its memory limit"}
    if isinstance(exc, RecursionError):
        return {"op": "failed", "kind": "exception", "reason": "RecursionError: maximum recursion depth exceeded"}
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"op": "failed", "kind": "exception", "reason": line[:MAX_REASON]}


class Worker:
    def __init__(self, pipe: channel.Channel) -> None:
        self.channel = pipe
        self.tools: dict[str, Callable[..., Any]] = {}
        self.app: Any = None
        self.verifiers: dict[str, dict[str, Any]] = {}

    def load(self, message: dict[str, Any]) -> dict[str, Any]:
        namespace: dict[str, Any] = {"ToolError": ToolError, "__name__": "awm_tools"}
        exec(compiled(message.get("prelude") or "", "<tool prelude>"), namespace)
        for tool in message.get("tools") or []:
            try:
                exec(compiled(tool["code"], f"<tool {tool['name']}>"), namespace)
            except Exception as exc:  # the load error names the tool, for the repair prompt
                raise RuntimeError(f"tool {tool['name']}: {type(exc).__name__}: {exc}") from None
            fn = namespace.get(tool["name"])
            if not callable(fn):
                raise ValueError(f"tool {tool['name']!r}: its code does not define {tool['name']}()")
            self.tools[tool["name"]] = fn
        app = message.get("app")
        if app:
            from awm.sandbox import appshim

            self.app = appshim.AppHost(app["code"], app["name"])
        return {"op": "loaded"}

    def call(self, message: dict[str, Any]) -> dict[str, Any]:
        request = message.get("request")
        if request is not None:
            if self.app is None:
                raise RuntimeError("this worker has no app loaded")
            status, body = self.app.request(request["method"], request["url"], request.get("query") or [],
                                            request.get("body"))
            return {"op": "result", "status": status, "body": body}
        fn = self.tools[message["tool"]]
        return {"op": "result", "value": fn(Db(), **(message.get("arguments") or {}))}

    def verify(self, message: dict[str, Any]) -> dict[str, Any]:
        code = message["code"]
        namespace = self.verifiers.get(code)
        if namespace is None:
            namespace = {"__name__": "verifier", "sqlite3": sqlite3, "json": json}
            exec(compile(code, "<verifier>", "exec"), namespace)
            self.verifiers[code] = namespace
        fn = namespace[message["entrypoint"]]
        files = message.get("files")
        _SQLITE_IMAGES.clear()
        try:
            if files:
                for key, path in SQLITE_PATHS.items():
                    _SQLITE_IMAGES[path] = files[key]
                result = _call_awm(fn, message.get("answer"))
            else:
                result = fn(ReadOnlyDb("final"), ReadOnlyDb("initial"), message.get("answer"))
        finally:
            _SQLITE_IMAGES.clear()
        if message.get("evidence"):
            return {"op": "done", "evidence": result}
        complete, reason = _normalise(result)
        return {"op": "done", "complete": complete, "reason": reason[:MAX_REASON]}

    def serve(self) -> None:
        handlers = {"call": self.call, "verify": self.verify}
        while True:
            message = self.channel.receive()
            if message is None:
                return
            handler = handlers.get(str(message.get("op")))
            try:
                if handler is None:
                    raise ValueError(f"unknown request {message.get('op')!r}")
                reply = handler(message)
            except BaseException as exc:  # noqa: BLE001 - every failure of untrusted code is reported
                reply = _failure(exc)
            try:
                self.channel.send(reply)
            except (TypeError, ValueError, RecursionError) as exc:  # a result that cannot be encoded
                self.channel.send({"op": "failed", "kind": "exception",
                                   "reason": f"result is not JSON-serialisable: {exc}"[:MAX_REASON]})


def serve_child(config: dict[str, Any], reader: Any, writer: Any, namespaces: confine.Report) -> None:
    """A worker forked by the fork server: confine, load its code, say ready, then serve.

    Descriptors 0-2 are already ``/dev/null`` and the environment is empty (the fork server's).
    Loading here, before the first message, spares every spawn a round trip and the code's
    encoding; the server learns both the confinement and the load from the one ``ready``."""
    if config.get("app"):
        from awm.sandbox import appshim

        appshim.make_loop()
    layers = tuple(config.get("layers", confine.LAYERS))
    report = confine.confine(config["read_paths"], confine.Limits(memory_mb=int(config["memory_mb"])), layers,
                             namespaces=namespaces if "namespaces" in layers else None, seccomp=SECCOMP_PROGRAM,
                             ruleset=config.get("ruleset_fd"))
    channel.CHANNEL = channel.Channel(reader, writer)
    worker = Worker(channel.CHANNEL)
    load = config.get("load")
    if not report.strong and not config.get("allow_weak_isolation"):
        loaded = {"op": "failed", "kind": "start", "reason": "not loaded: confinement is weaker than required"}
    elif not isinstance(load, dict):
        loaded = {"op": "failed", "kind": "start", "reason": "the fork server had no code for this worker"}
    else:
        try:
            loaded = worker.load(load)
        except BaseException as exc:  # noqa: BLE001 - a load failure is reported, like a call's
            loaded = _failure(exc)
    # What the load made (an app's modules, models, routes) lives as long as this worker: frozen,
    # the collector never walks it again during the episode's calls (the fork server's own heap
    # was frozen before the fork).
    gc.freeze()
    channel.CHANNEL.send({"op": "ready", "isolation": report.as_dict(), "pid": os.getpid(), "loaded": loaded})
    worker.serve()
