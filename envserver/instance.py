"""One environment instance: the episode state machine behind both the MCP and control APIs.

An instance serves one environment at a time, its current :class:`~awm.envserver.binding.Binding`.
A late-binding instance (started with a provisioner and a catalog) switches to another environment
when it is claimed for one (:meth:`EnvInstance.bind`): a fresh database of that environment from
the provisioner, checked against its snapshot, fresh workers for its code, its tools in MCP
``tools/list`` (the MCP sessions of the previous environment end) and ``/info``; the last
``cache_envs`` environments keep their database and bundle, so a repeat claim costs a reset.

All database work runs on one executor thread (the reset engine owns one connection and one
transaction); the event loop stays free to answer health checks while a tool or verifier runs.
Tool and verifier code runs in confined worker processes (:mod:`awm.sandbox`), driven from that
thread: a worker that loops, crashes or misbehaves is killed and replaced, and the instance
keeps serving.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from awm.bundle import EnvBundle, Task, Verifier
from awm.errorclass import ErrorClass
from awm.judge import Judge, Step
from awm.postgres.provisioner import ProvisionerError, ProvisionerLost
from awm.sandbox.forkserver import Zygote
from awm.sandbox.pool import WeakIsolation, WorkerFailure, WorkerPool, make_zygote
from awm.envserver.binding import Binding, BindError, DatabaseSource, FixedDatabase
from awm.envserver.metrics import Metrics
from awm.envserver.reset import DatabaseLost, EpisodeDatabase, ResetResult
from awm.envserver.tools import ToolFailure, ToolRuntime, render
from awm.envserver.verify import Verdict, from_judgement, verify_in_worker

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
    ungated: bool = False  # served with --allow-ungated: its task has not passed both gates
    steps: list[Step] = field(default_factory=list)  # the episode's own log, for the judge


MAX_LOGGED_RESULT = 20_000  # characters of one tool result kept in the episode log


class _Phases:
    """Where a switch's (or a preparation's) time went: call it with each phase's name as the
    phase ends; ``ms`` holds each phase's milliseconds, in order."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._mark = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round((now - self._mark) * 1000, 3)
        self._mark = now

    def add(self, name: str, ms: float) -> None:
        """A part measured on its own (it ran beside the phases, so it is not one of them)."""
        self.ms[name] = round(ms, 3)


class EnvInstance:
    def __init__(self, bundle: EnvBundle, dsn: str | None, name: str, verifier_workers: int = 1,
                 exit_when_wedged: bool = True, allow_weak_isolation: bool = False,
                 judge: Judge | None = None, verifier_kind: str | None = None, allow_ungated: bool = False,
                 databases: DatabaseSource | None = None, catalog: Callable[[str], EnvBundle] | None = None,
                 cache_envs: int = 4, spare_workers: int = 1) -> None:
        self.name = name
        self.spare_workers = spare_workers
        self.judge = judge
        self.verifier_kind = verifier_kind  # preferred verifier kind where a task has both
        self.allow_ungated = allow_ungated
        self.workers = verifier_workers
        self.allow_weak_isolation = allow_weak_isolation
        if databases is None:
            if dsn is None:
                raise ValueError("an instance needs a DSN or a database source")
            databases = FixedDatabase(bundle.name, dsn)
        self.databases = databases
        self.catalog = catalog  # env name -> bundle (raises KeyError); None: only the first bundle
        self.cache_envs = max(1, cache_envs)
        self._first = bundle
        self.binding: Binding = None  # type: ignore[assignment] - set by start()
        self._bindings: OrderedDict[str, Binding] = OrderedDict()  # least recently used first
        self._preparing: set[str] = set()  # environments being prepared (made ready, not served)
        # One fork server per kind of code (tools of an imported app need its libraries): workers
        # of every environment fork from it; it holds no connection and no credential.
        self._zygotes: dict[bool, Zygote] = {}
        self.metrics = Metrics(bundle.name, name)
        self.episode: Episode | None = None
        self.wedged = False
        self.exit_when_wedged = exit_when_wedged
        self.on_switch: list[Callable[[], None]] = []  # e.g. the MCP app ending its sessions
        self.switches = 0
        self._isolation: dict[str, Any] = {}  # what confined the first workers (the same for every binding)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="awm-db")
        self._dropping: set[asyncio.Task[None]] = set()  # evicted environments being dropped
        self._lock = asyncio.Lock()  # one control operation or tool call at a time

    # The current binding's parts, by the names the episode path uses.
    @property
    def bundle(self) -> EnvBundle:
        return self.binding.bundle if self.binding is not None else self._first

    @property
    def db(self) -> EpisodeDatabase:
        return self.binding.db

    @property
    def runtime(self) -> ToolRuntime:
        return self.binding.runtime

    @property
    def gates(self) -> dict[str, tuple[bool, str]]:
        return self.binding.gates

    @property
    def pool(self) -> WorkerPool:
        assert self.binding.pool is not None
        return self.binding.pool

    @property
    def verifier_pool(self) -> WorkerPool:
        assert self.binding.verifier_pool is not None
        return self.binding.verifier_pool

    def _dedicate(self, binding: Binding) -> None:
        """Workers are forked, from now on, only for ``binding``'s environment, by an environment
        zygote that has only ever held its code (:meth:`Zygote.dedicate`; issue 45): the one kept
        since it was served last (a cached environment), or a fork of the clean zygote at the
        first spawn. Called before the new binding's first spawn (its pools have not forked yet),
        once the switch cannot fail any more."""
        key = binding.load_key
        for app in (False, True):
            if app in self._zygotes or app == binding.app:
                self._zygote(app).dedicate(key if app == binding.app else "")  # "": no environment

    def _zygote(self, app: bool) -> Zygote:
        if app not in self._zygotes:
            self._zygotes[app] = make_zygote(app, max_envs=self.cache_envs)
        return self._zygotes[app]

    async def _db(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def start(self) -> None:
        binding = await self._new_binding(self._first)
        await self._db(lambda: binding.db.reset(verify=True))  # prove the clone is pristine
        self._dedicate(binding)
        await asyncio.get_running_loop().run_in_executor(None, lambda: binding.activate(
            self._zygote(binding.app), self.workers, self.allow_weak_isolation, wait=True,
            spares=self.spare_workers))
        self.binding = binding
        self._bindings[binding.name] = binding
        isolation = self._isolation = self.pool.isolation
        if isolation.get("strong"):
            log.info("untrusted code confined by %s", ", ".join(isolation.get("applied", [])))
        else:  # only reachable with --allow-weak-isolation: say so loudly, every start
            log.warning("WEAK ISOLATION accepted: untrusted code runs without %s",
                        ", ".join(f"{k} ({v})" for k, v in isolation.get("missing", {}).items()))

    async def _new_binding(self, bundle: EnvBundle, phase: _Phases | None = None, aside: bool = False) -> Binding:
        """The environment's own database (from the database source) and runtime, connected.
        ``aside``: connect on a thread of its own, not the instance's database thread (a
        preparation while another environment's episode runs must not queue behind its calls).

        The connection is made after the tool runtime is built, not beside it: overlapping the
        two (tried on the real node) could save only the runtime's 2-3 ms, within the node's
        run-to-run spread, for a second failure path."""
        phase = phase or _Phases()
        loop = asyncio.get_running_loop()
        database = await loop.run_in_executor(None, self.databases.acquire, bundle.name)
        phase("acquire_database")
        if self.databases.late:
            self.metrics.databases.labels(database.source).inc()
        try:
            binding = await loop.run_in_executor(None, Binding.new, bundle, database, self.verifier_kind)
        except BaseException:
            await self._release(bundle.name, database.name)
            raise
        phase("tool_runtime")
        parts = _Phases()
        connect = functools.partial(binding.db.connect, phase=parts)
        try:
            await (loop.run_in_executor(None, connect) if aside else self._db(connect))
        except BaseException:
            await self._drop(binding, aside=aside)
            raise
        phase("connect")
        for name, ms in parts.ms.items():
            phase.add(f"db.{name}", ms)
        return binding

    async def _release(self, env: str, database: str) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.databases.release, database)
        except ProvisionerLost as exc:
            self._wedge(f"provisioner connection lost: {exc}")
        except (ProvisionerError, OSError) as exc:  # dropped by the provisioner when we exit anyway
            log.warning("could not release the database of %s: %s", env, exc)

    async def _drop(self, binding: Binding, aside: bool = False) -> None:
        """Forget a cached environment: its workers, its connection, its database. ``aside``:
        close the connection off the instance's database thread (the binding is unreachable)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, binding.deactivate())
        for zygote in self._zygotes.values():
            zygote.forget(binding.load_key)  # its environment zygote goes with it
        await (loop.run_in_executor(None, binding.db.close) if aside else self._db(binding.db.close))
        await self._release(binding.name, binding.database)

    def _drop_later(self, binding: Binding) -> None:
        """Drop an evicted environment in the background. It is unreachable already (out of
        ``_bindings`` and not the one served); what remains is killing its workers and the
        provisioner's ``DROP DATABASE`` (27-57 ms on a disk), which a switch that evicted used to
        wait for (docs/benchmarks.md, "A switch to a new database, cheaper"). :meth:`close` waits
        for the drops still running."""
        task = asyncio.get_running_loop().create_task(self._drop(binding, aside=True))
        self._dropping.add(task)
        task.add_done_callback(self._dropped)

    def _dropped(self, task: asyncio.Task[None]) -> None:
        self._dropping.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("dropping an evicted environment failed: %s", task.exception())

    async def bind(self, env: str) -> dict[str, Any]:
        """Serve ``env`` from now on. The current episode ends; the instance database of ``env``
        is at its snapshot (a new one checked against the snapshot's checksum, a cached one reset);
        the next tool call runs on a worker that has run nothing. Returns what it cost. A switch
        that fails leaves the instance serving what it served (a cached environment whose reset
        failed is forgotten)."""
        async with self._lock:
            return (await self._bind_locked(env))[0]

    async def _bind_locked(self, env: str) -> tuple[dict[str, Any], ResetResult | None]:
        """:meth:`bind` with the instance's lock held; also the reset it made (None when ``env``
        is already served), so that a reset that asked for ``env`` need not reset again."""
        if not isinstance(env, str) or not env:
            raise ControlError(400, "env must be a non-empty string")
        if self.wedged:
            raise ControlError(503, "instance is restarting")
        start = time.perf_counter()
        if env == self.binding.name:
            return {"env": env, "switched": False, "cached": True, "bind_ms": 0.0, "instance": self.name,
                    "cached_envs": list(self._bindings)}, None
        if not self.databases.late:
            raise ControlError(409, f"instance {self.name} is pinned to {self.binding.name!r}; it "
                                    f"cannot serve {env!r} (started without a provisioner)", env=self.binding.name)
        binding = self._bindings.get(env)
        cached = binding is not None
        phase = _Phases()
        made: Binding | None = None
        try:
            if binding is None:
                bundle = await asyncio.get_running_loop().run_in_executor(None, self._find, env)
                phase("load_bundle")
                binding = made = await self._new_binding(bundle, phase)
                vouched = made.db.vouched
                result = await self._db(lambda: made.db.reset(verify=True))  # checksummed (by its maker if vouched)
                phase("reset_vouched" if vouched else "checksum")
            else:
                result = await self._db(binding.db.reset)
                phase("reset")
            # The new environment's workers start before the old ones go: a failure here
            # leaves the instance as it was.
            binding.activate(self._zygote(binding.app), self.workers, self.allow_weak_isolation, wait=False,
                             staged=not cached, spares=self.spare_workers)
            phase("start_workers")
        except BaseException as exc:
            if not isinstance(exc, ControlError):
                self.metrics.binds.labels("failed").inc()
            if made is not None:
                await self._drop(made)
            elif cached and binding is not None and not isinstance(exc, asyncio.CancelledError):
                self._bindings.pop(env, None)  # its reset failed: never serve it again
                await self._drop(binding)
            answer = self._switch_failure(exc, "bind", env)
            if answer is exc:
                raise
            raise answer from None
        previous = self.binding
        # The fork servers hold the previous environment's code: from now on workers are forked
        # from one that never held it (its first spawn comes after this answer).
        self._dedicate(binding)
        # The previous environment's workers are detached now (nothing can reach them) and
        # killed off the claim path.
        asyncio.get_running_loop().run_in_executor(None, previous.deactivate())
        phase("stop_workers")
        self.binding = binding
        self._bindings[env] = binding
        self._bindings.move_to_end(env)
        self.episode = None
        self.switches += 1
        for callback in self.on_switch:
            callback()
        self.metrics.bound(previous.name, env)
        while len(self._bindings) > self.cache_envs:  # the least recently used goes, off the claim path
            self._drop_later(self._bindings.popitem(last=False)[1])
        ms = (time.perf_counter() - start) * 1000
        kind = "cached" if cached else "new"
        self.metrics.binds.labels(kind).inc()
        self.metrics.bind_latency.labels(kind).observe(ms / 1000)
        return {"env": env, "switched": True, "cached": cached,
                "database_source": None if cached else binding.source, "bind_ms": round(ms, 3), "phases_ms": phase.ms,
                "reset_ms": round(result.ms, 3), "pristine": result.pristine, "instance": self.name,
                "previous": previous.name, "cached_envs": list(self._bindings)}, result

    async def prepare(self, env: str) -> dict[str, Any]:
        """Make ``env`` ready without serving it: its database acquired from the provisioner,
        connected and checked against its snapshot, kept with the cached environments, so that
        a later claim of it costs a reset instead of a switch. The operator asks ahead of claims
        (a GRPO step's environments are known before its groups are claimed), also while this
        instance runs another environment's episode: nothing here touches the current binding,
        its workers or its connection (the work runs off the instance's database thread), and
        no worker is started (a cached environment gets fresh workers when it is bound).
        The least recently used cached environment other than the current one makes room."""
        if not isinstance(env, str) or not env:
            raise ControlError(400, "env must be a non-empty string")
        if self.wedged:
            raise ControlError(503, "instance is restarting")
        if not self.databases.late:
            raise ControlError(409, f"instance {self.name} is pinned to {self.binding.name!r}; it "
                                    f"cannot prepare {env!r}", env=self.binding.name)
        if self.cache_envs < 2:
            raise ControlError(409, f"instance {self.name} keeps one environment (cache_envs 1): no room to "
                                    f"prepare {env!r} beside the one it serves")
        if env in self._bindings:
            return {"env": env, "prepared": False, "cached": True, "instance": self.name,
                    "cached_envs": list(self._bindings)}
        if env in self._preparing:
            raise ControlError(409, f"{env!r} is being prepared on instance {self.name} already")
        self._preparing.add(env)
        start = time.perf_counter()
        phase = _Phases()
        loop = asyncio.get_running_loop()
        made: Binding | None = None
        try:
            bundle = await loop.run_in_executor(None, self._find, env)
            phase("load_bundle")
            made = await self._new_binding(bundle, phase, aside=True)
            vouched = made.db.vouched
            result = await loop.run_in_executor(None, lambda: made.db.reset(verify=True))  # checksummed (by its maker if vouched)
            phase("reset_vouched" if vouched else "checksum")
            if not result.pristine:
                raise ControlError(500, f"cannot prepare {env!r}: its new database is not at its snapshot")
            evicted: list[Binding] = []
            async with self._lock:
                if self.wedged or env in self._bindings:  # bound meanwhile (a claim was faster)
                    kept = False
                else:
                    self._bindings[env] = made
                    kept, made = True, None
                    while len(self._bindings) > self.cache_envs:
                        oldest = next(e for e in self._bindings if e != self.binding.name)
                        evicted.append(self._bindings.pop(oldest))
            for binding in evicted:  # unreachable now: dropped without holding up the episode's calls
                self._drop_later(binding)
        except BaseException as exc:
            answer = self._switch_failure(exc, "prepare", env)
            if answer is exc:
                raise
            raise answer from None
        finally:
            self._preparing.discard(env)
            if made is not None:
                await self._drop(made)
        ms = (time.perf_counter() - start) * 1000
        self.metrics.prepares.labels("made" if kept else "raced").inc()
        return {"env": env, "prepared": kept, "cached": not kept, "prepare_ms": round(ms, 3), "phases_ms": phase.ms,
                "instance": self.name, "serving": self.binding.name, "cached_envs": list(self._bindings)}

    def _switch_failure(self, exc: BaseException, verb: str, env: str) -> BaseException:
        """What a failed switch or preparation answers: a :class:`ControlError` (``exc`` itself
        when it is one, or not an ``Exception``, e.g. a cancellation). A lost provisioner wedges
        the instance (its databases are being dropped: it must start again)."""
        if isinstance(exc, ControlError) or not isinstance(exc, Exception):
            return exc
        if isinstance(exc, ProvisionerLost):
            self._wedge(f"provisioner connection lost: {exc}")
            return ControlError(503, f"cannot {verb} {env!r}: the provisioner is gone; the instance restarts")
        if isinstance(exc, BindError):
            return ControlError(409, str(exc))
        if isinstance(exc, (ProvisionerError, DatabaseLost)):
            return ControlError(503, f"cannot {verb} {env!r}: {exc}")
        return ControlError(500, f"cannot {verb} {env!r}: {type(exc).__name__}: {exc}")

    def _find(self, env: str) -> EnvBundle:
        if self.catalog is None:
            raise ControlError(404, f"unknown environment {env!r} (this instance has no catalog)")
        try:
            return self.catalog(env)
        except KeyError:
            raise ControlError(404, f"unknown environment {env!r}: not in this instance's catalog") from None
        except ValueError as exc:  # awm.catalog.CatalogError: a broken bundle
            raise ControlError(422, f"environment {env!r} cannot be loaded: {exc}") from None

    async def close(self) -> None:
        if self.judge is not None:
            await self.judge.close()
        await asyncio.gather(*self._dropping, return_exceptions=True)
        for binding in list(self._bindings.values()):
            binding.deactivate()()
            await self._db(binding.db.close)
        for zygote in self._zygotes.values():
            zygote.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    @property
    def ready(self) -> bool:
        return (not self.wedged and self.binding is not None and self.db.connected and self.pool.ready
                and self.verifier_pool.ready)

    # -- agent side (MCP) ------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: Any) -> Any:
        start = time.perf_counter()
        outcome = "ok"
        episode = self.episode
        binding = self.binding
        try:
            if self.wedged:
                raise ToolFailure(ErrorClass.UNAVAILABLE, "environment instance is restarting")
            args = binding.runtime.validate(name, arguments)
            request = binding.runtime.request(name, args)
            timeout_s = binding.bundle.limits.tool_timeout_s
            async with self._lock:
                if self.binding is not binding:  # switched while this call waited
                    raise ToolFailure(ErrorClass.UNAVAILABLE, f"the instance now serves {self.binding.name!r}; "
                                                     "this session's environment is gone")
                if self.episode is not None:
                    self.episode.tool_calls += 1
                if self.episode is not None and self.episode.lost:
                    raise ToolFailure(ErrorClass.UNAVAILABLE, "episode lost; the environment must be reset")
                future = self._db(lambda: self.db.run_code(self.pool, request, timeout_s, writes=True))
                try:
                    # The worker's deadline is enforced on the database thread; this outer one only
                    # catches a thread stuck in the database past its statement timeout.
                    reply, state = await asyncio.wait_for(future, timeout_s * 2 + 30)
                except asyncio.TimeoutError:
                    self._wedge(f"tool {name} ran past {timeout_s:g} s")
                    raise ToolFailure(ErrorClass.TIMEOUT, f"{name} did not finish within {timeout_s:g} s") from None
                except WorkerFailure as exc:
                    self.metrics.worker_restarts.labels(exc.kind).inc()
                    if exc.kind == "timeout":
                        raise ToolFailure(ErrorClass.TIMEOUT, f"{name} did not finish within {timeout_s:g} s") from None
                    if exc.kind == "start":
                        raise ToolFailure(ErrorClass.UNAVAILABLE, f"{name}: {exc}") from None
                    raise ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: {exc}") from None
                except WeakIsolation as exc:
                    raise ToolFailure(ErrorClass.UNAVAILABLE, str(exc)) from None
                except DatabaseLost as exc:
                    self._lose(str(exc))
                    raise ToolFailure(ErrorClass.UNAVAILABLE, "environment database unavailable; "
                                                     "the episode is void") from exc
                result = self.runtime.outcome(name, reply, bool(state.get("timed_out")),
                                              bool(state.get("rolled_back")))
                self._log(episode, name, arguments, True, None, render(result))
                return result
        except ToolFailure as failure:
            outcome = failure.kind
            self._log(episode, name, arguments, False, failure.kind, str(failure))
            raise
        finally:
            tool = name if name in binding.runtime.names else "_unknown"
            self.metrics.tool_calls.labels(binding.name, tool, outcome).inc()
            self.metrics.tool_latency.labels(binding.name, tool).observe(time.perf_counter() - start)

    @staticmethod
    def _log(episode: Episode | None, name: str, arguments: Any, ok: bool, kind: str | None, text: str) -> None:
        if episode is not None:
            episode.steps.append(Step(tool=name, arguments=arguments, ok=ok, error_kind=kind,
                                      result=text[:MAX_LOGGED_RESULT]))

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

    async def reset(self, task_id: str | None, verify: bool = False, env: str | None = None) -> dict[str, Any]:
        """A new episode (of ``task_id``); with ``env``, of that environment (bound first if
        the instance serves another one: late binding's claim in one request)."""
        async with self._lock:  # one hold: no call reaches the new environment between bind and reset
            bound, switch_reset = await self._bind_locked(env) if env is not None else (None, None)
            task = None
            if task_id is not None:
                try:
                    task = self.bundle.task(task_id)
                except KeyError:
                    raise ControlError(404, f"unknown task id {task_id!r}",
                                       known=[t.id for t in self.bundle.tasks]) from None
                self._servable(task)
            if self.wedged:
                raise ControlError(503, "instance is restarting")
            was_connected = self.db.connected
            try:
                # A switch has just reset (or checksummed) the new environment's database and
                # started fresh workers: again would only repeat it, unless a checksum was asked
                # of a cached one.
                result = switch_reset if switch_reset is not None and (not verify or not bound["cached"]) \
                    else await self._db(lambda: self.db.reset(verify=verify))
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc
            except Exception as exc:  # noqa: BLE001 - e.g. NotPristine: never serve a wrong state
                self._wedge(f"reset failed: {exc}")
                raise ControlError(500, f"reset failed, instance is being replaced: {exc}") from exc
            self.pool.renew()  # the new episode's tool calls run on a worker that has run nothing
            if not was_connected:
                self.metrics.db_reconnects.inc()
            self.metrics.resets.labels(result.strategy).observe(result.ms / 1000)
            if result.escaped:
                self.metrics.escapes.inc()
                log.warning("episode escaped its transaction (%s): state repaired from the snapshot",
                            result.escaped)
            self.episode = Episode(uuid.uuid4().hex, task_id, ungated=bool(task and not self.gates[task.id][0]))
            if self.episode.ungated:
                self.metrics.ungated.inc()
        return {
            "episode_id": self.episode.id,
            "env": self.binding.name,
            **({"bind": bound} if bound is not None else {}),
            "task_id": task_id,
            "instruction": task.instruction if task else None,
            "reset_ms": round(result.ms, 3),
            "strategy": result.strategy,
            "pristine": result.pristine,
            "repaired": result.repaired,
            "escaped": result.escaped,
            "ungated": self.episode.ungated,
            "cached_envs": list(self._bindings),  # what a claim of it costs a reset (the operator files it so)
            # how long a verification may take besides the verifier's own limit: the client waits for it
            **({"judge_deadline_s": self.judge.settings.deadline_s} if self.judge is not None else {}),
        }

    def tend_workers(self) -> None:
        """Fork what the last answer left to fork: a switch's new workers, the replacements of
        the workers a reset or a verification retired. Called once the answer is sent (a fork
        then does not compete with it); the next call that needs a worker would do it anyway."""
        binding = self.binding
        if binding is None:
            return
        binding.start_workers()
        for pool in (binding.pool, binding.verifier_pool):
            if pool is not None:
                pool.replace_retired()

    def verifier_of(self, task: Task) -> Verifier:
        return task.select(self.verifier_kind)  # type: ignore[arg-type]

    def _servable(self, task: Task) -> None:
        """Refuse, with the reason, a task this instance must not serve: one that has not passed
        both gates (unless ungated tasks are allowed), or a judge task without a judge."""
        gated, why = self.gates[task.id]
        if not gated and not self.allow_ungated:
            raise ControlError(403, f"task {task.id!r} has not passed both gates ({why}); run `awm catalog "
                                    "validate --record` or serve with --allow-ungated", gate=why)
        if self.verifier_of(task).kind == "judge" and self.judge is None:
            raise ControlError(409, f"task {task.id!r} is judged by an LLM and this instance has no judge "
                                    "configured (--judge-base-url / --judge-model, or AWM_JUDGE_BASE_URL / "
                                    "AWM_JUDGE_MODEL)")

    async def verify(self, final_answer: str | None, kind: str | None = None) -> dict[str, Any]:
        """The episode's verdict, by the task's served verifier, or by its verifier of ``kind``
        (``code`` or ``judge``) when asked (OpenEnv's AWM protocol lets the client choose). The
        episode goes on: it may be verified again."""
        episode = self.episode
        if episode is None:
            raise ControlError(409, "no episode to verify: call reset first")
        if episode.task_id is None:
            raise ControlError(409, "the episode was reset without a task; nothing to verify")
        try:
            task = self.bundle.task(episode.task_id)
        except KeyError:  # switched to another environment since the reset
            raise ControlError(409, "the episode ended (switched) before it was verified") from None
        if kind is not None and kind not in {v.kind for v in task.verifiers()}:
            raise ControlError(409, f"task {task.id!r} has no {kind} verifier",
                               verifiers=[v.kind for v in task.verifiers()])
        verifier = task.select(kind) if kind is not None else self.verifier_of(task)  # type: ignore[arg-type]
        if episode.lost:
            verdict = Verdict("error", f"episode lost: {episode.lost}", "infra")
        elif not self.db.connected:
            verdict = Verdict("error", "episode lost: database connection is down", "infra")
        elif verifier.kind == "judge" and self.judge is None:
            verdict = Verdict("error", "this task is judged by an LLM and no judge is configured (--judge-base-url "
                                       "/ --judge-model, or AWM_JUDGE_BASE_URL / AWM_JUDGE_MODEL)", "judge")
        else:
            code = "\n\n".join(x for x in (self.bundle.verifier_prelude, verifier.code) if x)
            timeout_s = self.bundle.limits.verifier_timeout_s
            judged = verifier.kind == "judge"
            async with self._lock:
                if self.episode is not episode:  # a reset or a switch came first: that episode is gone
                    raise ControlError(409, "the episode ended (reset or switched) before it was verified")
                try:
                    images = await self._sqlite_images() if verifier.inputs == "sqlite" else None
                    verdict = await self._db(lambda: verify_in_worker(
                        self.db, self.verifier_pool, code, verifier.entrypoint, final_answer, timeout_s, images,
                        evidence=judged))
                except DatabaseLost as exc:
                    self._lose(str(exc))
                    verdict = Verdict("error", f"episode lost: {exc}", "infra")
                except Exception as exc:  # noqa: BLE001 - reported as the verdict
                    verdict = Verdict("error", f"could not prepare the verification: {exc}", "infra")
            if episode.lost:  # lost while the verifier was reading
                verdict = Verdict("error", f"episode lost: {episode.lost}", "infra", verdict.ms)
            elif judged and verdict.verdict == "evidence":
                verdict = await self._judge(task, verifier, verdict, list(episode.steps), final_answer)
        self.metrics.episodes.labels(self.binding.name, verdict.verdict).inc()
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
            "verifier_kind": verifier.kind,
            "ungated": episode.ungated,
            **({"evidence": verdict.evidence} if verdict.evidence is not None else {}),
            **({"judge": verdict.judge} if verdict.judge is not None else {}),
        }

    async def _judge(self, task: Task, verifier: Verifier, evidence: Verdict, steps: list[Step],
                     final_answer: str | None) -> Verdict:
        """Outside the instance lock: the judge needs no database, and health checks, metrics and
        a reset (which ends this episode anyway) need not wait for an LLM."""
        assert self.judge is not None  # reset refuses judge tasks without one
        result = await self.judge.judge(task.instruction, evidence.evidence, steps, final_answer,
                                        verifier.success_criteria, verifier.failure_criteria)
        self.metrics.judge_latency.observe(result.ms / 1000)
        self.metrics.judge_verdicts.labels(result.classification).inc()
        self.metrics.judge_tokens.labels("prompt").inc(result.prompt_tokens)
        self.metrics.judge_tokens.labels("completion").inc(result.completion_tokens)
        if result.cached:
            self.metrics.judge_cache_hits.inc()
        verdict = from_judgement(result, evidence.evidence)
        verdict.ms += evidence.ms
        return verdict

    async def sqlite_image(self, state: str) -> bytes:
        """The database as the AWM convention's SQLite file: the episode's ``initial`` state (the
        snapshot) or its ``final`` one (now). OpenEnv's AWM protocol keeps both for a client that
        asks (``done`` with ``keep_session``)."""
        if self.bundle.database.sqlite_ddl is None:
            raise ControlError(409, f"environment {self.binding.name!r} has no SQLite form (it was not imported "
                                    "from AWM-1K)")
        async with self._lock:
            try:
                return (await self._sqlite_images())[state]
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc

    async def _sqlite_images(self) -> dict[str, bytes]:
        """AWM convention: SQLite images of the snapshot (built once) and of the final state."""
        from awm.postgres.sqlite_export import build_sqlite

        ddl = self.bundle.database.sqlite_ddl or ""
        binding = self.binding
        if binding.initial_sqlite is None:
            binding.initial_sqlite = await self._db(lambda: build_sqlite(ddl, binding.db.read_tables(True)))
        final = await self._db(lambda: build_sqlite(ddl, binding.db.read_tables(False)))
        return {"initial": binding.initial_sqlite, "final": final}

    async def diff(self, rows: int = 0) -> dict[str, Any]:
        """Rows inserted/updated/deleted per table since the reset; with ``rows`` > 0 also the rows
        themselves (at most that many per table), before and after."""
        async with self._lock:
            try:
                if rows <= 0:
                    return {"episode_id": self.episode.id if self.episode else None, "tables": await self._db(self.db.diff)}
                # one scan per table, not two: the counts are the rows' unless a table was cut at the limit
                changed = await self._db(lambda: self.db.diff_rows(rows))
                cut = [t for t, e in changed.items() if e["truncated"]]
                tables = await self._db(lambda: self.db.diff(cut)) if cut else {}
            except DatabaseLost as exc:
                raise ControlError(503, f"database unavailable: {exc}") from exc
        for table, entry in changed.items():
            if not entry["truncated"]:
                tables[table] = {k: len(entry[k]) for k in ("inserted", "updated", "deleted")}
        return {"episode_id": self.episode.id if self.episode else None, "tables": dict(sorted(tables.items())),
                "rows": changed}

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
            # Late binding: which environments this instance may serve and keeps ready.
            "late_binding": self.databases.late,
            "database": self.binding.database or None,  # the provisioner's name for it (late binding)
            "cached_envs": list(self._bindings),
            "switches": self.switches,
            "tools": [t.name for t in self.bundle.tools],
            "tasks": [{"id": t.id, "instruction": t.instruction, "verifier_kind": self.verifier_of(t).kind,
                       "gated": self.gates[t.id][0], "gate": self.gates[t.id][1],
                       "served": self.gates[t.id][0] or self.allow_ungated} for t in self.bundle.tasks],
            "allow_ungated": self.allow_ungated,
            "judge": ({"model": self.judge.settings.model, "votes": self.judge.settings.votes,
                       "temperature": self.judge.settings.temperature} if self.judge else None),
            # What confines tool and verifier code here (the layers applied, and any missing).
            "isolation": self.pool.isolation or self._isolation,
            "verifier_isolation": self.verifier_pool.isolation or self._isolation,
        }
