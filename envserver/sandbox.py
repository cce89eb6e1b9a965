"""A verifier worker: runs untrusted verifier code in a locked-down process.

Started by :mod:`envserver.verify` as ``python -I -S sandbox.py MEMORY_MB`` with an empty
environment, so it imports nothing but the standard library. Before it reads any code it:

1. caps its address space (``RLIMIT_AS``) and forbids writing files (``RLIMIT_FSIZE = 0``);
2. as root, moves into a new network namespace with no interfaces and drops to ``nobody``;
3. installs an audit hook that refuses sockets, subprocesses, ``exec``, ``fork``, ``ctypes`` and
   opening any file outside the Python installation (audit hooks cannot be removed).

It holds no database connection and no credentials. A verifier's ``final.query(...)`` becomes a
request on the pipe; the env server runs it read-only inside the episode and sends rows back.

AWM-style verifiers (``inputs: sqlite``) instead get two SQLite file paths that the server wrote
for this verification (``envserver/sqlite_export.py``). ``sqlite3.connect`` is wrapped so that
those two paths, in any form the verifier writes them (plain, ``file:...?mode=ro`` URI), open
read-only and immutable, with ATTACH refused; the audit hook refuses every other database
(``sqlite3.connect`` raises an audit event with the exact string the C library will open) and
loading SQLite extensions. Only ``:memory:`` databases are allowed besides.
Protocol: one JSON object per line, on file descriptors that verifier code cannot print to.
"""

import ctypes
import io
import json
import os
import resource
import sys
import traceback

# Modules a verifier may want, imported before the audit hook so that their files can be read.
import collections, datetime, decimal, fractions, functools, itertools, math, re, statistics, string  # noqa: E401,F401
import unicodedata  # noqa: F401
import inspect
import sqlite3
import urllib.parse

CLONE_NEWNET = 0x40000000
NOBODY = 65534


class VerifierQueryError(Exception):
    pass


def _limit(memory_mb: int) -> None:
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # No new processes at all, even through C paths the audit hook cannot see
    # (_posixsubprocess.fork_exec). Applied after dropping root, which would ignore it.
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))


def _isolate() -> str:
    """Network namespace and unprivileged user when we can; report what was applied."""
    applied = []
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWNET) == 0:
            applied.append("netns")
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
        applied.append("nobody")
    return ",".join(applied) or "none"


_ALLOWED_PREFIXES = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
_BLOCKED = (
    "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "ctypes.", "pty.", "os.putenv", "os.unsetenv",
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
    "os.symlink", "os.truncate", "shutil.", "webbrowser.", "urllib.", "http.", "ftplib.",
    "smtplib.", "os.chdir", "resource.setrlimit",
    "os.listdir", "os.scandir", "glob.", "os.walk",
)


# The SQLite files of the verification in progress: real path -> the only URI that opens it.
_SQLITE_FILES: dict[str, str] = {}
_REAL_SQLITE_CONNECT = sqlite3.connect


def _audit(event: str, args: tuple) -> None:
    if event == "sqlite3.connect":
        database = args[0]
        name = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
        if name == ":memory:" or name in _SQLITE_FILES.values():
            return
        raise PermissionError(f"sandbox: opening the database {name!r} is not allowed")
    if event in ("sqlite3.enable_load_extension", "sqlite3.load_extension"):
        raise PermissionError("sandbox: loading SQLite extensions is not allowed")
    if event == "open":
        path, mode = args[0], args[1]
        if isinstance(path, int):
            raise PermissionError("sandbox: opening file descriptors is not allowed")
        real = os.path.realpath(os.fsdecode(path)) if path is not None else ""
        writing = isinstance(mode, str) and any(c in mode for c in "wax+")
        if writing or not real.startswith(_ALLOWED_PREFIXES):
            raise PermissionError(f"sandbox: access to {real!r} is not allowed")
        return
    if event.startswith(_BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed in a verifier")


def _sqlite_connect(database, *args, **kwargs):
    """``sqlite3.connect`` for verifiers: the episode's files open read-only and immutable."""
    uri = bool(kwargs.pop("uri", False))
    name = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else None
    if name is not None and name != ":memory:":
        target = urllib.parse.unquote(urllib.parse.urlsplit(name).path) if uri and name.startswith("file:") else name
        safe = _SQLITE_FILES.get(os.path.realpath(target))
        if safe is not None:
            conn = _REAL_SQLITE_CONNECT(safe, *args, uri=True, **kwargs)
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            conn.set_authorizer(_sqlite_authorizer)
            return conn
    return _REAL_SQLITE_CONNECT(database, *args, uri=uri, **kwargs)


def _sqlite_authorizer(action, *args):
    return sqlite3.SQLITE_DENY if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH) else sqlite3.SQLITE_OK


sqlite3.connect = _sqlite_connect
sqlite3.dbapi2.connect = _sqlite_connect


def _call_awm(fn, files: dict, answer):
    """Call an AWM verifier the way the reference does: by parameter name when it uses the
    conventional names, else positionally (initial, final, answer)."""
    values = {"initial_db_path": files["initial"], "final_db_path": files["final"], "final_answer": answer}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    named = {k: v for k, v in values.items() if k in params}
    if named:
        return fn(**named)
    kinds = [p.kind for p in params.values()]
    count = 3 if not kinds or inspect.Parameter.VAR_POSITIONAL in kinds else sum(
        k in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in kinds)
    return fn(*[files["initial"], files["final"], answer][:count])


class ReadOnlyDb:
    """The ``final`` / ``initial`` object a verifier receives."""

    def __init__(self, name: str, channel: "Channel") -> None:
        self._name = name
        self._channel = channel

    def query(self, sql: str, *params):
        reply = self._channel.request({"op": "query", "db": self._name, "sql": sql, "params": list(params)})
        if "error" in reply:
            raise VerifierQueryError(reply["error"])
        return reply["rows"]

    def one(self, sql: str, *params):
        rows = self.query(sql, *params)
        return rows[0] if rows else None

    def scalar(self, sql: str, *params):
        row = self.one(sql, *params)
        return next(iter(row.values())) if row else None


class Channel:
    def __init__(self, reader: io.BufferedReader, writer: io.BufferedWriter) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, message: dict) -> None:
        self._writer.write(json.dumps(message, default=str).encode() + b"\n")
        self._writer.flush()

    def receive(self) -> dict | None:
        line = self._reader.readline()
        return json.loads(line) if line else None

    def request(self, message: dict) -> dict:
        self.send(message)
        reply = self.receive()
        if reply is None:
            raise SystemExit(0)
        return reply


def _normalise(result) -> tuple[bool, str]:
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


def serve(channel: Channel) -> None:
    compiled: dict[str, dict] = {}
    while True:
        message = channel.receive()
        if message is None:
            return
        try:
            key = message["code"]
            if key not in compiled:
                namespace: dict = {"__name__": "verifier", "sqlite3": sqlite3, "json": json}
                exec(compile(message["code"], "<verifier>", "exec"), namespace)
                compiled[key] = namespace
            fn = compiled[key][message["entrypoint"]]
            files = message.get("files")
            if files:
                for path in files.values():
                    real = os.path.realpath(path)
                    _SQLITE_FILES[real] = f"file:{urllib.parse.quote(real)}?mode=ro&immutable=1"
                complete, reason = _normalise(_call_awm(fn, files, message.get("answer")))
            else:
                final = ReadOnlyDb("final", channel)
                initial = ReadOnlyDb("initial", channel)
                complete, reason = _normalise(fn(final, initial, message.get("answer")))
            channel.send({"op": "done", "complete": complete, "reason": reason[:2000]})
        except MemoryError:
            channel.send({"op": "failed", "kind": "memory", "reason": "verifier exceeded its memory limit"})
        except BaseException as exc:  # noqa: BLE001 - every failure of untrusted code is reported
            if isinstance(exc, SystemExit) and exc.code == 0 and message is None:
                return
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            channel.send({"op": "failed", "kind": "exception", "reason": tb[:2000]})
        finally:
            _SQLITE_FILES.clear()  # the next verification may open only its own files


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 512
    # Private protocol descriptors; fd 1 and 2 become /dev/null so print() cannot corrupt them.
    reader = os.fdopen(os.dup(0), "rb")
    writer = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    channel = Channel(reader, writer)
    os.environ.clear()
    isolation = _isolate()
    _limit(memory_mb)
    sys.addaudithook(_audit)
    channel.send({"op": "ready", "isolation": isolation, "pid": os.getpid()})
    serve(channel)


if __name__ == "__main__":
    main()
