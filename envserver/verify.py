"""The verifier pool: warm sandboxed worker processes, and the verdicts they produce.

A worker (:mod:`envserver.sandbox`) is started ahead of time so that a verification costs a pipe
round trip, not an interpreter start. A worker that crashes, times out or runs out of memory is
killed and replaced in the background; its verdict is ``error`` with the reason, and the server
keeps serving. Queries the verifier makes are answered by ``answer_query`` (the reset engine's
read-only path) while the worker waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

SANDBOX = Path(__file__).with_name("sandbox.py")
QueryFn = Callable[[bool, str, list[Any]], Awaitable[list[dict[str, Any]]]]


@dataclass
class Verdict:
    verdict: str  # complete | incomplete | error
    reason: str
    kind: str = ""  # for errors: timeout | memory | crash | exception | query | infra
    ms: float = 0.0

    @property
    def reward(self) -> float:
        return 1.0 if self.verdict == "complete" else 0.0


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process, isolation: str) -> None:
        self.proc = proc
        self.isolation = isolation

    async def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message, default=str).encode() + b"\n")
        await self.proc.stdin.drain()

    async def receive(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        return json.loads(line) if line else None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


class VerifierPool:
    def __init__(self, size: int = 1, memory_mb: int = 512) -> None:
        self.size = size
        self.memory_mb = memory_mb
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._spawning: set[asyncio.Task[None]] = set()
        self._all: set[_Worker] = set()
        self.isolation = "unknown"

    async def start(self) -> None:
        await asyncio.gather(*(self._spawn() for _ in range(self.size)))

    @property
    def ready(self) -> bool:
        return not self._idle.empty() or bool(self._spawning)

    async def _spawn(self) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", str(SANDBOX), str(self.memory_mb),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env={"PATH": "/usr/bin:/bin"}, cwd="/",
            limit=64 * 1024 * 1024,
        )
        worker = _Worker(proc, "")
        hello = await asyncio.wait_for(worker.receive(), timeout=30)
        if not hello or hello.get("op") != "ready":
            worker.kill()
            raise RuntimeError("verifier worker failed to start")
        worker.isolation = self.isolation = hello.get("isolation", "none")
        self._all.add(worker)
        await self._idle.put(worker)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._all.discard(worker)
        task = asyncio.get_running_loop().create_task(self._spawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def verify(self, code: str, entrypoint: str, answer: str | None, timeout_s: float,
                     answer_query: QueryFn, files: dict[str, str] | None = None) -> Verdict:
        """``files`` (``{"initial": path, "final": path}``) switches to the AWM convention:
        the verifier gets those SQLite files instead of query views."""
        start = time.perf_counter()
        worker = await self._idle.get()
        try:
            verdict = await asyncio.wait_for(
                self._exchange(worker, code, entrypoint, answer, answer_query, files), timeout_s)
        except asyncio.TimeoutError:
            verdict = Verdict("error", f"verifier timed out after {timeout_s:g} s", "timeout")
        except Exception as exc:  # noqa: BLE001 - reported as the verdict, server keeps serving
            verdict = Verdict("error", f"verifier infrastructure failure: {exc}", "infra")
        if verdict.verdict == "error":
            self._replace(worker)  # never reuse a worker after a failure: its state is unknown
        else:
            self._idle.put_nowait(worker)
        verdict.ms = (time.perf_counter() - start) * 1000
        return verdict

    async def _exchange(self, worker: _Worker, code: str, entrypoint: str, answer: str | None,
                        answer_query: QueryFn, files: dict[str, str] | None = None) -> Verdict:
        message = {"op": "verify", "code": code, "entrypoint": entrypoint, "answer": answer}
        if files:
            message["files"] = files
        await worker.send(message)
        while True:
            message = await worker.receive()
            if message is None:
                code_ = await worker.proc.wait()
                return Verdict("error", f"verifier process died (exit code {code_})", "crash")
            op = message.get("op")
            if op == "query":
                try:
                    rows = await answer_query(message.get("db") == "initial", str(message.get("sql", "")),
                                              list(message.get("params") or []))
                    await worker.send({"rows": rows})
                except Exception as exc:  # noqa: BLE001 - the verifier sees the SQL error
                    await worker.send({"error": f"{type(exc).__name__}: {exc}".strip()})
            elif op == "done":
                complete = bool(message.get("complete"))
                return Verdict("complete" if complete else "incomplete", str(message.get("reason", "")))
            elif op == "failed":
                return Verdict("error", str(message.get("reason", "")), str(message.get("kind", "exception")))
            else:
                return Verdict("error", f"verifier sent an unknown message {op!r}", "crash")

    async def close(self) -> None:
        for task in list(self._spawning):
            task.cancel()
        for worker in list(self._all):
            worker.kill()
            with contextlib.suppress(Exception):
                await worker.proc.wait()
        self._all.clear()


def scrubbed_env() -> dict[str, str]:
    """What a child process of the env server may inherit: nothing secret."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "TZ")}
