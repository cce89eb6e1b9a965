"""One environment instance: the episode state machine behind both the MCP and control APIs.

All database work runs on one executor thread (the reset engine owns one connection and one
transaction); the event loop stays free to answer health checks while a tool or verifier runs.
Tool and verifier code runs in confined worker processes (:mod:`awm.sandbox`), driven from that
thread: a worker that loops, crashes or misbehaves is killed and replaced, and the instance
keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from awm.bundle import EnvBundle
from awm.sandbox.pool import WeakIsolation, WorkerFailure, WorkerPool, WorkerSpec
from envserver.metrics import Metrics
from envserver.reset import DatabaseLost, EpisodeDatabase
from envserver.tools import AGENT_FAULTS, ToolFailure, ToolRuntime
from envserver.verify import Verdict, verify_in_worker

T = TypeVar("T")
log = logging.getLogger("awm.envserver")

WEDGED_EXIT_CODE = 75  # the supervisor (local fleet or kubelet) restarts the process


class ControlError(Exception):
    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


@dataclass
class Episode:
    id: str
    task_id: str | None
    started: float = field(default_factory=time.time)
    tool_calls: int = 0
    lost: str | None = None  # why the episode is void (database connection lost)


class EnvInstance:
    def __init__(self, bundle: EnvBundle, dsn: str, name: str, verifier_workers: int = 1,
                 exit_when_wedged: bool = True, allow_weak_isolation: bool = False) -> None:
        self.bundle = bundle
        self.name = name
        self.runtime = ToolRuntime(bundle)
        self.db = EpisodeDatabase(dsn, statement_timeout_ms=int(bundle.limits.tool_timeout_s * 1000))
        # One pool runs both tools and verifiers (never at once: both hold the instance lock).
        self.pool = WorkerPool(WorkerSpec(memory_mb=bundle.limits.verifier_memory_mb, load=self.runtime.load,
                                          allow_weak_isolation=allow_weak_isolation), size=verifier_workers)
        self.metrics = Metrics(bundle.name, name)
        self.episode: Episode | None = None
        self.wedged = False
        self.exit_when_wedged = exit_when_wedged
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="awm-db")
        self._lock = asyncio.Lock()  # one control operation or tool call at a time
        self._initial_sqlite: bytes | None = None  # the snapshot as SQLite, for AWM verifiers

    async def _db(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def start(self) -> None:
        await self._db(self.db.connect)
        await self._db(lambda: self.db.reset(verify=True))  # prove the clone is pristine
        await asyncio.get_running_loop().run_in_executor(None, self.pool.start)
        isolation = self.pool.isolation
        if isolation.get("strong"):
            log.info("untrusted code confined by %s", ", ".join(isolation.get("applied", [])))
        else:  # only reachable with --allow-weak-isolation: say so loudly, every start
            log.warning("WEAK ISOLATION accepted: untrusted code runs without %s",
                        ", ".join(f"{k} ({v})" for k, v in isolation.get("missing", {}).items()))

    async def close(self) -> None:
        self.pool.close()
        await self._db(self.db.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return not self.wedged and self.db.connected and self.pool.ready

    # -- agent side (MCP) ------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: Any) -> Any:
        start = time.perf_counter()
        outcome = "ok"
        try:
            if self.wedged:
                raise ToolFailure("unavailable", "environment instance is restarting")
            args = self.runtime.validate(name, arguments)
            request = self.runtime.request(name, args)
            timeout_s = self.bundle.limits.tool_timeout_s
            async with self._lock:
                if self.episode is not None:
                    self.episode.tool_calls += 1
                if self.episode is not None and self.episode.lost:
                    raise ToolFailure("unavailable", "episode lost; the environment must be reset")
                future = self._db(lambda: self.db.run_code(self.pool, request, timeout_s, writes=True))
                try:
                    # The worker's deadline is enforced on the database thread; this outer one only
                    # catches a thread stuck in the database past its statement timeout.
                    reply, state = await asyncio.wait_for(future, timeout_s * 2 + 30)
                except asyncio.TimeoutError:
                    self._wedge(f"tool {name} ran past {timeout_s:g} s")
                    raise ToolFailure("timeout", f"{name} did not finish within {timeout_s:g} s") from None
                except WorkerFailure as exc:
                    self.metrics.worker_restarts.labels(exc.kind).inc()
                    if exc.kind == "timeout":
                        raise ToolFailure("timeout", f"{name} did not finish within {timeout_s:g} s") from None
                    if exc.kind == "start":
                        raise ToolFailure("unavailable", f"{name}: {exc}") from None
                    raise ToolFailure("tool_crashed", f"{name}: {exc}") from None
                except WeakIsolation as exc:
                    raise ToolFailure("unavailable", str(exc)) from None
                except DatabaseLost as exc:
                    self._lose(str(exc))
                    raise ToolFailure("unavailable", "environment database unavailable; "
                                                     "the episode is void") from exc
                return self.runtime.outcome(name, reply, bool(state.get("timed_out")),
                                            bool(state.get("rolled_back")))
        except ToolFailure as failure:
            outcome = failure.kind
            raise
        finally:
            self.metrics.tool_calls.labels(name if name in self.runtime.names else "_unknown", outcome).inc()
            self.metrics.tool_latency.labels(name if name in self.runtime.names else "_unknown").observe(
                time.perf_counter() - start)

    def _lose(self, reason: str) -> None:
        if self.episode is not None:
            self.episode.lost = reason
        log.warning("episode lost: %s", reason)

    def _wedge(self, reason: str) -> None:
        """A thread is stuck in untrusted code: stop taking work and let the supervisor restart us."""
        self.wedged = True
        log.error("instance wedged: %s", reason)
        if self.exit_when_wedged:
            asyncio.get_running_loop().call_later(0.5, os._exit, WEDGED_EXIT_CODE)

    # -- control side ----------------------------------------------------------------------

    async def reset(self, task_id: str | None, verify: bool = False) -> dict[str, Any]:
        task = None
        if task_id is not None:
            try:
                task = self.bundle.task(task_id)
            except KeyError:
                raise ControlError(404, f"unknown task id {task_id!r}",
                                   known=[t.id for t in self.bundle.tasks]) from None
        if self.wedged:
            raise ControlError(503, "instance is restarting")
        async with self._lock:
            was_connected = self.db.connected
            try:
                result = await self._db(lambda: self.db.reset(verify=verify))
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - e.g. NotPristine: never serve a wrong state
                self._wedge(f"reset failed: {exc}")
                raise ControlError(500, f"reset failed, instance is being replaced: {exc}") from exc
            if not was_connected:
                self.metrics.db_reconnects.inc()
            self.metrics.resets.labels(result.strategy).observe(result.ms / 1000)
            if result.escaped:
                self.metrics.escapes.inc()
                log.warning("episode escaped its transaction (%s): state repaired from the snapshot",
                            result.escaped)
            self.episode = Episode(uuid.uuid4().hex, task_id)
        return {
            "episode_id": self.episode.id,
            "task_id": task_id,
            "instruction": task.instruction if task else None,
            "reset_ms": round(result.ms, 3),
            "strategy": result.strategy,
            "pristine": result.pristine,
            "repaired": result.repaired,
            "escaped": result.escaped,
        }

    async def verify(self, final_answer: str | None) -> dict[str, Any]:
        episode = self.episode
        if episode is None:
            raise ControlError(409, "no episode to verify: call reset first")
        if episode.task_id is None:
            raise ControlError(409, "the episode was reset without a task; nothing to verify")
        task = self.bundle.task(episode.task_id)
        if episode.lost:
            verdict = Verdict("error", f"episode lost: {episode.lost}", "infra")
        elif not self.db.connected:
            verdict = Verdict("error", "episode lost: database connection is down", "infra")
        else:
            code = "\n\n".join(x for x in (self.bundle.verifier_prelude, task.verifier.code) if x)
            timeout_s = self.bundle.limits.verifier_timeout_s
            async with self._lock:
                try:
                    images = await self._sqlite_images() if task.verifier.inputs == "sqlite" else None
                    verdict = await self._db(lambda: verify_in_worker(
                        self.db, self.pool, code, task.verifier.entrypoint, final_answer, timeout_s, images))
                except DatabaseLost as exc:
                    self._lose(str(exc))
                    verdict = Verdict("error", f"episode lost: {exc}", "infra")
                except Exception as exc:  # noqa: BLE001 - reported as the verdict
                    verdict = Verdict("error", f"could not prepare the verification: {exc}", "infra")
            if episode.lost:  # lost while the verifier was reading
                verdict = Verdict("error", f"episode lost: {episode.lost}", "infra", verdict.ms)
        self.metrics.episodes.labels(verdict.verdict).inc()
        self.metrics.verify_latency.observe(verdict.ms / 1000)
        if verdict.verdict == "error":
            self.metrics.verifier_errors.labels(verdict.kind).inc()
            if verdict.kind == "timeout":
                self.metrics.verifier_timeouts.inc()
        return {
            "episode_id": episode.id,
            "task_id": episode.task_id,
            "verdict": verdict.verdict,
            "reward": verdict.reward,
            "reason": verdict.reason,
            "error_kind": verdict.kind or None,
            "verify_ms": round(verdict.ms, 3),
            "tool_calls": episode.tool_calls,
        }

    async def _sqlite_images(self) -> dict[str, bytes]:
        """AWM convention: SQLite images of the snapshot (built once) and of the final state."""
        from awm.postgres.sqlite_export import build_sqlite

        ddl = self.bundle.database.sqlite_ddl or ""
        if self._initial_sqlite is None:
            self._initial_sqlite = await self._db(lambda: build_sqlite(ddl, self.db.read_tables(True)))
        final = await self._db(lambda: build_sqlite(ddl, self.db.read_tables(False)))
        return {"initial": self._initial_sqlite, "final": final}

    async def diff(self) -> dict[str, Any]:
        async with self._lock:
            try:
                tables = await self._db(self.db.diff)
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc
        return {"episode_id": self.episode.id if self.episode else None, "tables": tables}

    async def checksum(self) -> dict[str, Any]:
        async with self._lock:
            try:
                return await self._db(self.db.checksum)
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc

    def info(self) -> dict[str, Any]:
        return {
            "env": self.bundle.name,
            "instance": self.name,
            "tools": [t.name for t in self.bundle.tools],
            "tasks": [{"id": t.id, "instruction": t.instruction} for t in self.bundle.tasks],
            # What confines tool and verifier code here (the layers applied, and any missing).
            "isolation": self.pool.isolation,
            "verifier_isolation": self.pool.isolation,
        }


def is_agent_fault(kind: str) -> bool:
    return kind in AGENT_FAULTS
