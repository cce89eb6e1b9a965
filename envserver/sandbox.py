"""A verifier worker: runs untrusted verifier code in a locked-down process.

Started by :mod:`envserver.verify` as ``python -I -S sandbox.py MEMORY_MB`` with an empty
environment, so it imports nothing but the standard library. Before it reads any code it:

1. caps its address space (``RLIMIT_AS``) and forbids writing files (``RLIMIT_FSIZE = 0``);
2. as root, moves into a new network namespace with no interfaces and drops to ``nobody``;
3. installs an audit hook that refuses sockets, subprocesses, ``exec``, ``fork``, ``ctypes`` and
   opening any file outside the Python installation (audit hooks cannot be removed).

It holds no database connection and no credentials. A verifier's ``final.query(...)`` becomes a
request on the pipe; the env server runs it read-only inside the episode and sends rows back.
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


def _audit(event: str, args: tuple) -> None:
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
                namespace: dict = {"__name__": "verifier"}
                exec(compile(message["code"], "<verifier>", "exec"), namespace)
                compiled[key] = namespace
            fn = compiled[key][message["entrypoint"]]
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
