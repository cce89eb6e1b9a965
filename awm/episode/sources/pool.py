"""Instances already running, or started by this process: :class:`PoolSource` (a set of
running instances; a group is claimed whole under a lock; an instance that cannot be reached goes
to a background check and the next one is tried) and :class:`LocalFleetSource` (a pool of the
instances of a :class:`~awm.fleet.LocalFleet` it starts)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from awm.client import ControlApiError, ControlClient
from awm.episode.sources.lease import (EnvironmentRefused, InstanceSource, InstancesUnavailable, Lease, RoundRobin,
                                       lease_list)

log = logging.getLogger("awm.episode.sources")


class PoolSource(InstanceSource):
    """A set of running instances (e.g. a local fleet's, or ``awm serve --json``'s lines)."""

    def __init__(self, leases: list[Lease], ready_timeout_s: float = 120.0, claim_timeout_s: float = 600.0,
                 catalog: Mapping[str, str] | None = None) -> None:
        """``catalog``: environment -> scenario that late-binding instances can also serve (a
        claim of one with no free instance switches a free late-binding instance to it)."""
        self._queues: dict[str, asyncio.Queue[Lease]] = {}
        self._catalog = dict(catalog or {})
        self.switches = 0
        self._all: list[Lease] = []
        self._checks: set[asyncio.Task[None]] = set()
        self.ready_timeout_s = ready_timeout_s
        self.claim_timeout_s = claim_timeout_s
        self._leased: dict[str, int] = {}  # per environment: instances claimed and not yet released
        self._group_lock: asyncio.Lock | None = None
        self._turns = RoundRobin()
        for lease in leases:
            self._add(lease)

    @classmethod
    def from_fleet(cls, fleet: Any, scenarios: Mapping[str, str] | None = None, **settings: Any) -> PoolSource:
        """The instances of a started :class:`~awm.fleet.LocalFleet`."""
        scenarios = scenarios or {}
        late = getattr(fleet, "binding", "pinned") == "late"
        catalog = {b.name: scenarios.get(b.name, b.scenario.description) for b in fleet.bundles} if late else None
        return cls([Lease(h.env, h.name, h.mcp_url, h.control_url, scenarios.get(h.env, ""), late=late)
                    for h in fleet.instances], catalog=catalog, **settings)

    @classmethod
    def from_json_lines(cls, path: str | Path, **settings: Any) -> PoolSource:
        """The instances ``awm serve --json`` printed (one JSON object per line)."""
        leases, catalog = [], {}
        for line in Path(path).read_text().splitlines():
            if line.strip().startswith("{"):
                data = json.loads(line)
                if isinstance(data.get("catalog"), list):  # what a late-binding instance can switch to
                    catalog.update({str(name): "" for name in data["catalog"]})
                leases.append(Lease(data["env"], data["instance"], data["mcp_url"], data["control_url"],
                                    late=bool(data.get("late_binding"))))
        if not leases:
            raise ValueError(f"{path}: no instances (expected the lines of `awm serve --json`)")
        return cls(leases, catalog=catalog or None, **settings)

    def add_env(self, env: str, scenario: str = "") -> None:
        """One more environment the late-binding instances can serve (its fleet has it now)."""
        if not self.late:
            raise ValueError("only late-binding instances take environments added while they serve")
        self._catalog.setdefault(env, scenario)

    def _add(self, lease: Lease) -> None:
        self._all.append(lease)
        self._requeue(lease)

    def _requeue(self, lease: Lease) -> None:
        """Free again, filed under the environment the instance serves (never counted as leased)."""
        self._queues.setdefault(lease.env, asyncio.Queue()).put_nowait(lease)

    @property
    def size(self) -> int:
        return len(self._all)

    def envs(self) -> list[str]:
        return sorted(set(self._queues) | set(self._catalog))

    @property
    def late(self) -> bool:
        return any(lease.late for lease in self._all)

    def capacity(self, env: str) -> int:
        """Instances that can serve ``env``: its own, plus every late-binding one."""
        return sum(1 for lease in self._all if lease.env == env or lease.late)

    def _steal(self, env: str) -> Lease | None:
        """A free late-binding instance of another environment, to switch to ``env``: one that
        keeps ``env`` cached first (the switch is a reset there, not a new database), else one
        from the environment with the most free; None if there is none."""
        queues = [(q.qsize(), e) for e, q in self._queues.items() if e != env and q.qsize()]
        for _, other in queues:
            queue = self._queues[other]
            for _ in range(queue.qsize()):
                lease = queue.get_nowait()
                if lease.late and env in lease.cached:
                    return lease
                queue.put_nowait(lease)
        for _, other in sorted(queues, reverse=True):
            queue = self._queues[other]
            for _ in range(queue.qsize()):
                lease = queue.get_nowait()
                if lease.late:
                    return lease
                queue.put_nowait(lease)
        return None

    async def _switch(self, lease: Lease, env: str) -> None:
        """Bind a stolen late-binding instance to ``env``. On failure it goes to a check, filed
        under what it serves (``lease.env`` changes only once the instance said it switched); an
        environment the instance refuses (404, 409, 422: unknown, pinned, broken) is the caller's
        error, :class:`EnvironmentRefused`, and the instance goes back as it was."""
        try:
            await lease.bind(env, self._catalog.get(env, ""))
        except ControlApiError as exc:
            if exc.status in (404, 409, 422):
                self._requeue(lease)
                raise EnvironmentRefused(f"{lease.name} cannot serve {env!r}: {exc}") from None
            self._recheck(lease)
            raise
        except BaseException:
            self._recheck(lease)
            raise
        self.switches += 1

    def free(self, env: str | None = None) -> int:
        """Instances waiting in the pool now (of ``env``, or of all environments)."""
        return sum(q.qsize() for e, q in self._queues.items() if env is None or e == env)

    async def claim(self, env: str | None = None) -> Lease:
        """A connected instance of ``env``. Waiting while others use every instance is normal;
        when none of ``env``'s instances is in use or free for ``claim_timeout_s`` (all are
        down): :class:`InstancesUnavailable`."""
        env = self._turns.pick(self.envs()) if env is None else env
        late = self.late
        if env not in self._queues and not (late and env in self._catalog):
            raise KeyError(f"no instances of environment {env!r} (serving: {', '.join(self.envs()) or 'none'})")
        queue = self._queues.setdefault(env, asyncio.Queue())
        down_since: float | None = None
        last = "every instance is being checked"
        failed_switches, first_failed = 0, 0.0
        while True:
            now = time.monotonic()
            busy = sum(self._leased.values()) if late else self._leased.get(env, 0)
            if busy or not queue.empty() or (late and self.free()):
                down_since = None  # the pool works: others hold the instances, or one is free
            elif down_since is None:
                down_since = now
            elif now - down_since >= self.claim_timeout_s:
                raise InstancesUnavailable(f"no instance of {env!r} could be used for {self.claim_timeout_s:g} s "
                                           f"(last: {last})")
            stolen = self._steal(env) if late and queue.empty() else None
            if stolen is not None:
                try:
                    await self._switch(stolen, env)
                except (asyncio.CancelledError, EnvironmentRefused):
                    raise
                except Exception as exc:  # noqa: BLE001 - checked in the background; try the next
                    last = f"{stolen.name}: switch to {env!r} failed: {type(exc).__name__}: {exc}"
                    log.warning("%s", last)
                    failed_switches += 1
                    first_failed = first_failed or time.monotonic()
                    # Repeated failures stop the claim, once they have lasted claim_timeout_s as
                    # well: a database server that hangs or restarts fails every switch for a
                    # while (each at the client's deadline), and must cost episodes, not the run.
                    if failed_switches >= max(3, len(self._all)) and \
                            time.monotonic() - first_failed >= self.claim_timeout_s:
                        raise InstancesUnavailable(f"{failed_switches} instances failed to switch to {env!r} "
                                                   f"in {time.monotonic() - first_failed:.0f} s (last: {last})") from None
                    continue
                self._leased[env] = self._leased.get(env, 0) + 1
                return stolen
            try:
                # A late pool looks again soon: an instance of another environment may come free.
                async with asyncio.timeout(min(0.05 if late else 5.0, self.claim_timeout_s)):
                    lease = await queue.get()
            except TimeoutError:
                continue
            try:
                await lease.connect()
            except asyncio.CancelledError:
                queue.put_nowait(lease)
                raise
            except Exception as exc:  # noqa: BLE001 - that instance is checked again; try the next
                last = f"{lease.name}: {type(exc).__name__}: {exc}"
                log.warning("instance %s cannot be reached (%s); trying another", lease.name, last)
                self._recheck(lease)
                continue
            self._leased[env] = self._leased.get(env, 0) + 1
            return lease

    async def claim_group(self, env: str, size: int) -> list[Lease]:
        """``size`` instances of ``env``, or all it has if fewer, claimed whole."""
        if self._group_lock is None:
            self._group_lock = asyncio.Lock()
        async with self._group_lock:
            got: list[Lease] = []
            try:
                want = min(size, max(self.capacity(env), 1))
                if self.late:  # the late-binding instances switch at once, not one after another
                    got.extend(await self._switch_group(env, want))
                while len(got) < want:
                    got.append(await self.claim(env))
            except BaseException:
                await self.release(got)
                raise
            return got

    async def _switch_group(self, env: str, want: int) -> list[Lease]:
        """Up to ``want`` free instances for a group of ``env``: its own free ones first, then free
        late-binding ones of other environments, switched concurrently. Those that fail to switch
        go to a check; the caller claims the rest one at a time."""
        queue = self._queues.setdefault(env, asyncio.Queue())
        own: list[Lease] = []
        while len(own) < want and not queue.empty():
            own.append(queue.get_nowait())
        stolen: list[Lease] = []
        while len(own) + len(stolen) < want and (lease := self._steal(env)) is not None:
            stolen.append(lease)
        try:
            results = await asyncio.gather(*(self._switch(lease, env) for lease in stolen), return_exceptions=True)
        except BaseException:  # cancelled: every lease taken goes back (a failed switch is checked)
            for lease in own:
                queue.put_nowait(lease)
            for lease in stolen:
                self._recheck(lease)
            raise
        refused = next((r for r in results if isinstance(r, EnvironmentRefused)), None)
        switched = [lease for lease, r in zip(stolen, results) if not isinstance(r, BaseException)]
        ready: list[Lease] = []
        pending = list(own)
        try:
            while pending:
                lease = pending.pop(0)
                try:
                    await lease.connect()
                    ready.append(lease)
                except Exception:  # noqa: BLE001 - checked in the background
                    self._recheck(lease)
        except BaseException:
            for lease in ready + pending:
                queue.put_nowait(lease)
            for lease in switched:
                self._requeue(lease)
            raise
        ready.extend(switched)
        self._leased[env] = self._leased.get(env, 0) + len(ready)
        if refused is not None:
            for lease in ready:
                self._requeue(lease)
            self._leased[env] -= len(ready)
            raise refused
        return ready

    async def release(self, leases: Lease | list[Lease], healthy: bool = True) -> None:
        for lease in lease_list(leases):
            self.release_nowait(lease, healthy)

    def release_nowait(self, lease: Lease, healthy: bool = True) -> None:
        self._leased[lease.env] = max(self._leased.get(lease.env, 0) - 1, 0)
        if healthy:
            self._requeue(lease)
        else:
            self._recheck(lease)

    def _recheck(self, lease: Lease) -> None:
        """Drop the connection, then :meth:`_revive` the instance in the background."""
        async def check() -> None:
            await lease.disconnect()
            await self._revive(lease)

        task = asyncio.get_running_loop().create_task(check())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _wait_ready(self, lease: Lease) -> bool:
        """Whether the instance answers /readyz within ``ready_timeout_s`` (it may be restarting).
        One that answers "not ready" only because its database connection is down (the server
        restarted under it) is reset: only a reset reconnects it, and nobody else would reset an
        instance that is out of the pool (found by bench/soak.py: after a Postgres restart such
        an instance stayed out of the pool for good)."""
        control = ControlClient(lease.control_url, timeout=5)
        deadline = time.monotonic() + self.ready_timeout_s
        poked = 0.0
        try:
            while time.monotonic() < deadline:
                state = await control.readiness()
                if state is not None and state["ready"]:
                    return True
                if state is not None and state.get("db") is False and not state.get("wedged") \
                        and time.monotonic() - poked >= 1.0:
                    poked = time.monotonic()
                    with contextlib.suppress(Exception):  # the database may still be down: later
                        await control.reset(None, verify=True)
                    continue
                await asyncio.sleep(0.2)
            return False
        finally:
            await control.close()

    async def _revive(self, lease: Lease) -> None:
        """Return an instance that failed us to the pool once it is ready again (a local fleet
        restarts dead instances; a source that can replace instances overrides this). Until it
        answers it stays out of the pool: handing out a dead instance would fail the next claim."""
        while not await self._wait_ready(lease):
            log.warning("instance %s is still not ready after %g s; it stays out of the pool", lease.name,
                        self.ready_timeout_s)
        if lease.late:  # it may have restarted on its first environment: file it under what it serves
            control = ControlClient(lease.control_url, timeout=30)
            try:
                lease.env = str((await control.info()).get("env") or lease.env)
            except Exception as exc:  # noqa: BLE001 - the next claim's connect finds out
                log.warning("instance %s: /info failed after a restart: %s", lease.name, exc)
            finally:
                await control.close()
        self._requeue(lease)

    async def close(self) -> None:
        for task in list(self._checks):
            task.cancel()
        for lease in self._all:
            await lease.disconnect()


class LocalFleetSource(PoolSource):
    """Instances served on this machine by a :class:`~awm.fleet.LocalFleet` (started here).

    ``database``: where the instance databases live; without one, :meth:`start` opens
    ``database_url`` (else ``AWM_DATABASE_URL``, else the embedded server) and :meth:`close`
    closes it again."""

    def __init__(self, bundles: list[Any], replicas: int, database: Any = None, verifier_workers: int = 1,
                 database_url: str | None = None, **serving: Any) -> None:
        """``serving``: the fleet's judge, verifier_kind and allow_ungated (awm.fleet.LocalFleet)."""
        super().__init__([])
        from awm.fleet import LocalFleet

        self.fleet = LocalFleet(bundles, replicas=replicas, database=database, verifier_workers=verifier_workers,
                                **serving)
        self._scenarios = {b.name: b.scenario.description for b in bundles}
        self._database_url = database_url
        self._own_database: Any = None

    async def start(self) -> LocalFleetSource:
        if self.fleet.database is None:
            from awm.fleet import Database

            self._own_database = self.fleet.database = await asyncio.to_thread(Database.open, self._database_url)
        try:
            await self.fleet.start()
        except BaseException:
            await self._close_database()
            raise
        late = self.fleet.binding == "late"
        if late:
            self._catalog = dict(self._scenarios)
        for h in self.fleet.instances:
            self._add(Lease(h.env, h.name, h.mcp_url, h.control_url, self._scenarios.get(h.env, ""), late=late))
        return self

    async def __aenter__(self) -> LocalFleetSource:
        return await self.start()

    async def prepare(self, wants: Mapping[str, int]) -> None:
        """Late binding: the fleet's provisioner makes databases of these environments ahead (one
        per instance that will be claimed, as far as the fleet's instances go), so that the
        instances switched to them connect to a made database instead of cloning one."""
        provisioner = self.fleet.provisioner
        if provisioner is None:
            return
        for env, count in wants.items():
            try:
                await asyncio.to_thread(provisioner.prefill, env, min(count, len(self.fleet.instances)))
            except Exception as exc:  # noqa: BLE001 - a hint: the claim clones on its path instead
                log.info("prepare %s: %s", env, exc)

    async def close(self) -> None:
        try:
            await super().close()
            await self.fleet.stop()
        finally:
            await self._close_database()

    async def _close_database(self) -> None:
        database, self._own_database = self._own_database, None
        if database is not None:
            await asyncio.to_thread(database.close)
