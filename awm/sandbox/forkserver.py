"""A fork server for workers: every worker starts as a fresh copy of one pre-imported process.

Why: a worker must never outlive its episode (code of episode N could otherwise rebind the
worker's own functions, found by name, stack frames or ``gc``, and forge episode N+1's verdict),
yet a reset must stay sub-millisecond. Starting an interpreter per episode costs ~50 ms of CPU; a
``fork`` of a process that has already imported everything costs about a millisecond. So each env
server keeps one **zygote**: started like a worker (``python -I -S``, empty environment, no
database connection, no credential), it imports the worker's modules (and, for imported apps,
FastAPI and SQLAlchemy), enters its own user, mount and network namespaces and builds the file
view (:func:`awm.sandbox.confine._fsview`) once, and then only forks. It
never runs untrusted code: every child confines itself (rlimits, Landlock, seccomp) before it
reads any, and a child's memory is its own copy, so nothing a child does reaches the zygote or a
later child.

Protocol on a private unix socket (``SOCK_SEQPACKET``: one message per request, descriptors
passed with ``SCM_RIGHTS``):

* server → zygote ``{"op": "spawn", "config": {...}, "load_key": K, "load": {...}}`` with two
  descriptors (the child's request pipe to read, its reply pipe to write) → ``{"op": "spawned",
  "pid": N}`` with a pidfd of the child, so that the server can kill it without racing pid reuse.
  ``load`` (the code the child loads once confined: tool prelude, tools, app) is sent the first
  time a key is used and kept by the zygote, compiled; later spawns name only its key, so a spawn
  moves a few hundred bytes however large the environment's code is;
  A zygote asked for a key it does not hold answers ``{"op": "unknown_load"}`` (the server
  then sends the load);
* server → zygote ``{"op": "reap", "pid": N}`` → ``{"op": "reaped", "status": S}``: the zygote waits
  for its (already killed) child and says how it ended.

The zygote dies with the server (``PR_SET_PDEATHSIG``), and its children with it.

**One environment per fork server.** The zygote above never holds an environment's code: it
forks, per environment, an **environment zygote** (``{"op": "env"}`` with the new process's
control socket → ``{"op": "env_forked", "pid": N}`` and its pidfd), which inherits the namespaces
and file view and then speaks the protocol above (spawn, reap) on its own socket. Loads go to it
alone, and every worker is a copy of its memory. The server dedicates its zygote to one
environment at a time (:meth:`Zygote.dedicate`, at every switch of a late-binding instance):
spawns go to that environment's zygote, kept from when it was served last (up to ``max_envs``, the
instance's cached environments) or forked from the clean zygote at the next spawn, and spawns of
another environment's code are refused. So no worker of environment B is ever a copy of a process
that held A's code, not even in memory freed since (issue 45), and a new environment costs a fork
and a compile of its code, not a new zygote's namespaces and file view. The clean zygote is the
subreaper of its environment zygotes' orphans and reaps them, and everything it forks, itself.

In a local fleet a zygote is not started by its env server but forked by the fleet's **template**
(:func:`start_template`, socket named by ``AWM_FORK_TEMPLATE``): one process that imported and
warmed up the frameworks once, so that every instance's zygote and workers share those pages
instead of holding a copy each. Such a zygote exits when its server hangs up its control socket,
and with the template; everything else about it is as above.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from awm.sandbox import confine
from awm.sandbox.channel import load_sources

MAX_CONTROL = 1 << 20
COMMON_MODULES = ("re", "json", "datetime", "decimal", "math", "random", "string", "uuid", "hashlib",
                  "collections", "itertools", "functools", "typing", "dataclasses", "enum", "statistics")
DEBUG = False
_BOOT = ("import json, sys; c = json.loads(sys.argv[1]); sys.path[:0] = c['sys_path']; "
         "from awm.sandbox.forkserver import main; main()")


# A local fleet's template of zygotes (:func:`start_template`): its socket, for the env servers,
# is named by awm.settings' AWM_FORK_TEMPLATE (``TEMPLATE_ENV`` here: see :func:`__getattr__`).
TEMPLATE_TIMEOUT_S = 60.0


def __getattr__(name: str) -> Any:
    """``TEMPLATE_ENV``: the variable naming a fleet's template socket, as awm.settings declares it.

    This module is the zygote's, the template's and (forked) every worker's, which start with an
    empty environment and never read a variable: awm.settings (and pathlib with it, ~0.5 MB in a
    tool zygote) is imported only by the functions that run in the env server or the fleet, and
    here when the name is asked for."""
    if name == "TEMPLATE_ENV":
        from awm import settings

        return settings.names.AWM_FORK_TEMPLATE
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ZygoteError(RuntimeError):
    """The zygote is gone or answered out of protocol; a new one is started on the next spawn."""


def _recv(sock: socket.socket, max_fds: int) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_CONTROL, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("control socket closed")
    return json.loads(data), list(fds)


_LAUNCHER = ThreadPoolExecutor(1, thread_name_prefix="awm-zygote-launcher")  # never shut down
# In the zygote: the loads its children run, by key, least recently used first. Both ends keep
# the same MAX_LOADS most recent keys (the server sends a load again once the zygote dropped it),
# so that a late-binding instance that serves hundreds of environments over its life does not
# grow the process every fork copies.
MAX_LOADS = 32
MAX_ENVS = 4  # environment zygotes a fork server keeps (a late-binding instance: its cached environments)
_LOADS: OrderedDict[str, dict[str, Any]] = OrderedDict()
_loads_limit = MAX_LOADS  # in the zygote: the limit its server configured
_RULESETS: dict[tuple[str, ...], int | None] = {}  # in the zygote: Landlock rulesets, by read paths
_DEV_DIR = -1  # in the zygote: the host's /dev (:func:`_quiet`)


class _Forked:
    """A zygote forked by a fleet's template, or an environment zygote, so not this process's
    child: watched and killed through its pidfd (no pid reuse can mistake it), as
    ``subprocess.Popen`` would be. Where the kernel gives no pidfd (gVisor has no ``pidfd_open``),
    by its pid, as a worker is there."""

    def __init__(self, pid: int, pidfd: int | None) -> None:
        self.pid = pid
        self._fd: int | None = pidfd
        self._by_pid = pidfd is None
        self.returncode: int | None = None

    def _gone(self) -> bool:
        try:
            os.kill(self.pid, 0)  # its parent reaps it at once (SIGCHLD ignored): no zombie lingers
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def poll(self) -> int | None:
        if self.returncode is None:
            if self._fd is not None and select.select([self._fd], [], [], 0)[0]:
                self.returncode = -1  # exited (its status went to its parent, which reaps it)
            elif self._by_pid and self._gone():
                self.returncode = -1
        return self.returncode

    def kill(self) -> None:
        try:
            if self._fd is not None:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            elif self._by_pid and self.returncode is None:
                os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass

    def wait(self) -> int:
        if self._fd is not None:
            select.select([self._fd], [], [])  # readable once the process has exited
            os.close(self._fd)
            self._fd = None
        elif self._by_pid:
            deadline = time.monotonic() + 10.0
            while not self._gone() and time.monotonic() < deadline:
                time.sleep(0.005)
        self.returncode = -1 if self.returncode is None else self.returncode
        return self.returncode


@dataclass
class _Env:
    """An environment zygote as the server holds it."""

    proc: _Forked
    sock: socket.socket
    loads: OrderedDict[str, None] = field(default_factory=OrderedDict)  # what it holds, as it does


class Zygote:
    """The server's handle on one zygote process and its environment zygotes (thread-safe; any of
    them is started again when it died)."""

    def __init__(self, sys_path: list[str], drop_paths: list[str], app: bool, layers: list[str],
                 read_paths: list[str] | None = None, max_loads: int = MAX_LOADS, max_envs: int = MAX_ENVS) -> None:
        self._config = {"sys_path": sys_path, "drop_paths": drop_paths, "app": app, "layers": layers,
                        "read_paths": list(read_paths or []), "max_loads": max_loads}
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | _Forked | None = None
        self._sock: socket.socket | None = None
        # Environment zygotes by the load key of their environment, least recently served first:
        # a late-binding instance keeps those of the environments it keeps cached (``max_envs``),
        # so that a switch back to one forks nothing.
        self._envs: OrderedDict[str | None, _Env] = OrderedDict()
        self._max_envs = max(1, max_envs)
        self._owners: dict[int, _Env] = {}  # worker pid -> the environment zygote that forked it
        # The load key of the environment served now (dedicate); None: any. Spawns of another
        # environment's code are refused, so that a pool of an environment switched away from can
        # never send its code to another environment's zygote.
        self._dedicated: str | None = None
        self.isolation: dict[str, Any] = {}

    def _start(self) -> None:
        from awm import settings  # in the env server (never in a zygote: see __getattr__ above)

        template = settings.AWM_FORK_TEMPLATE
        if template:
            try:
                self._start_forked(template)
                return
            except (OSError, EOFError, ValueError, ZygoteError):
                self._stop()  # the fleet's template is gone or refused: a zygote of our own
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # AWM_DEBUG_ZYGOTE=1: the zygote and its children keep this process's stderr (tracebacks).
        debug = settings.AWM_DEBUG_ZYGOTE
        config = {**self._config, "parent": os.getpid(), "control_fd": theirs.fileno(), "debug": debug}
        try:
            # Started from one thread that lives as long as this process: the zygote dies with its
            # parent through PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits
            # (a worker pool's spawner thread ends when the pool closes, e.g. at a switch of
            # environment, and took the zygote with it).
            self._proc = _LAUNCHER.submit(
                subprocess.Popen, [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None if debug else subprocess.DEVNULL,
                env={}, cwd="/", close_fds=True, pass_fds=(theirs.fileno(),)).result()
        finally:
            theirs.close()
        self._ready(ours)

    def _start_forked(self, path: str) -> None:
        """Have the fleet's template (:func:`start_template`) fork our zygote: it shares the
        template's imported and warmed-up frameworks with every other instance's zygote."""
        from awm import settings  # in the env server, as in _start

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
                conn.settimeout(TEMPLATE_TIMEOUT_S)  # the template may still be importing (a fleet's start)
                conn.connect(path)
                config = {**self._config, "debug": settings.AWM_DEBUG_ZYGOTE}
                socket.send_fds(conn, [json.dumps({"op": "zygote", "config": config}).encode()], [theirs.fileno()])
                reply, fds = _recv(conn, 1)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        if reply.get("op") != "forked" or len(fds) != 1:
            ours.close()
            for fd in fds:
                os.close(fd)
            raise ZygoteError(f"the fleet's template said {reply.get('reason', reply)!r}")
        self._proc = _Forked(int(reply["pid"]), fds[0])
        self._ready(ours)

    def _ready(self, ours: socket.socket) -> None:
        """Wait for the new zygote's ``ready`` on its control socket."""
        self._sock = ours
        hello, fds = _recv(ours, 0)
        if hello.get("op") != "ready":
            raise ZygoteError(f"zygote said {hello.get('op')!r} instead of ready")
        self.isolation = dict(hello.get("isolation") or {})

    def _fork_env(self) -> tuple[_Forked, socket.socket]:
        """Fork an environment zygote from the clean one (which must be running); wait for it."""
        assert self._sock is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            socket.send_fds(self._sock, [json.dumps({"op": "env"}).encode()], [theirs.fileno()])
            reply, fds = _recv(self._sock, 1)
        except (OSError, EOFError, ValueError) as exc:
            ours.close()
            raise ZygoteError(f"zygote failed: {exc}") from None
        finally:
            theirs.close()
        if reply.get("op") != "env_forked" or len(fds) > 1:
            ours.close()
            for fd in fds:
                os.close(fd)
            raise ZygoteError(f"zygote could not fork an environment zygote: {reply.get('reason', reply)}")
        proc = _Forked(int(reply["pid"]), fds[0] if fds else None)  # no pidfd: a kernel without pidfd_open
        try:
            hello, _ = _recv(ours, 0)
            if hello.get("op") != "ready":
                raise ValueError(f"said {hello.get('op')!r} instead of ready")
        except (OSError, EOFError, ValueError) as exc:
            _retire(proc, ours)
            raise ZygoteError(f"environment zygote failed: {exc}") from None
        return proc, ours

    def _current(self) -> _Env:
        """The environment zygote of the environment served now, either process started (again)
        if it is not running; with the lock held."""
        if self._proc is None or self._proc.poll() is not None:
            self._stop()
            self._start()
        key = self._dedicated
        env = self._envs.get(key)
        if env is None or env.proc.poll() is not None:
            if env is not None:
                self._drop_env(key)
            try:
                env = self._envs[key] = _Env(*self._fork_env())
            except ZygoteError:
                self._stop()  # the clean zygote too: the next spawn starts both again
                raise
        self._envs.move_to_end(key)
        while len(self._envs) > self._max_envs:
            self._drop_env(next(iter(self._envs)))
        return env

    def _drop_env(self, key: str | None) -> None:
        """Retire an environment zygote (off this thread: its workers die with it)."""
        env = self._envs.pop(key, None)
        if env is not None:
            self._owners = {pid: e for pid, e in self._owners.items() if e is not env}
            _RETIRER.submit(_retire, env.proc, env.sock)

    def _exchange(self, env: _Env, message: dict[str, Any], fds: list[int],
                  max_fds: int) -> tuple[dict[str, Any], list[int]]:
        """One request to an environment zygote and its reply, with the lock held."""
        try:
            socket.send_fds(env.sock, [json.dumps(message).encode()], fds)
            return _recv(env.sock, max_fds)
        except (OSError, EOFError, ValueError) as exc:
            for key, held in list(self._envs.items()):
                if held is env:
                    self._drop_env(key)
            raise ZygoteError(f"zygote failed: {exc}") from None

    def dedicate(self, load_key: str | None) -> None:
        """Serve the environment whose load is ``load_key`` from now on (None: any, as before the
        first call; "": none, a verifier's empty load only). Its
        environment zygote is the one kept from when it was served last, else forked from the
        clean zygote at the next spawn: either has never held another environment's code."""
        with self._lock:
            self._dedicated = load_key
            if load_key in self._envs:
                self._envs.move_to_end(load_key)

    def forget(self, load_key: str) -> None:
        """The environment whose load is ``load_key`` is no longer kept: its environment zygote
        goes (the instance dropped it from its cache)."""
        with self._lock:
            if load_key != self._dedicated:
                self._drop_env(load_key)

    def spawn(self, config: dict[str, Any], child_read: int, child_write: int, load_key: str,
              load: dict[str, Any]) -> tuple[int, int | None]:
        """Fork a worker reading ``child_read`` and writing ``child_write``: (pid, pidfd). Once
        confined, it loads ``load`` (sent to the environment zygote the first time ``load_key`` is
        used, and again whenever it says it does not hold it: a restarted one holds nothing).
        A load with code of another environment than the dedicated one is refused."""
        with self._lock:
            if self._dedicated is not None and load_key != self._dedicated and _has_code(load):
                raise ZygoteError("this fork server serves another environment now")
            for attempt in range(2):
                env = self._current()  # (a new environment zygote holds no load) before deciding what to send
                known = attempt == 0 and load_key in env.loads
                message = {"op": "spawn", "config": config, "load_key": load_key, "load": None if known else load}
                reply, fds = self._exchange(env, message, [child_read, child_write], 1)
                if reply.get("op") == "unknown_load":
                    env.loads.pop(load_key, None)
                    continue
                _remember(env.loads, load_key, None, self._config["max_loads"])
                break
            if reply.get("op") == "spawned":
                self._owners[int(reply["pid"])] = env
        if reply.get("op") != "spawned":
            for fd in fds:
                os.close(fd)
            raise ZygoteError(f"zygote could not fork: {reply.get('reason', reply)}")
        return int(reply["pid"]), (fds[0] if fds else None)

    def reap(self, pid: int) -> int | None:
        """Wait for a child that was killed (or exited); its wait status, or None if unknown (a
        worker of an environment zygote since retired was reaped by the clean zygote)."""
        with self._lock:
            env = self._owners.pop(pid, None)
            if env is None or env.proc.poll() is not None or not any(e is env for e in self._envs.values()):
                return None
            try:
                reply, _ = self._exchange(env, {"op": "reap", "pid": pid}, [], 0)
            except ZygoteError:
                return None
        status = reply.get("status")
        return int(status) if isinstance(status, int) else None

    def pid(self) -> int | None:
        """The clean zygote's pid."""
        return self._proc.pid if self._proc is not None else None

    def env_pid(self) -> int | None:
        """The pid of the environment zygote the current environment's workers are forked from
        (None before its first spawn)."""
        env = self._envs.get(self._dedicated)
        return env.proc.pid if env is not None else None

    def _stop(self) -> None:
        for env in self._envs.values():
            _retire(env.proc, env.sock)
        self._envs.clear()
        self._owners.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            self._stop()


_RETIRER = ThreadPoolExecutor(1, thread_name_prefix="awm-zygote-retirer")  # never shut down


def _retire(proc: _Forked, sock: socket.socket) -> None:
    """Hang up on an environment zygote and kill it (its workers die with it)."""
    sock.close()
    proc.kill()
    proc.wait()


def _has_code(load: dict[str, Any]) -> bool:
    """Whether a load holds an environment's code (a verifier's worker loads none)."""
    return bool(load.get("prelude") or load.get("tools") or load.get("app"))


# -- the zygote process ---------------------------------------------------------------------------


def _child(control: socket.socket, config: dict[str, Any], fds: list[int], zygote: int,
           namespaces: confine.Report) -> None:
    """In the forked child: keep only the two pipes, confine, serve; never returns."""
    try:
        control.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        confine.die_with_parent(zygote)
        read_fd, write_fd = fds
        keep = sorted({0, 1, 2, read_fd, write_fd, _DEV_DIR,
                       *([config["ruleset_fd"]] if config.get("ruleset_fd") else [])})
        previous = -1
        for fd in keep:
            if previous + 1 < fd:  # os.closerange(n, n) closes every descriptor (close_range(n, -1))
                os.closerange(previous + 1, fd)
            previous = fd
        os.closerange(previous + 1, max(4096, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        # Descriptors 0-2 of an open file description of this worker's own: the fork server's
        # /dev/null is one description shared by every worker of every environment, so status
        # flags or an OFD lock one episode set on it would be found by the next.
        # (Opened through the host's /dev held since before the file view, which has no /dev.)
        own = os.open("null", os.O_RDWR, dir_fd=_DEV_DIR)
        for fd in (0, 1) if DEBUG else (0, 1, 2):  # (debug: stderr stays the server's)
            os.dup2(own, fd)
        os.close(own)
        os.close(_DEV_DIR)  # no descriptor of a host directory reaches the worker
        from awm.sandbox import worker

        worker.serve_child(config, os.fdopen(read_fd, "rb"), os.fdopen(write_fd, "wb"), namespaces)
    except BaseException:
        if DEBUG:
            import traceback
            traceback.print_exc()
    finally:
        os._exit(0)


def _remember(held: OrderedDict[str, Any], key: str, value: Any, limit: int) -> list[Any]:
    """``key`` is the most recent in ``held``; returns the values dropped beyond ``limit`` (the
    server's and the zygote's copies apply this to the same keys in the same order)."""
    held[key] = value
    held.move_to_end(key)
    dropped = []
    while len(held) > limit:
        dropped.append(held.popitem(last=False)[1])
    return dropped


def _ruleset(read_paths: list[str]) -> int | None:
    """The Landlock ruleset of these read paths, built on first use and kept (a child inherits
    the descriptor and restricts itself with it); None without Landlock (the child reports it)."""
    key = tuple(str(p) for p in read_paths)
    if key not in _RULESETS:
        abi = confine.landlock_abi()
        try:
            _RULESETS[key] = confine.landlock_ruleset(list(key), abi) if abi > 0 else None
        except OSError:
            _RULESETS[key] = None  # the child builds it itself, and says what failed
    return _RULESETS[key]


def _hold(key: str, load: dict[str, Any], compile_it: bool = True) -> None:
    """Keep ``load`` as the most recent one (dropping the least recent beyond the limit) and,
    ``compile_it`` (it was just sent), its code compiled for the workers."""
    from awm.sandbox import worker

    for dropped in _remember(_LOADS, key, load, _loads_limit):
        kept = {item for held in _LOADS.values() for item in load_sources(held)}
        for item in load_sources(dropped):
            if item not in kept:
                worker.COMPILED.pop(item, None)
    if compile_it:
        for source, filename in load_sources(load):
            try:
                worker.COMPILED[(source, filename)] = compile(source, filename, "exec")
            except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
                pass  # the worker compiles it itself and reports the error where the load fails


def _spawn(control: socket.socket, message: dict[str, Any], fds: list[int], zygote: int,
           namespaces: confine.Report) -> None:
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        socket.send_fds(control, [json.dumps({"op": "failed", "reason": "spawn needs two descriptors"}).encode()], [])
        return
    key = str(message.get("load_key") or "")
    load = message.get("load") if isinstance(message.get("load"), dict) else _LOADS.get(key)
    if load is None:  # the server believes this zygote holds it: say it does not, to be sent it
        for fd in fds:
            os.close(fd)
        socket.send_fds(control, [json.dumps({"op": "unknown_load", "key": key}).encode()], [])
        return
    _hold(key, load, compile_it=isinstance(message.get("load"), dict))
    config = {**(message.get("config") or {}), "load": _LOADS.get(key), "ruleset_fd": None}
    if "landlock" in config.get("layers", confine.LAYERS):
        config["ruleset_fd"] = _ruleset(config.get("read_paths") or [])
    gc.freeze()  # what the zygote holds is never scanned (so never copied) by a child's collector
    pid = os.fork()
    if pid == 0:
        _child(control, config, fds, zygote, namespaces)
    for fd in fds:
        os.close(fd)
    pidfds: list[int] = []
    try:
        pidfds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        pass  # kernel < 5.3: the server kills by pid (the child cannot be reaped before it asks)
    socket.send_fds(control, [json.dumps({"op": "spawned", "pid": pid}).encode()], pidfds)
    for fd in pidfds:
        os.close(fd)


def _quiet(config: dict[str, Any]) -> None:
    """Descriptors 0-2 on /dev/null (stderr kept with ``debug``), no environment."""
    global DEBUG, _DEV_DIR
    # The host's /dev, held for the workers' own /dev/null (:func:`_child`); never a worker's.
    _DEV_DIR = os.open("/dev", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    devnull = os.open(os.devnull, os.O_RDWR)
    DEBUG = bool(config.get("debug"))
    for fd in (0, 1) if DEBUG else (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    os.environ.clear()


def _imports(app: bool) -> None:
    """Everything a worker imports, imported once; apps' frameworks too, and their first use done
    with an app of ours; and the standard library modules generated tools commonly import (a fixed
    list: nothing named by their code)."""
    from awm.sandbox import worker  # noqa: F401

    for name in COMMON_MODULES:
        try:
            __import__(name)
        except ImportError:
            pass
    if app:
        from awm.sandbox import appshim

        appshim.import_frameworks()
        # The frameworks' first use (~70 ms of CPU that every worker paid again when it loaded
        # its app), done here once with an app of ours: never an environment's code.
        appshim.warm_up()


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("template"):
        _template(config)
        return
    confine.die_with_parent(int(config["parent"]))
    control = socket.socket(fileno=int(config["control_fd"]))
    _quiet(config)
    _imports(bool(config.get("app")))
    _serve(control, config)


def _serve(control: socket.socket, config: dict[str, Any]) -> None:
    """The zygote, its imports done: leave this project's code out of reach, enter its namespaces,
    say ready, then fork environment zygotes until its server hangs up."""
    from awm.sandbox import worker

    global _loads_limit
    _loads_limit = int(config.get("max_loads") or MAX_LOADS)
    for entry in config.get("drop_paths", []):
        while entry in sys.path:
            sys.path.remove(entry)
    confine.seccomp_problem()  # loads libseccomp while files may still be read
    namespaces = confine.Report()
    layers = config.get("layers", confine.LAYERS)
    if "namespaces" in layers:
        # the file view too: the zygote builds it once, every child lives in it
        confine.enter_namespaces(namespaces, config.get("read_paths") if "fsview" in layers else None)
    worker.SECCOMP_PROGRAM = confine.SeccompProgram.build()  # built once, inherited by every child
    if "landlock" in layers:
        _ruleset(config.get("read_paths") or [])  # built once, inherited by every environment zygote
    # Environment zygotes are reaped by the kernel, and so are the workers a killed one leaves
    # behind (this process is their subreaper): no zombie reaches the env server.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    confine.child_subreaper()
    socket.send_fds(control, [json.dumps({"op": "ready", "isolation": namespaces.as_dict()}).encode()], [])
    me = os.getpid()
    while True:
        try:
            message, fds = _recv(control, 1)
        except (EOFError, OSError, ValueError):
            return
        if message.get("op") == "env" and len(fds) == 1:
            _fork_env(control, fds[0], me, namespaces)
        else:
            for fd in fds:
                os.close(fd)
            socket.send_fds(control, [json.dumps({"op": "failed", "reason": f"unknown op {message.get('op')!r} "
                                                  "(workers are forked by an environment zygote)"}).encode()], [])


def _fork_env(control: socket.socket, env_fd: int, zygote: int, namespaces: confine.Report) -> None:
    """Fork an environment zygote serving on ``env_fd``; answer its pid and a pidfd."""
    pid = os.fork()
    if pid == 0:
        try:
            control.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it reaps its workers itself (``reap``)
            confine.die_with_parent(zygote)
            env = socket.socket(fileno=env_fd)
            socket.send_fds(env, [json.dumps({"op": "ready"}).encode()], [])
            _serve_env(env, namespaces)
        except BaseException:
            if DEBUG:
                import traceback
                traceback.print_exc()
        finally:
            os._exit(0)
    os.close(env_fd)
    pidfds: list[int] = []
    try:
        pidfds.append(os.pidfd_open(pid))
    except OSError:
        pass  # already gone: the server reads EOF on its socket
    socket.send_fds(control, [json.dumps({"op": "env_forked", "pid": pid}).encode()], pidfds)
    for fd in pidfds:
        os.close(fd)


def _serve_env(control: socket.socket, namespaces: confine.Report) -> None:
    """An environment zygote: fork workers of one environment until its server hangs up."""
    me = os.getpid()
    while True:
        try:
            message, fds = _recv(control, 2)
        except (EOFError, OSError, ValueError):
            return
        op = message.get("op")
        if op == "spawn":
            _spawn(control, message, fds, me, namespaces)
        elif op == "reap":
            for fd in fds:
                os.close(fd)
            status: int | None = None
            try:
                _, status = os.waitpid(int(message["pid"]), 0)
            except (ChildProcessError, ValueError, KeyError, TypeError):
                pass
            socket.send_fds(control, [json.dumps({"op": "reaped", "status": status}).encode()], [])
        else:
            for fd in fds:
                os.close(fd)
            socket.send_fds(control, [json.dumps({"op": "failed", "reason": f"unknown op {op!r}"}).encode()], [])


# -- a local fleet's template of zygotes ---------------------------------------------------------
#
# Every env server keeps a zygote of its own, and an app zygote holds ~50 MB of imported and
# warmed-up frameworks (FastAPI, Pydantic, SQLAlchemy, psycopg) that no two exec'd processes
# share. A local fleet starts one more process, the template: started as a zygote is (``python -I
# -S``, empty environment, descriptors on /dev/null, no connection, no credential), it imports and
# warms up what an app zygote does and then only forks zygotes when an env server of the fleet
# asks (``TEMPLATE_ENV`` names its socket). Tool zygotes are forked from it too: they share its
# pages (and need none of them). A zygote forked from it shares those pages with every
# other instance's zygote and workers, and then goes on exactly as one it started itself (drops
# this project's code from ``sys.path``, enters its own namespaces, builds its own file view,
# forks its own environment zygotes). The template never runs untrusted code and never holds an
# environment's code: it receives nothing but a zygote's configuration. A zygote it forked dies
# when its env server hangs up its control socket (or the template dies); its workers die with it.


def start_template(path: str, sys_path: list[str], drop_paths: list[str]) -> subprocess.Popen[bytes]:
    """Start the template listening on ``path`` (a Unix socket made here, mode 0600; only
    processes of this user are answered); it dies with this process."""
    from awm import settings  # in the fleet's process, as in Zygote._start

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        debug = settings.AWM_DEBUG_ZYGOTE
        config = {"template": True, "sys_path": sys_path, "drop_paths": drop_paths, "parent": os.getpid(),
                  "listen_fd": listener.fileno(), "debug": debug}
        return _LAUNCHER.submit(  # from the long-lived launcher thread: see Zygote._start
            subprocess.Popen, [sys.executable, "-I", "-S", "-c", _BOOT, json.dumps(config)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=None if debug else subprocess.DEVNULL,
            env={}, cwd="/", close_fds=True, pass_fds=(listener.fileno(),)).result()
    finally:
        listener.close()


def _template(config: dict[str, Any]) -> None:
    """The template process: imports, then one zygote forked per request, until its parent dies."""
    confine.die_with_parent(int(config["parent"]))
    listener = socket.socket(fileno=int(config["listen_fd"]))
    _quiet(config)
    _imports(app=True)
    gc.freeze()  # shared by every zygote forked from here: never walked (so never copied) by theirs
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes are reaped by the kernel; servers hold pidfds
    me, uid = os.getpid(), os.getuid()
    while True:
        try:
            conn, _ = listener.accept()
        except InterruptedError:
            continue
        except OSError:
            return
        with conn:
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                if struct.unpack("3i", creds)[1] not in (uid, 0):
                    continue  # closing the connection is the answer
                conn.settimeout(TEMPLATE_TIMEOUT_S)
                message, fds = _recv(conn, 1)
            except (OSError, EOFError, ValueError):
                continue
            zygote = message.get("config")
            reason = ("not a zygote request" if message.get("op") != "zygote" or len(fds) != 1
                      or not isinstance(zygote, dict)
                      else "another installation" if zygote.get("sys_path") != config["sys_path"] else "")
            if reason:
                for fd in fds:
                    os.close(fd)
                _answer(conn, {"op": "failed", "reason": reason}, [])
                continue
            pid = os.fork()
            if pid == 0:
                _forked_zygote(listener, conn, fds[0], zygote, me)
            os.close(fds[0])
            pidfds: list[int] = []
            try:
                pidfds.append(os.pidfd_open(pid))
            except OSError:
                pass  # already gone: the server reads EOF on its control socket
            _answer(conn, {"op": "forked", "pid": pid}, pidfds)
            for fd in pidfds:
                os.close(fd)


def _answer(conn: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    try:
        socket.send_fds(conn, [json.dumps(message).encode()], fds)
    except OSError:
        pass  # the server gave up waiting; a zygote it never hears of exits with its socket


def _forked_zygote(listener: socket.socket, conn: socket.socket, control_fd: int, config: dict[str, Any],
                   template: int) -> None:
    """In a zygote forked by the template: nothing of the template's but its memory; then the
    zygote's life (:func:`_serve`). Never returns."""
    try:
        listener.close()
        conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # it reaps its workers itself
        confine.die_with_parent(template)
        _serve(socket.socket(fileno=control_fd), config)
    except BaseException:
        if DEBUG:
            import traceback
            traceback.print_exc()
    finally:
        os._exit(0)
