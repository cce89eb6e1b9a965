"""The provisioner: instance databases handed out when an instance is claimed, not when it starts.

Late binding (an env server that serves any environment of its catalog, chosen per claim) needs
a fresh instance database of the claimed environment at claim time. Making one needs the admin
credential, which an env server must never hold (it drives untrusted code), so one small process
holds it and env servers ask it, over a Unix socket, one JSON line per request (a path, or a name
in Linux's abstract namespace written ``@name``: see :func:`socket_address`):

    {"op": "acquire", "env": "shop"}        -> {"ok": true, "database": "awm_i_...", "dsn": "...",
                                                "template": "awm_tpl_...", "checksum": "...", "ms": 0.4,
                                                "facts": {...}}   (the template's snapshot facts)
    {"op": "release", "database": "awm_i_..."} -> {"ok": true}                 (dropped right after)
    {"op": "prefill", "env": "shop", "count": 2} -> {"ok": true}      (make ready ones ahead)
    anything else                          -> {"ok": false, "error": "..."}

A database belongs to the connection that acquired it: only that connection may release it, and
when the connection closes (the env server exited, however it exited) every database it still
holds is dropped. So a crashed instance leaks nothing, and one instance cannot drop another's.

Where the time goes (docs/benchmarks.md, "Instance databases at claim time"): a clone costs
files, not rows, 70-280 ms on a loaded disk; connecting to a database made ahead costs ~8 ms of
server CPU. So the provisioner keeps, per environment in demand, ``keep`` databases made ahead
(``CREATE DATABASE``: ``WAL_LOG`` on a durable server, ``FILE_COPY`` without ``fsync``, the cheaper
for each: :func:`awm.postgres.provision.clone_strategy`) and refills them
off the claim path; an environment with none ready is cloned on the claim path. The template of
an environment is made once per snapshot digest (:func:`awm.postgres.provision.template_name`).

A local fleet runs one provisioner for all its instances (:class:`~awm.fleet.LocalFleet`); a
Kubernetes env pod of a late-binding fleet runs one as a sidecar (``python -m
awm.postgres.provisioner``), with the admin DSN its provisioning init container already had.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import socketserver
import struct
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import psycopg
import tenacity

from awm import settings
from awm.bundle import EnvBundle
from awm.postgres import provision
from awm.postgres.spares import Spares, fleet_pool

log = logging.getLogger("awm.provisioner")

MAX_LINE = 64 * 1024  # a request is a name or two
SOCKET_ENV = settings.names.AWM_PROVISIONER_SOCKET  # where an env server finds its provisioner
# What a claim's background work (its refill, its spare, the drop of what it evicted) waits
# before it starts: the claim's own session and first call go first (Provisioner._settled).
SETTLE_S = 0.1
# How long a release's DROP is tried again while the server is away (restarting): a crash
# recovery takes seconds; past this the fleet's own sweep at its next start drops it.
DROP_RETRY_S = 120.0
# How long closing waits for a connection to drop the databases it still holds (all over one
# connection): past this the fleet's sweep drops them.
CLOSE_CONNECT_S = 10.0


def socket_address(path: str) -> str:
    """The address to bind or connect for ``path``: ``@name`` is ``name`` in the abstract
    namespace of the network namespace, anything else a file.

    An env pod's provisioner sidecar listens on an abstract name: the containers of a pod share
    its network namespace under runc and under gVisor alike, while a socket *file* in a shared
    volume is not shared under gVisor (each container sees the volume through its own file proxy).
    An abstract name has no file mode, so the server checks each peer's uid instead
    (:func:`_peer_allowed`); the workers that run untrusted code cannot create sockets at all
    (seccomp), nor reach abstract names (Landlock's scope, ABI >= 6)."""
    return "\0" + path[1:] if path.startswith("@") else path


def _peer_allowed(sock: socket.socket) -> bool:
    """Only our own uid (or root) may ask: what a socket file of mode 0600 enforces, checked on the
    connection (SO_PEERCRED) so that it holds for an abstract name too."""
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return False
    return uid in (os.geteuid(), 0)


class ProvisionerError(RuntimeError):
    """The provisioner refused or failed a request (the message says why)."""


class ProvisionerLost(ProvisionerError):
    """The connection to the provisioner broke: every database acquired on it is being dropped,
    so the instance must start again (its supervisor restarts it)."""


@dataclass
class Acquired:
    env: str
    database: str
    dsn: str
    template: str
    checksum: str
    ms: float  # time inside the provisioner: ~0 for a database made ahead, a clone's time otherwise
    ready: bool  # made ahead (True) or cloned on the claim path (False)
    spare: bool = False  # made ahead by any provisioner of the fleet (a shared spare), not this one
    facts: dict[str, Any] | None = None  # the template's snapshot facts (snapshot.Facts.to_json), if kept
    verified: bool = False  # checksummed as the snapshot by its maker (provision.Instance.verified)


class Provisioner:
    """Instance databases of a catalog's environments on one PostgreSQL server.

    ``bundles`` finds an environment's bundle by name (raises ``KeyError`` for an unknown one).
    ``keep``: databases made ahead per environment once it has been asked for (0: clone on every
    claim). ``meta`` goes into every database comment (the owner, for ``reap_abandoned``).
    ``max_spares``: databases made ahead on the server for every provisioner of the same ``pool``
    (:class:`Spares`; 0: none)."""

    def __init__(self, admin_dsn: str, bundles: Callable[[str], EnvBundle], prefix: str,
                 keep: int = 1, meta: dict[str, str] | None = None, refill_jobs: int = 1,
                 max_ready: int = 16, max_spares: int = 0, pool: str = "", settle_s: float = SETTLE_S) -> None:
        self.admin_dsn = admin_dsn
        self.settle_s = settle_s
        self._bundles = bundles
        self.prefix = prefix
        self.keep = keep
        # Databases made ahead cost ~8 MB of disk each: at most this many in all, for the
        # environments asked for most recently (a catalog of 1,000 must not become 1,000 spares).
        self.max_ready = max_ready
        self.meta = dict(meta or {})
        self._lock = threading.Lock()
        self._templates: dict[str, provision.Template] = {}  # env -> its template (made once)
        self._template_locks: dict[str, threading.Lock] = {}
        self._ready: dict[str, deque[provision.Instance]] = {}  # env -> databases made ahead
        self._refilling: dict[str, int] = {}  # env -> refills queued
        self._made: dict[str, provision.Instance] = {}  # every database made and not yet dropped
        self._holders: dict[str, str] = {}  # database -> the instance that acquired it (if it said)
        self._counter = 0
        # Database names must never collide with another provisioner's on the same server (two
        # pods, two fleets): ``prefix`` plus a random token of this process.
        self._token = secrets.token_hex(2)
        self._refill = ThreadPoolExecutor(max(1, refill_jobs), thread_name_prefix="awm-provision-refill")
        self._drops = ThreadPoolExecutor(1, thread_name_prefix="awm-provision-drop")  # releases, after their answer
        self._spare_jobs = ThreadPoolExecutor(1, thread_name_prefix="awm-provision-spare")
        self._strategy: str | None = None
        self.closed = False
        self._closing = threading.Event()  # set by close(): drops being retried stop
        self.spares = Spares(admin_dsn, pool or prefix, max_spares, self.meta) if max_spares > 0 else None
        self.stats = {"acquired": 0, "ready_hits": 0, "spare_hits": 0, "clones_on_claim": 0, "refills": 0,
                      "spares_made": 0, "released": 0}

    # -- templates and clones --------------------------------------------------------------------

    def template(self, env: str) -> provision.Template:
        """The environment's template, made (or found complete) once per process; an
        environment the catalog does not have (or holds broken) is a :class:`ProvisionerError`."""
        try:
            return self._template(env)
        except KeyError:
            raise ProvisionerError(f"unknown environment {env!r}") from None
        except ValueError as exc:  # awm.catalog.CatalogError: a broken bundle
            raise ProvisionerError(f"environment {env!r} cannot be loaded: {exc}") from None

    def _template(self, env: str) -> provision.Template:
        with self._lock:
            found = self._templates.get(env)
            lock = self._template_locks.setdefault(env, threading.Lock())
        if found is not None:
            return found
        with lock:
            found = self._templates.get(env)
            if found is None:
                found = provision.ensure_template(self.admin_dsn, self._bundles(env))
                with self._lock:
                    self._templates[env] = found
        return found

    def _name(self, env: str) -> str:
        """``awm_i_<prefix><token>_<env, cut>_<n>``: unique per provisioner and never over
        PostgreSQL's 63-byte identifiers (a longer name would be cut, silently, into another's)."""
        with self._lock:
            self._counter += 1
            counter = self._counter
        name = f"{provision.INSTANCE_PREFIX}{self.prefix[:8]}{self._token}_{provision._slug(env, 28)}_{counter}"
        if len(name.encode()) > 63:
            raise ProvisionerError(f"database name {name!r} would exceed 63 bytes")
        return name

    def strategy(self, conn: psycopg.Connection) -> str | None:
        """The ``CREATE DATABASE`` strategy, asked once: WAL_LOG on a durable server, FILE_COPY
        without fsync."""
        if self._strategy is None:
            self._strategy = provision.clone_strategy(conn) or ""
            log.info("instance databases are cloned with %s", f"STRATEGY {self._strategy}"
                     if self._strategy else "the server's default strategy")
        return self._strategy or None

    def _owner(self) -> dict[str, str]:
        return {**self.meta, "provisioner": self.prefix}

    def _clone(self, env: str) -> provision.Instance:
        template = self.template(env)
        with provision._admin(self.admin_dsn) as conn:
            instance = provision._create_instance(conn, self.admin_dsn, template, self._name(env),
                                                  self._owner(), self.strategy(conn))
        with self._lock:
            self._made[instance.dbname] = instance
        return instance

    # -- the three requests ----------------------------------------------------------------------

    def add_templates(self, templates: list[provision.Template]) -> None:
        """Templates made already (a fleet makes its catalog's in parallel before it starts)."""
        with self._lock:
            self._templates.update({t.env: t for t in templates})

    def held_by(self, holder: str) -> provision.Instance | None:
        """The database ``holder`` acquired last and still holds (None if none)."""
        with self._lock:
            names = [db for db, h in self._holders.items() if h == holder]
            return self._made.get(names[-1]) if names else None

    def acquire(self, env: str, holder: str = "") -> Acquired:
        """A fresh database of ``env`` for one instance: a ready one if there is one, else a clone."""
        if self.closed:
            raise ProvisionerError("the provisioner is closing")
        start = time.perf_counter()
        template = self.template(env)
        with self._lock:
            ready = self._ready.get(env)
            instance = ready.popleft() if ready else None
        kind = "ready_hits" if instance is not None else "clones_on_claim"
        if instance is None and self.spares is not None:
            instance = self.spares.take(template, self._name(env), self._owner())
            if instance is not None:
                kind = "spare_hits"
                with self._lock:
                    self._made[instance.dbname] = instance
        if instance is None:
            instance = self._clone(env)
        with self._lock:
            self.stats["acquired"] += 1
            self.stats[kind] += 1
            if holder:
                self._holders[instance.dbname] = holder
        self._top_up(env, settle=True)
        if self.spares is not None:
            self._spare_jobs.submit(self._settled(self._make_spare, env))
        return Acquired(env, instance.dbname, instance.dsn, template.dbname, template.checksum,
                        (time.perf_counter() - start) * 1000, kind != "clones_on_claim", kind == "spare_hits",
                        template.facts, instance.verified)

    def release(self, database: str) -> None:
        """Drop a database this provisioner made (its role with it)."""
        with self._lock:
            known = self._made.get(database)
            self._holders.pop(database, None)
        if known is None:
            raise ProvisionerError(f"not a database of this provisioner: {database!r}")
        provision.drop_instance(self.admin_dsn, database)  # forgotten only once it is gone
        with self._lock:
            self._made.pop(database, None)
            self.stats["released"] += 1

    def release_later(self, database: str) -> None:
        """:meth:`release` in the background (one drop at a time). The socket's ``release`` answers
        before the drop: an env server releases an evicted environment's database off its claim
        path, and its next ``acquire`` on the same connection would otherwise wait behind the
        ``DROP DATABASE`` (27-57 ms on a disk, measured)."""
        def drop() -> None:
            # A drop that fails because the server is away (restarting, its connections refused)
            # is tried again until it is back (the soak found databases held by nobody until the
            # fleet stopped); one that is refused for what it is is not.
            retrying = tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(psycopg.OperationalError),
                stop=tenacity.stop_after_delay(DROP_RETRY_S) | tenacity.stop_when_event_set(self._closing),
                wait=tenacity.wait_exponential(multiplier=0.25, max=5.0), reraise=True)
            try:
                retrying(self.release, database)
            except Exception as exc:  # noqa: BLE001 - close() and the fleet's sweeps drop what is left
                log.warning("provisioner: dropping %s failed: %s: %s", database, type(exc).__name__, exc)

        self._drops.submit(self._settled(drop))

    def prefill(self, env: str, count: int) -> None:
        """Make ``count`` databases of ``env`` ahead (in the background), e.g. for a GRPO step's
        environments, known when the step starts."""
        self.template(env)
        self._top_up(env, max(count, 0))

    def _top_up(self, env: str, want: int | None = None, settle: bool = False) -> None:
        want = self.keep if want is None else want
        with self._lock:
            have = len(self._ready.get(env) or ()) + self._refilling.get(env, 0)
            missing = max(0, want - have)
            self._refilling[env] = self._refilling.get(env, 0) + missing
        for _ in range(missing):
            self._refill.submit(self._settled(self._refill_one, env) if settle else functools.partial(self._refill_one, env))

    def _settled(self, job: Callable[..., None], *args: Any) -> Callable[[], None]:
        """``job`` for a background executor, begun no sooner than ``settle_s`` after now.

        A claim's refill, spare and the drop of what it evicted are made for later claims; run at
        once they compete with this claim's own first moments on the same server (the client's
        new MCP session, its first tool call on the new database: a clone is a burst of writes,
        a drop a burst of unlinks). Measured locally: a refill clone right after a switch made its
        session set-up and first call 4-6 ms slower. Longer is not better: on the real node, with
        claims back to back, 0.25 s pushed each spare's clone into the next claim's (its first use
        526 ms p50 against 319 with 0.1 s: docs/benchmarks.md)."""
        not_before = time.monotonic() + self.settle_s

        def run() -> None:
            wait = not_before - time.monotonic()
            if wait > 0 and not self.closed:
                time.sleep(wait)
            job(*args)

        return run

    def _refill_one(self, env: str) -> None:
        try:
            if self.closed:
                return
            instance = self._clone(env)
            # A first connection builds the database's relation cache file (pg_internal.init):
            # the instance's own first connection then skips it (~6 ms of a ~30 ms connect, measured).
            with provision._admin(self.admin_dsn, instance.dbname) as conn:
                conn.execute("SELECT count(*) FROM pg_class").fetchone()
            with self._lock:
                self._ready.setdefault(env, deque()).append(instance)
                self._ready[env] = self._ready.pop(env)  # most recently in demand last
                self.stats["refills"] += 1
                surplus = []
                while sum(len(q) for q in self._ready.values()) > self.max_ready:
                    oldest = next(e for e, q in self._ready.items() if q)
                    surplus.append(self._ready[oldest].popleft())
            for extra in surplus:
                self.release(extra.dbname)
        except Exception as exc:  # noqa: BLE001 - the next claim clones on its path instead
            log.warning("refill of %s failed: %s", env, exc)
        finally:
            with self._lock:
                self._refilling[env] -= 1

    def _make_spare(self, env: str) -> None:
        """A spare of ``env`` on the server, unless one is there or being made (off the claim
        path, on a thread of its own: refills of ready databases do not queue behind it)."""
        if self.closed or self.spares is None:
            return
        try:
            template = self.template(env)
            if self.spares.wanted(template):
                with provision._admin(self.admin_dsn) as conn:
                    made = self.spares.make(conn, template, self._owner(), self.strategy(conn))
                if made:
                    with self._lock:
                        self.stats["spares_made"] += 1
        except Exception as exc:  # noqa: BLE001 - a spare is an optimisation: the next claim clones
            log.warning("spare of %s failed: %s: %s", env, type(exc).__name__, exc)

    def ready_count(self, env: str | None = None) -> int:
        with self._lock:
            return sum(len(q) for e, q in self._ready.items() if env is None or e == env)

    def close(self) -> None:
        """Drop every database made here (handed out or ready). Spares stay: they belong to the
        pool (the fleet), not to this provisioner."""
        self.closed = True
        self._closing.set()  # drops being retried give up: the ones left are dropped below
        self._refill.shutdown(wait=True, cancel_futures=True)
        self._spare_jobs.shutdown(wait=True, cancel_futures=True)
        if self.spares is not None:
            self.spares.close()
        self._drops.shutdown(wait=True)  # releases already answered: drop them (the rest follows)
        with self._lock:
            names, self._made = list(self._made), {}
            self._ready.clear()
        if not names:
            return
        # One connection for all of them, waited for briefly: closing with the server gone (a
        # killed database pod, a stopped test server) must not wait a minute per database.
        try:
            left = provision.drop_instances(self.admin_dsn, names, retry_s=CLOSE_CONNECT_S)
        except psycopg.Error as exc:
            left = names
            log.warning("closing: the database server is unreachable (%s)", exc)
        if left:
            log.warning("closing: %d databases not dropped (the operator's sweep drops them): %s", len(left),
                        ", ".join(left[:5]))


# -- the socket: one connection per instance, the databases it holds dropped when it closes --------

class _Handler(socketserver.StreamRequestHandler):
    server: "ProvisionerServer"

    def handle(self) -> None:
        held: set[str] = set()
        if not _peer_allowed(self.connection):
            log.warning("provisioner: refused a connection from another uid")
            return
        try:
            while True:
                line = self.rfile.readline(MAX_LINE + 1)
                if not line:
                    return
                if len(line) > MAX_LINE:
                    self._reply({"ok": False, "error": f"request over {MAX_LINE} bytes"})
                    return
                self._reply(self._answer(line, held))
        except (OSError, ValueError):
            return
        finally:
            for database in held:  # the instance is gone: nothing it held outlives it
                with contextlib.suppress(Exception):
                    self.server.provisioner.release(database)

    def _reply(self, message: dict[str, Any]) -> None:
        self.wfile.write(json.dumps(message).encode() + b"\n")
        self.wfile.flush()

    def _answer(self, line: bytes, held: set[str]) -> dict[str, Any]:
        provisioner = self.server.provisioner
        try:
            request = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not a JSON line"}
        if not isinstance(request, dict):
            return {"ok": False, "error": "a request is a JSON object"}
        op = request.get("op")
        try:
            if op == "acquire":
                env = request.get("env")
                if not isinstance(env, str) or not env:
                    return {"ok": False, "error": "acquire needs env (a name)"}
                holder = request.get("instance")
                got = provisioner.acquire(env, holder if isinstance(holder, str) else "")
                held.add(got.database)
                return {"ok": True, **got.__dict__}
            if op == "release":
                database = request.get("database")
                if database not in held:  # never another instance's database
                    return {"ok": False, "error": f"not a database of this connection: {str(database)[:80]!r}"}
                held.discard(database)
                provisioner.release_later(database)
                return {"ok": True}
            if op == "prefill":
                env, count = request.get("env"), request.get("count", 1)
                if not isinstance(env, str) or not isinstance(count, int) or not 0 <= count <= 64:
                    return {"ok": False, "error": "prefill needs env (a name) and count (0-64)"}
                provisioner.prefill(env, count)
                return {"ok": True}
        except ProvisionerError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - answered; never a reason to drop the connection's databases
            log.warning("provisioner %s failed: %s: %s", op, type(exc).__name__, exc)
            what = type(exc).__name__ if isinstance(exc, psycopg.OperationalError) else f"{type(exc).__name__}: {str(exc)[:300]}"
            return {"ok": False, "error": f"{op} failed: {what}"}
        return {"ok": False, "error": f"unknown op {str(op)[:40]!r} (acquire, release, prefill)"}


class ProvisionerServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """The provisioner on a Unix socket (a file of mode 0600, or an abstract ``@name``; either way
    only our uid may ask), one thread per instance."""

    daemon_threads = True
    # Every instance of a fleet connects when it starts, all at once (``awm serve -n 64``): the
    # socketserver default of 5 pending connections turned the rest away (EAGAIN).
    request_queue_size = 1024

    def __init__(self, provisioner: Provisioner, path: str | Path) -> None:
        self.provisioner = provisioner
        self.path = str(path)
        self.abstract = self.path.startswith("@")
        if not self.abstract:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        super().__init__(socket_address(self.path), _Handler)
        self._thread: threading.Thread | None = None

    def server_bind(self) -> None:
        """A socket file is bound in a private directory, made 0600 and moved into place: it is
        never reachable under a looser mode. Not by narrowing the umask around ``bind``: the
        umask is the whole process's, so a thread's files or a child forked meanwhile got it,
        and two servers starting at once could leave the process at 0o177 for good (every later
        directory untraversable: Chromium, started later in such a process, crashed at start)."""
        if self.abstract:
            return super().server_bind()
        target = self.server_address
        private = tempfile.mkdtemp(prefix=".p", dir=os.path.dirname(target) or ".")
        bound = os.path.join(private, "s")  # no longer than the target's name: the 108-byte limit
        try:
            self.socket.bind(bound)
            os.chmod(bound, 0o600)
            os.rename(bound, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bound)
            os.rmdir(private)
        self.server_address = target

    def start(self) -> ProvisionerServer:
        self._thread = threading.Thread(target=self.serve_forever, name="awm-provisioner", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        if not self.abstract:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


class ProvisionerClient:
    """An env server's connection to its provisioner (blocking; thread-safe). The connection is
    the ownership of the databases acquired on it: keep it open for the process's life."""

    def __init__(self, path: str, instance: str = "", timeout_s: float = 600.0) -> None:
        self.path = path
        self.instance = instance  # who asks (recorded with the database, for operators' eyes)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._file: Any = None
        self._lost = False

    def _connect(self, wait_s: float = 60.0) -> None:
        """Connect, waiting up to ``wait_s`` for the socket to appear (a pod's sidecar may start
        after the env server)."""
        deadline = time.monotonic() + wait_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(socket_address(self.path))
                break
            except (FileNotFoundError, ConnectionRefusedError, BlockingIOError) as exc:  # not yet, or busy
                sock.close()
                if time.monotonic() > deadline:
                    raise ProvisionerError(f"provisioner at {self.path} unreachable: {exc}") from None
                time.sleep(0.1)
            except OSError as exc:
                sock.close()
                raise ProvisionerError(f"provisioner at {self.path} unreachable: {exc}") from None
        self._sock, self._file = sock, sock.makefile("rwb")

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if self._sock is None:
                if self._lost:  # a new connection would own nothing of what this process serves
                    raise ProvisionerLost("the provisioner connection was lost earlier")
                self._connect()
            try:
                self._file.write(json.dumps(message).encode() + b"\n")
                self._file.flush()
                line = self._file.readline(MAX_LINE * 4)
            except OSError as exc:
                self._close()
                raise ProvisionerLost(f"provisioner connection failed: {exc}") from None
            if not line:
                self._close()
                raise ProvisionerLost("provisioner closed the connection")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise ProvisionerError(str(reply.get("error", "refused")))
        return reply

    def acquire(self, env: str) -> Acquired:
        r = self.request({"op": "acquire", "env": env, "instance": self.instance})
        facts = r.get("facts")
        return Acquired(r["env"], r["database"], r["dsn"], r["template"], r["checksum"], r["ms"], r["ready"],
                        bool(r.get("spare", False)), facts if isinstance(facts, dict) else None,
                        r.get("verified") is True)

    def release(self, database: str) -> None:
        self.request({"op": "release", "database": database})

    def prefill(self, env: str, count: int) -> None:
        self.request({"op": "prefill", "env": env, "count": count})

    def _close(self) -> None:
        self._lost = self._lost or self._sock is not None
        for thing in (self._file, self._sock):
            with contextlib.suppress(Exception):
                if thing is not None:
                    thing.close()
        self._sock = self._file = None

    def close(self) -> None:
        with self._lock:
            self._close()


def main(argv: list[str] | None = None) -> None:
    """``python -m awm.postgres.provisioner``: the provisioner of a late-binding env pod (a
    sidecar), with the admin DSN from ``AWM_ADMIN_DSN`` (or the file ``AWM_ADMIN_DSN_FILE``)."""
    from awm import catalog

    parser = argparse.ArgumentParser(prog="python -m awm.postgres.provisioner", description=main.__doc__)
    parser.add_argument("--catalog", required=True, help="the catalog directory (bundles by name)")
    parser.add_argument("--socket", required=True, help="the Unix socket to serve: a path, or @name (abstract)")
    parser.add_argument("--prefix", required=True, help="whose databases (the pod's name): hashed into their names")
    parser.add_argument("--keep", type=int, default=0, help="databases made ahead per environment in demand")
    parser.add_argument("--meta", default="{}", help="JSON object for every database comment (pod, fleet, namespace)")
    parser.add_argument("--spares", type=int, default=0,
                        help="spare databases of recently claimed environments kept on the server for every "
                             "provisioner of the same fleet (namespace and fleet of --meta); 0: none")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    admin = settings.var.AWM_ADMIN_DSN.pop()
    if not admin and settings.AWM_ADMIN_DSN_FILE:
        admin = settings.var.AWM_ADMIN_DSN_FILE.pop().read_text().strip()
    if not admin:
        raise SystemExit("provisioner: set AWM_ADMIN_DSN (or AWM_ADMIN_DSN_FILE)")
    root = catalog.resolve(args.catalog)
    import hashlib

    prefix = hashlib.sha256(args.prefix.encode()).hexdigest()[:8]
    meta = json.loads(args.meta)
    pool = fleet_pool(meta.get("namespace", ""), meta["fleet"]) if meta.get("fleet") else prefix
    provisioner = Provisioner(admin, lambda env: catalog.find(root, env), prefix, keep=args.keep,
                              meta=meta, max_spares=args.spares, pool=pool)
    server = ProvisionerServer(provisioner, args.socket)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        server.serve_forever()
    finally:
        server.server_close()
        provisioner.close()


if __name__ == "__main__":
    main()
