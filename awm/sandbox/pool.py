"""The server side of the workers: start them confined, talk to them, kill and replace them.

A worker is started ahead of time (an interpreter start costs ~50 ms; an app's import more), so a
tool call or a verification costs pipe round trips. Everything is synchronous and meant to be
driven from one thread (the env server's database thread): while a worker runs a call, its
``sql``/``query`` requests are answered by the ``handle`` callback of the caller, which owns the
database connection. The worker is never trusted: a message that is malformed, too large, out of
turn or late gets it killed (``SIGKILL``) and replaced, and the caller gets a :class:`WorkerFailure`
saying why. A replacement is spawned by a dedicated long-lived thread (``PR_SET_PDEATHSIG`` fires
when the *thread* that spawned a child ends, so short-lived threads must not spawn workers).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from awm import settings
from awm.jsonlimits import depth_exceeds, map_strings
from awm.sandbox import codec, confine, forkserver
from awm.sandbox.forkserver import Zygote

MAX_MESSAGE = 64 * 1024 * 1024  # one line from a worker (a result, a query's SQL)
MAX_DEPTH = 100  # nesting of a worker's message (a result is rendered and logged by the server)
START_TIMEOUT_S = 60.0
Handler = Callable[[dict[str, Any]], dict[str, Any]]

_OWN_PACKAGES = ("awm", "awm_fleet", "awm_operator")


@functools.lru_cache(maxsize=1)
def _host_prefixes() -> list[str]:  # fixed for the process's life: computed once
    """Paths of this machine that untrusted code can learn (its own sys.path, module files) and
    that must not reach an agent or a log through its output."""
    home = os.path.expanduser("~")
    # AWM_HOME as set (its text, not a normalised Path: the prefix as it appears in paths made from it)
    found = {_package_root(), sys.prefix, sys.base_prefix, sys.exec_prefix, *_site_dirs(),
             settings.var.AWM_HOME.raw() or "", home if home not in ("/", "") else ""}
    found |= {os.path.realpath(p) for p in found if p}
    return sorted((p for p in found if len(p) > 1), key=len, reverse=True)


def redact(value: Any, prefixes: list[str]) -> Any:
    """``value`` with every host path prefix replaced by ``<host>`` (strings and keys, at any
    depth: the walk is iterative)."""
    def scrub(text: str) -> str:
        for prefix in prefixes:
            if prefix in text:
                text = text.replace(prefix, "<host>")
        return text

    return map_strings(value, scrub)


class WorkerFailure(Exception):
    """The worker failed the call: ``kind`` is timeout | crash | protocol | start."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WeakIsolation(RuntimeError):
    """A required confinement layer is missing and weaker isolation was not accepted."""


@dataclass
class WorkerSpec:
    """What every worker of a pool is started with and loaded with."""

    memory_mb: int = 512
    load: dict[str, Any] = field(default_factory=dict)  # the ``load`` request: tools, prelude, app
    allow_weak_isolation: bool = False

    @property
    def app(self) -> bool:
        return bool(self.load.get("app"))

    @functools.cached_property
    def load_key(self) -> str:
        """Names ``load`` to the fork server, which keeps each load it was sent (compiled)."""
        return hashlib.sha256(codec.encode(self.load)).hexdigest()


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib")})


@functools.lru_cache(maxsize=2)
def read_paths(app: bool) -> list[str]:
    """What a worker may read once confined: the standard library, shared libraries, time zones;
    for apps also the installed packages, except this project's own."""
    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    paths = {stdlib, os.path.realpath(os.path.dirname(os.__file__)), "/usr/share/zoneinfo"}
    dynload = sysconfig.get_config_var("DESTSHARED")
    if dynload:
        paths.add(os.path.realpath(dynload))
    for lib in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", sysconfig.get_config_var("LIBDIR")):
        if lib and os.path.isdir(lib):
            paths.add(os.path.realpath(lib))
    if app:
        for site in _site_dirs():
            for entry in os.listdir(site):
                base = entry.split("-")[0].split(".")[0]
                if base in _OWN_PACKAGES or entry.startswith("__editable__") or entry.endswith(".pth"):
                    continue
                paths.add(os.path.join(site, entry))
    return sorted(paths)


def _layers() -> list[str]:
    # Benchmarks switch layers off to measure them; anything less than all is weak ("": none).
    layers = settings.AWM_SANDBOX_LAYERS
    return list(confine.LAYERS) if layers is None else layers


def _zygote_paths() -> tuple[list[str], list[str]]:
    """A zygote's ``sys.path`` (this project and the installed packages) and what it drops from
    it once imported (this project's code, unless installed among the packages)."""
    sites = _site_dirs()
    root = _package_root()
    return ([root, *sites] if root not in sites else sites), ([root] if root not in sites else [])


def make_zygote(app: bool, max_envs: int = forkserver.MAX_ENVS) -> Zygote:
    """A fork server for this process's workers (one per env server and kind of code is enough:
    it only forks), keeping the environment zygotes of ``max_envs`` environments. Forked by the
    local fleet's template when this env server was told of one
    (:data:`awm.sandbox.forkserver.TEMPLATE_ENV`), else started here."""
    sys_path, drop_paths = _zygote_paths()
    return Zygote(sys_path, drop_paths, app, _layers(), read_paths(app), max_envs=max_envs)


def start_template(path: str) -> subprocess.Popen[bytes]:
    """A local fleet's template of app zygotes on the Unix socket ``path``
    (:func:`awm.sandbox.forkserver.start_template`)."""
    return forkserver.start_template(path, *_zygote_paths())


class Worker:
    """One running worker (a child of the fork server) and its pipes.

    The server never blocks on a worker: reads and writes wait at most until the call's deadline
    (a worker that does not read its requests cannot hold the server's write)."""

    def __init__(self, spec: WorkerSpec, zygote: Zygote) -> None:
        to_child, self._wfd = os.pipe()
        self._rfd, from_child = os.pipe()
        self._zygote = zygote
        self.pidfd: int | None = None
        self._pid = 0
        try:
            config = {"memory_mb": spec.memory_mb, "app": spec.app, "read_paths": list(read_paths(spec.app)),
                      "layers": _layers(), "allow_weak_isolation": spec.allow_weak_isolation}
            self._pid, self.pidfd = zygote.spawn(config, to_child, from_child, spec.load_key, spec.load)
        except BaseException:
            for fd in (self._wfd, self._rfd):
                os.close(fd)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        os.set_blocking(self._wfd, False)
        self._dead = self._stopped = False
        self._status: int | None = None
        self._buffer = b""
        self._prefixes = _host_prefixes()
        self.isolation: dict[str, Any] = {}
        self.calls = 0
        try:
            hello = self._read(time.monotonic() + START_TIMEOUT_S)
            if hello.get("op") != "ready":
                raise WorkerFailure("start", f"worker said {hello.get('op')!r} instead of ready")
            self.isolation = dict(hello.get("isolation") or {})
            if not self.isolation.get("strong") and not spec.allow_weak_isolation:
                raise WeakIsolation(
                    "refusing to run untrusted code: confinement layers missing: "
                    + json.dumps(self.isolation.get("missing")) + " (accept weaker isolation explicitly "
                    "with --allow-weak-isolation / AWM_ALLOW_WEAK_ISOLATION=1)")
            loaded = hello.get("loaded")
            if not isinstance(loaded, dict) or loaded.get("op") != "loaded":
                reason = loaded.get("reason", loaded) if isinstance(loaded, dict) else loaded
                raise WorkerFailure("start", f"code failed to load: {redact(reason, self._prefixes)}")
        except BaseException:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        return self._pid

    def stop(self) -> None:
        """SIGKILL (through the pidfd: never another process that reused the pid); one syscall,
        so a caller on a request's path can end a worker at once and leave :meth:`kill` (the
        reaping) to another thread."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self._pid, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass

    def kill(self) -> None:
        """Stop, reap, close."""
        if self._dead:
            return
        self._dead = True
        self.stop()
        self._status = self._zygote.reap(self._pid)
        for fd in (self._wfd, self._rfd, self.pidfd):
            if fd is not None:
                os.close(fd)

    def _died(self) -> WorkerFailure:
        self.kill()
        code = self._status
        if code is None:
            return WorkerFailure("crash", "worker process died")
        if os.WIFSIGNALED(code):
            how = f"killed by signal {os.WTERMSIG(code)}"
        else:
            how = f"exit code {os.waitstatus_to_exitcode(code)}"
        return WorkerFailure("crash", f"worker process died ({how})")

    def _read(self, deadline: float) -> dict[str, Any]:
        fd = self._rfd
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerFailure("timeout", "ran past its time limit")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise self._died()
            self._buffer += chunk
            if len(self._buffer) > MAX_MESSAGE and b"\n" not in self._buffer:
                raise WorkerFailure("protocol", f"worker sent a message over {MAX_MESSAGE >> 20} MiB")
        line, self._buffer = self._buffer.split(b"\n", 1)
        try:
            message = codec.decode(line)
        except (ValueError, TypeError, RecursionError) as exc:
            raise WorkerFailure("protocol", f"worker sent a malformed message: {exc}") from None
        if depth_exceeds(message, MAX_DEPTH):
            raise WorkerFailure("protocol", f"worker sent a value nested deeper than {MAX_DEPTH} levels")
        return message

    def quiet(self) -> bool:
        """Nothing unread on the pipe: a worker speaks only when asked, so anything it sent
        between calls (from a signal handler, say) means it is not to be trusted again."""
        if self._buffer or self._dead:
            return False
        readable, _, _ = select.select([self._rfd], [], [], 0)
        return not readable

    def _send(self, message: dict[str, Any], deadline: float) -> None:
        data = memoryview(codec.encode(message))
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerFailure("timeout", "did not read its requests in time")
            _, writable, _ = select.select([], [self._wfd], [], remaining)
            if not writable:
                continue
            try:
                data = data[os.write(self._wfd, data):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise self._died() from None

    def request(self, message: dict[str, Any], handle: Handler, timeout_s: float) -> dict[str, Any]:
        """Send one request; answer the worker's ``sql``/``query`` requests with ``handle`` until it
        sends its final reply. Raises :class:`WorkerFailure`; the worker must then be killed."""
        deadline = time.monotonic() + timeout_s
        self.calls += 1
        self._send(message, deadline)
        while True:
            reply = self._read(deadline)
            if reply.get("op") in ("sql", "query"):
                answer = handle(reply)
                if time.monotonic() > deadline:
                    raise WorkerFailure("timeout", "ran past its time limit")
                self._send(answer, deadline)
                continue
            if self._buffer:
                raise WorkerFailure("protocol", "worker sent more than one final reply")
            return redact(reply, self._prefixes)


class WorkerPool:
    """``size`` warm workers (plus ``spares`` started ahead), forked from a fork server; a failed
    one is killed and replaced in the background.

    A worker never serves two episodes: :meth:`renew` (called at every reset) retires each worker
    that has run untrusted code since the last renewal, so the next call runs on a fresh copy of
    the fork server, with nothing a previous episode's code planted (rebound functions, module
    state, a verifier's cache). ``single_use`` pools (verifiers) retire a worker after every
    request. Retiring (kill, reap) and spawning happen on the pool's spawner thread, off the
    caller's path; a spare that is already running takes the next episode's first call, so a
    reset does not wait for a fork. A retired worker is stopped at once, but its reaping and its
    replacement wait for :meth:`replace_retired`, which the env server calls once its answer to
    the reset or the verification is sent (the fork then does not compete with that answer), and
    which the next request calls in any case."""

    def __init__(self, spec: WorkerSpec, size: int = 1, zygote: Zygote | None = None,
                 single_use: bool = False, spares: int = 0) -> None:
        self.spec = spec
        self.size = size
        self.spares = spares
        self.single_use = single_use
        self._own_zygote = zygote is None
        self.zygote = zygote if zygote is not None else make_zygote(spec.app)
        self._fresh: queue.Queue[Worker | BaseException] = queue.Queue()  # never ran code
        self._used: queue.Queue[Worker] = queue.Queue()  # ran code in the current episode
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="awm-worker-spawn")
        self._live: set[Worker] = set()
        self._retired: list[Worker] = []  # stopped; reaped and replaced by replace_retired()
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self.isolation: dict[str, Any] = {}
        self.replaced = 0
        self.renewed = 0
        self.started = False  # an unstarted pool starts at its first request
        self._owed = 0  # spares not started yet (start(spares=False))
        self.closed = False

    def start(self, wait: bool = True, after: Future[None] | None = None, spares: bool = True) -> Future[None] | None:
        """Start every worker; ``wait``: block until they run and raise what the first one raised
        (else the first request waits for its worker, and gets any failure). ``after``: begin
        once that spawn (another pool's) is done, so that the worker needed first is forked first.
        ``spares=False``: the spares later, at :meth:`start_spares`. Returns the first worker's
        spawn; None (and nothing done) if the pool was started."""
        with self._lock:
            if self.started:
                return None
            self.started = True
            if not spares:
                self._owed = self.spares
        count = self.size + (self.spares if spares else 0)
        futures = [self._spawn(after=after if i == 0 else None) for i in range(count)]
        if not wait:
            return futures[0] if futures else None
        for future in futures:
            future.result()
        first = self._fresh.get()
        if isinstance(first, BaseException):
            raise first
        self._fresh.put(first)
        return futures[0] if futures else None

    def _spawn(self, retire: Worker | None = None, after: Future[None] | None = None) -> Future[None]:
        def spawn() -> None:
            if after is not None:
                wait_for([after], timeout=START_TIMEOUT_S)
            if retire is not None:
                retire.kill()
            if self.closed:
                return
            try:
                worker = Worker(self.spec, self.zygote)
            except BaseException as exc:  # noqa: BLE001 - handed to the next caller
                self._fresh.put(exc)
                return
            with self._lock:
                if self.closed:
                    worker.kill()
                    return
                self._live.add(worker)
            self.isolation = worker.isolation
            self._fresh.put(worker)

        future = self._spawner.submit(spawn)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    @property
    def ready(self) -> bool:
        return not self.closed and (not self.started or self._fresh.qsize() > 0 or self._used.qsize() > 0
                                    or bool(self._pending) or bool(self._retired))  # started when due

    def _acquire(self, timeout_s: float) -> Worker:
        """The current episode's worker if it has one idle, else a fresh one."""
        if not self.started:
            self.start(wait=False)
        self.replace_retired()
        try:
            return self._used.get_nowait()
        except queue.Empty:
            pass
        try:
            item = self._fresh.get(timeout=timeout_s)
        except queue.Empty:
            raise WorkerFailure("start", "no worker became ready in time") from None
        if isinstance(item, BaseException):
            self._spawn()  # try again for the next caller
            if isinstance(item, WeakIsolation):
                raise item
            raise WorkerFailure("start", f"worker failed to start: {item}") from item
        return item

    def _replace(self, worker: Worker) -> None:
        self.replaced += 1
        worker.stop()
        with self._lock:
            self._live.discard(worker)
        self._spawn(retire=worker)

    def _retire(self, worker: Worker) -> None:
        """Stop ``worker`` now; :meth:`replace_retired` reaps it and starts its replacement."""
        worker.stop()
        with self._lock:
            self._live.discard(worker)
            self._retired.append(worker)

    def start_spares(self) -> None:
        """Start the spares a :meth:`start` with ``spares=False`` left for later."""
        with self._lock:
            owed, self._owed = self._owed, 0
        for _ in range(owed):
            self._spawn()

    def replace_retired(self) -> None:
        """Reap the retired workers and start their replacements, on the spawner thread."""
        with self._lock:
            retired, self._retired = self._retired, []
        for worker in retired:
            self._spawn(retire=worker)

    def renew(self) -> None:
        """A new episode begins: no worker that ran code in an earlier one serves it."""
        while True:
            try:
                worker = self._used.get_nowait()
            except queue.Empty:
                return
            self.renewed += 1
            self._retire(worker)

    def run(self, message: dict[str, Any], handle: Handler, timeout_s: float) -> dict[str, Any]:
        """One request on a warm worker. On any :class:`WorkerFailure` the worker is replaced."""
        worker = self._acquire(max(timeout_s, START_TIMEOUT_S))
        while not worker.quiet():
            self._replace(worker)
            worker = self._acquire(START_TIMEOUT_S)
        try:
            reply = worker.request(message, handle, timeout_s)
        except BaseException:
            self._replace(worker)
            raise
        if self.single_use:
            self._retire(worker)
        else:
            self._used.put(worker)
        return reply

    def pids(self) -> list[int]:
        with self._lock:
            return [w.pid for w in self._live]

    def close(self) -> None:
        self.closed = True
        for future in list(self._pending):
            future.cancel()
        self._spawner.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            workers, self._live = list(self._live) + self._retired, set()
            self._retired = []
        for worker in workers:
            worker.kill()
        if self._own_zygote:
            self.zygote.close()


def isolation_facilities() -> dict[str, Any]:
    """What this machine offers, without starting a worker (for ``/info`` and start-up logs)."""
    return confine.probe().as_dict()
