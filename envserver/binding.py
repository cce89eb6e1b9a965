"""One environment bound to an instance: its bundle, database, tool runtime and worker pools.

An env server holds one :class:`Binding` per environment it has served recently (late binding:
an instance serves any environment of its catalog, chosen when it is claimed). Only the current
binding has workers; a cached one keeps its bundle, its tool runtime and its database connection
(so a repeat claim of the same environment costs a reset, not a new database), and starts fresh
workers again when it becomes current. Its database came from a :class:`DatabaseSource`: the one
DSN a pinned instance was started with, or the provisioner (:mod:`awm.postgres.provisioner`),
which holds the admin credential this process never sees.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Protocol

from awm.bundle import EnvBundle
from awm.gates import gate_status
from awm.postgres.provisioner import ProvisionerClient
from awm.postgres.snapshot import Facts
from awm.sandbox.forkserver import Zygote
from awm.sandbox.pool import WorkerPool, WorkerSpec
from awm.envserver.reset import EpisodeDatabase
from awm.envserver.tools import ToolRuntime

log = logging.getLogger(__name__)


class BindError(Exception):
    """An environment this instance cannot serve (unknown, or a pinned instance asked for another)."""


class Database(NamedTuple):
    """An instance database as its source handed it over."""

    name: str  # the provisioner's name for it ("" for a pinned instance's)
    dsn: str
    # where it came from: "clone" (made on the claim path), "ready" (made ahead by this pod's
    # provisioner), "spare" (made ahead by any provisioner of the fleet), "fixed" (pinned)
    source: str
    facts: Facts | None = None  # its template's snapshot facts, where the source knows them
    verified: bool = False  # checksummed as its snapshot by the provisioner that made it (a spare)


class DatabaseSource(Protocol):
    """Where a binding's instance database comes from."""

    late: bool

    def acquire(self, env: str) -> Database: ...

    def release(self, database: str) -> None: ...


class FixedDatabase:
    """A pinned instance: the one database it was started with, of its one environment."""

    late = False

    def __init__(self, env: str, dsn: str) -> None:
        self.env, self.dsn = env, dsn

    def acquire(self, env: str) -> Database:
        if env != self.env:
            raise BindError(f"this instance is pinned to {self.env!r} (started without a provisioner)")
        return Database("", self.dsn, "fixed")

    def release(self, database: str) -> None:
        return None


class ProvisionedDatabases:
    """A late-binding instance: a fresh database per environment, from the provisioner."""

    late = True

    def __init__(self, client: ProvisionerClient) -> None:
        self.client = client

    def acquire(self, env: str) -> Database:
        got = self.client.acquire(env)
        facts = None
        if got.facts is not None:
            try:
                facts = Facts.from_json(got.facts)
            except ValueError as exc:  # the instance reads them from its database instead
                log.warning("the provisioner's facts of %s are unusable: %s", env, exc)
        return Database(got.database, got.dsn, "spare" if got.spare else "ready" if got.ready else "clone", facts,
                        got.verified)

    def release(self, database: str) -> None:
        if database:
            self.client.release(database)


@dataclass
class Binding:
    bundle: EnvBundle
    db: EpisodeDatabase
    database: str  # the provisioner's name for it ("" for a pinned instance's)
    gates: dict[str, tuple[bool, str]]
    runtime: ToolRuntime
    pool: WorkerPool | None = None  # tools (renewed at every reset); None while not current
    verifier_pool: WorkerPool | None = None  # one verification per worker; None while not current
    initial_sqlite: bytes | None = None  # the snapshot as SQLite, for AWM-convention verifiers
    episodes: int = 0
    last_used: float = field(default_factory=time.monotonic)
    source: str = ""  # where its database came from (Database.source)
    staged: bool = False  # its workers start in two steps (start_workers)

    @classmethod
    def new(cls, bundle: EnvBundle, database: Database, verifier_kind: str | None) -> Binding:
        db = EpisodeDatabase(database.dsn, statement_timeout_ms=int(bundle.limits.tool_timeout_s * 1000),
                             facts=database.facts, verified=database.verified)
        return cls(bundle, db, database.name, {t.id: gate_status(bundle, t, verifier_kind) for t in bundle.tasks},
                   ToolRuntime(bundle), source=database.source)

    @property
    def name(self) -> str:
        return self.bundle.name

    @property
    def app(self) -> bool:
        return bool(self.runtime.load.get("app"))

    @functools.cached_property
    def load_key(self) -> str:
        """Names this environment's code to the fork servers (:meth:`Zygote.dedicate`): a hash of
        it, computed once (a switch reads it)."""
        return WorkerSpec(load=self.runtime.load).load_key

    def activate(self, zygote: Zygote, workers: int, allow_weak_isolation: bool, wait: bool,
                 staged: bool = False, spares: int = 1) -> None:
        """Make this binding's worker pools (forked from ``zygote``). ``wait``: start the workers
        and block until they run (an instance's start); else (a switch) they start when
        :meth:`start_workers` is called, once the switch's answer is sent, or at the first call.
        ``staged``: in two steps (:meth:`start_workers`). ``spares``: tool workers made ahead of
        the next episode besides ``workers`` (1: a reset never waits for a fork, at ~20 MB of an
        AWM app's worker per instance; 0: the replacement is forked after the reset's answer)."""
        self.staged = staged
        memory_mb = self.bundle.limits.verifier_memory_mb
        # Tools and verifiers never share a worker, and no worker serves two episodes.
        self.pool = WorkerPool(WorkerSpec(memory_mb=memory_mb, load=self.runtime.load,
                                          allow_weak_isolation=allow_weak_isolation),
                               size=workers, zygote=zygote, spares=spares)
        self.verifier_pool = WorkerPool(WorkerSpec(memory_mb=memory_mb, load={"prelude": "", "tools": []},
                                                   allow_weak_isolation=allow_weak_isolation),
                                        size=1, zygote=zygote, single_use=True)
        if wait:
            self.start_workers(wait=True)
        self.last_used = time.monotonic()

    def start_workers(self, wait: bool = False) -> None:
        """Fork the workers not yet started. ``wait`` (an instance's start): all of them, and
        block until they run. Otherwise (after a switch's answer, and at every later tend) the
        tool worker the first call needs first, the spare and the verifier's worker after it;
        when ``staged`` (a switch to a new database, whose claim waits for its first call), in
        two steps: the first tool worker alone, and the other two at the next tend (after the
        first call's answer, or the next reset's). Those two forks (~10 ms of CPU) would
        otherwise compete with the client's new MCP session and first call (locally 9.0-9.4 ms
        from the switch's answer to the first call's answer, against 11.6 with all three forked
        at once). A cached environment's claim is a reset, whose cost is the next claim's too:
        its three forks follow the reset's answer, done before a quick next claim (staged, a
        back-to-back repeat measured 2.4-2.9 ms a reset against 1.6-1.9: docs/benchmarks.md)."""
        if self.pool is None or self.verifier_pool is None:
            return
        if wait or not self.staged:
            first = self.pool.start(wait=wait)
            self.verifier_pool.start(wait=wait, after=first)
        elif not self.pool.started:
            self.pool.start(wait=False, spares=False)
        else:
            self.pool.start_spares()
            self.verifier_pool.start(wait=False)

    def deactivate(self) -> Callable[[], None]:
        """Detach the workers (a cached binding keeps only its bundle and its database); returns
        the call that kills them (run it now, or on another thread: nothing reaches them since)."""
        pools = [p for p in (self.pool, self.verifier_pool) if p is not None]
        self.pool = self.verifier_pool = None

        def stop() -> None:
            for pool in pools:
                pool.close()
        return stop
