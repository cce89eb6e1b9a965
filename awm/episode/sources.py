"""Where episodes get instances: one contract, three places instances come from, and the one
function that decides between them.

    source.claim(E)          -> Lease                one instance of environment E
    source.claim_group(E, G) -> [Lease] * <= G       G instances of E, claimed whole (a GRPO group)
    source.release(leases, healthy=...)              back to the source (unhealthy: checked first)

Every lease comes connected (:class:`~awm.episode.session.EnvHandle`: an MCP session and a
control client), so an :class:`~awm.episode.session.EpisodeSession` can start on it at once.

* :class:`PoolSource` - instances already running: a :class:`~awm.fleet.LocalFleet`'s, or the
  lines ``awm serve --json`` prints. An instance that cannot be reached goes to a background
  check and the next one is tried (a dead instance is our failure, never an episode's); a group
  is claimed whole under a lock, never piecemeal (two groups holding half the pool each would
  wait for each other forever); a group may be smaller than asked when the pool is.
* :class:`LocalFleetSource` - a pool of instances this process starts (:class:`~awm.fleet.LocalFleet`).
* :class:`HeldClaimsSource` - a pool of an EnvFleet's instances claimed from the operator's
  allocation API once, at start (per environment, as GRPO groups), renewed while the run lasts,
  a lost instance replaced by a fresh claim; every episode resets its instance itself, so nothing
  goes back to the operator between episodes. What a training or evaluation run uses.
* :class:`OperatorSource` - one operator claim per :meth:`~InstanceSource.claim` (one group
  claim per :meth:`~InstanceSource.claim_group`); releasing it makes the operator reset the
  instances and return them to the fleet. What a framework adapter uses, whose episodes come and
  go at the framework's pace.

:func:`run_source` decides for a run (inside a Campaign's Job: the campaign's fleet; elsewhere a
local fleet); :func:`source_from_config` decides for an adapter's configuration. The interface
claims *by environment*: a source that binds environments late (an operator that starts an
environment's instances on its first claim) fits behind the same two calls.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


from awm.client import ControlApiError, ControlClient
from awm.episode.allocation import (AllocationClient, AllocationError, OperatorSettings, OperatorUnreachable,
                                   new_claim_id)
from awm.episode.session import EnvHandle

log = logging.getLogger("awm.episode.sources")


@dataclass
class Lease:
    """One claimed instance: its environment, name and URLs, the operator claim it is in (if
    any) and its connected clients (kept by a pool between claims)."""

    env: str
    name: str
    mcp_url: str
    control_url: str
    scenario: str = ""
    claim_id: str | None = None
    handle: EnvHandle | None = field(default=None, repr=False)
    late: bool = False  # the instance binds environments late: a claim of another one switches it
    cached: frozenset[str] = frozenset()  # environments it keeps ready (its last /bind said so)
    unswitched: bool = False  # claimed for ``env`` but not switched to it yet: connect() switches it
    switched: dict[str, Any] | None = field(default=None, repr=False)  # its last /bind's answer (bind_ms, phases_ms)

    async def connect(self) -> EnvHandle:
        """The connected clients, made once; an instance the operator left to us to switch
        (``unswitched``) is switched to ``env`` first, through the control client the handle then
        keeps. A switch that fails raises, and the next connect tries again."""
        if self.handle is None:
            control = ControlClient(self.control_url)
            try:
                await self.ensure_switched(control)
            except BaseException:
                await control.close()
                raise
            self.handle = await EnvHandle.connect(self.mcp_url, self.control_url, self.env, self.name,
                                                  self.scenario, control=control)
        return self.handle

    async def ensure_switched(self, control: ControlClient | None = None) -> None:
        """Switch the instance to ``env`` if the operator left that to us (``unswitched``)."""
        if self.unswitched:
            await self._switch(self.env, control)
            self.unswitched = False

    async def disconnect(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            with contextlib.suppress(Exception):
                await handle.close()

    async def bind(self, env: str, scenario: str = "") -> dict[str, Any]:
        """Switch the instance to ``env`` (late binding) and open a new MCP session on it (the
        switch ended the old one) over the connections the lease holds. Returns the env server's
        account of the switch."""
        result = await self._switch(env, self.handle.control if self.handle else None)
        self.env, self.scenario, self.unswitched = env, scenario, False
        if self.handle is None:
            await self.connect()
            return result
        if result.get("switched") is False:  # it served env already: its session did not end
            self.handle.env, self.handle.scenario = env, scenario
            return result
        try:
            await self.handle.renew(env, scenario)
        except BaseException:
            await self.disconnect()
            raise
        return result

    async def _switch(self, env: str, control: ControlClient | None = None) -> dict[str, Any]:
        """``POST /bind`` through ``control`` (a short-lived client when None)."""
        client = control or ControlClient(self.control_url)
        try:
            result = await client.bind(env)
        finally:
            if control is None:
                await client.close()
        self.cached = frozenset(result.get("cached_envs") or (env,))
        self.switched = result
        return result


class EnvironmentRefused(KeyError):
    """A late-binding instance refused to switch to an environment (not in its catalog, broken,
    or the instance is pinned): asking again will not help."""


class InstancesUnavailable(RuntimeError):
    """No instance of an environment could be used for a long while: the fleet, not an episode,
    is broken, and the run stops with what it finished."""


def _leases(leases: Lease | list[Lease]) -> list[Lease]:
    return [leases] if isinstance(leases, Lease) else list(leases)


class InstanceSource(abc.ABC):
    """Where episodes get instances: claim one (or a group) of an environment, give them back."""

    @abc.abstractmethod
    def envs(self) -> list[str]: ...

    @abc.abstractmethod
    async def claim(self, env: str | None = None) -> Lease:
        """A connected instance of ``env`` that nobody else uses until :meth:`release` (waits if
        none is free); ``None``: the environments in turn."""

    @abc.abstractmethod
    async def claim_group(self, env: str, size: int) -> list[Lease]:
        """``size`` connected instances of ``env`` at once (fewer when the source has fewer:
        the caller then runs its samples on them in turns)."""

    @abc.abstractmethod
    async def release(self, leases: Lease | list[Lease], healthy: bool = True) -> None:
        """Give instances back; ``healthy=False``: one failed us and must be checked first."""

    async def prepare(self, wants: Mapping[str, int]) -> None:
        """A hint: ``wants`` (environment -> instances) will be claimed soon (a GRPO step's next
        groups), so a source that binds environments late may make them ready now, off the
        claim path. Never fails a run; the default does nothing."""
        return None

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> InstanceSource:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _RoundRobin:
    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, envs: list[str]) -> str:
        if not envs:
            raise ValueError("no environments to claim from")
        return envs[next(self._turn) % len(envs)]


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
        self._turns = _RoundRobin()
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
        for lease in _leases(leases):
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


class OperatorClaims:
    """Claims of one holder on one EnvFleet, through the operator's allocation API: waits out
    the operator's transient answers (a fleet still starting its pods: 409; unknown for a moment
    after a campaign made it: 404; a standby replica: 503; an unreachable operator) until
    ``claim_timeout_s``."""

    def __init__(self, settings: OperatorSettings, *, client: AllocationClient | None = None,
                 claim_timeout_s: float = 1800.0, ttl_s: float | None = 600.0,
                 scenarios: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.alloc = client or settings.client()
        self._own = client is None
        self.holder = settings.holder
        self.claim_timeout_s, self.ttl_s = claim_timeout_s, ttl_s
        self.scenarios = dict(scenarios or {})

    async def claim(self, env: str, count: int, group_size: int | None) -> list[Lease]:
        deadline = time.monotonic() + self.claim_timeout_s
        extra: dict[str, Any] = {"ttl_seconds": self.ttl_s} if self.ttl_s else {}
        # One id for every attempt: an attempt whose answer was lost (the operator bound it, the
        # connection broke) is returned by the next one instead of held by nobody until its TTL.
        claim_id = new_claim_id()
        delay = 0.5
        while True:
            left = deadline - time.monotonic()
            try:
                got = await self.alloc.claim(count=count, group_size=group_size, environment=env,
                                             wait_seconds=max(0.0, min(60.0, left)), holder=self.holder,
                                             switch="client", claim_id=claim_id, **extra)
                break
            except AllocationError as exc:
                if exc.status not in (404, 409, 503) or left <= 0:
                    raise
                log.info("claiming %d of %s: %s (waiting)", count, env, exc)
            except OperatorUnreachable as exc:
                if left <= 0:
                    raise
                log.info("claiming %d of %s: operator unreachable: %s (retrying)", count, env, exc)
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 5.0)
        # A late-binding fleet leaves the switch to us (switch="client"): each lease switches its
        # instance when it connects, so a group's switches run at once on its pods.
        return [Lease(i.environment, i.pod, i.mcp_url, i.control_url, self.scenarios.get(i.environment, ""),
                      got.id, unswitched=i.switched is False) for i in got.instances]

    async def release(self, claim_id: str) -> None:
        """Release one claim (the operator resets its instances); a failure is left to its TTL."""
        try:
            await self.alloc.release(claim_id)
        except (AllocationError, OperatorUnreachable) as exc:
            log.warning("releasing claim %s: %s", claim_id, exc)

    async def release_holder(self) -> None:
        """Release whatever this holder still has (none, usually: a crashed predecessor's claims,
        an episode cut short). An operator that does not know the fleet yet (404) holds none; a
        standby (503) or an unreachable one is asked a few times, then the claims are left to
        their TTL."""
        if self.holder is None:
            return
        for delay in (0.5, 1.0, 2.0, 4.0, 0.0):
            try:
                got = await self.alloc.release_holder(self.holder)
                if got.released:
                    log.warning("released %d claims (%d instances) that %s still held", len(got.released),
                                got.returned + got.replaced, self.holder)
                return
            except AllocationError as exc:
                if exc.status == 404:
                    return
                log.info("releasing the claims of %s: %s", self.holder, exc)
            except OperatorUnreachable as exc:
                log.info("releasing the claims of %s: operator unreachable: %s", self.holder, exc)
            await asyncio.sleep(delay)

    async def close(self) -> None:
        if self._own:
            await self.alloc.close()


class HeldClaimsSource(PoolSource):
    """Instances of an EnvFleet claimed once and held for the run (see the module's docstring).

    ``per_env`` instances of every environment are claimed at start (as GRPO groups of
    ``group_size`` when it divides ``per_env``), and released on close. In a campaign the claims
    are held as ``campaign/<name>``, and start first releases whatever that holder still has: a
    Job's retried pod gets the instances its crashed predecessor held at once, instead of after
    their TTL (the campaign's fleet has no others to give).
    """

    def __init__(self, settings: OperatorSettings, envs: list[str], per_env: int, group_size: int | None = None,
                 scenarios: Mapping[str, str] | None = None, *, claim_timeout_s: float = 1800.0,
                 claim_ttl_s: float | None = 600.0, ready_timeout_s: float = 120.0,
                 client: AllocationClient | None = None) -> None:
        super().__init__([], ready_timeout_s=ready_timeout_s)
        if per_env < 1:
            raise ValueError("per_env must be at least 1")
        self.settings = settings
        self._envs = list(envs)
        self.per_env, self.group_size = per_env, group_size
        self.claim_ttl_s = claim_ttl_s
        self.operator = OperatorClaims(settings, client=client, claim_timeout_s=claim_timeout_s, ttl_s=claim_ttl_s,
                                       scenarios=scenarios)
        self.alloc = self.operator.alloc
        self.holder = self.operator.holder
        self.claims: list[str] = []   # allocation-API claim ids, released on close
        self._renewer: asyncio.Task[None] | None = None

    def envs(self) -> list[str]:
        return list(self._envs)

    async def start(self) -> HeldClaimsSource:
        groups = self.group_size if self.group_size and self.group_size > 1 and self.per_env % self.group_size == 0 \
            else None
        try:
            await self.operator.release_holder()
            claimed = await asyncio.gather(*(self._claim(env, self.per_env, groups) for env in self._envs))
        except BaseException:
            await self.close()
            raise
        for leases in claimed:
            for lease in leases:
                self._add(lease)
        if self.claim_ttl_s:
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())
        log.info("claimed %d instances of %d environments from fleet %s/%s", len(self._all), len(self._envs),
                 self.settings.namespace, self.settings.fleet)
        return self

    async def __aenter__(self) -> HeldClaimsSource:
        return await self.start()

    async def _claim(self, env: str, count: int, group_size: int | None) -> list[Lease]:
        leases = await self.operator.claim(env, count, group_size)
        self.claims.extend(dict.fromkeys(lease.claim_id for lease in leases if lease.claim_id))
        # Switched now, all at once (the operator leaves that to us): an environment the
        # instances refuse fails the claim here, as it would have failed at the operator, rather
        # than every episode's connect later.
        failed = [r for r in await asyncio.gather(*(lease.ensure_switched() for lease in leases), return_exceptions=True)
                  if isinstance(r, BaseException)]
        if failed:
            raise failed[0]
        return leases

    async def _renew_forever(self) -> None:
        """Renew every claim at a third of its TTL. An operator without claim TTLs has nothing
        to renew (HTTP 405 on the first try): then stop."""
        assert self.claim_ttl_s
        renew = getattr(self.alloc, "renew", None)
        if renew is None:
            return
        while True:
            await asyncio.sleep(self.claim_ttl_s / 3)
            for claim_id in list(self.claims):
                try:
                    await renew(claim_id, ttl_seconds=self.claim_ttl_s)
                except AllocationError as exc:
                    if exc.status == 405:
                        return
                    log.warning("renewing claim %s: %s", claim_id, exc)
                except OperatorUnreachable as exc:
                    log.warning("renewing claim %s: %s", claim_id, exc)

    async def _revive(self, lease: Lease) -> None:
        """An instance that failed us: back to the pool once ready again; if it stays down (its
        pod was lost), claim a replacement of the same environment instead."""
        if await self._wait_ready(lease):
            self._queues[lease.env].put_nowait(lease)
            return
        log.warning("instance %s of %s did not come back: claiming a replacement", lease.name, lease.env)
        (replacement,) = await self._claim(lease.env, 1, None)
        with contextlib.suppress(ValueError):
            self._all.remove(lease)
        self._add(replacement)

    async def close(self) -> None:
        """Close the connections, then release every claim (the operator resets the instances)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._renewer
            self._renewer = None
        await super().close()
        for claim_id in list(self.claims):
            await self.operator.release(claim_id)
            self.claims.remove(claim_id)
        await self.operator.close()


class OperatorSource(InstanceSource):
    """Instances of an EnvFleet, one operator claim per episode (or per GRPO group).

    ``envs`` names the fleet's environments (the allocation API claims by environment)."""

    def __init__(self, settings: OperatorSettings, envs: list[str], ttl_seconds: float | None = 600.0,
                 claim_timeout_s: float = 1800.0, client: AllocationClient | None = None,
                 scenarios: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self._envs = list(envs)
        self.operator = OperatorClaims(settings, client=client, claim_timeout_s=claim_timeout_s, ttl_s=ttl_seconds,
                                       scenarios=scenarios)
        self.alloc = self.operator.alloc
        self.holder = self.operator.holder
        self._turns = _RoundRobin()

    def envs(self) -> list[str]:
        return list(self._envs)

    async def _connected(self, leases: list[Lease]) -> list[Lease]:
        try:
            # a group's switches at once; every connect ends before the group is given back
            failed = [r for r in await asyncio.gather(*(lease.connect() for lease in leases), return_exceptions=True)
                      if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
        except BaseException:
            await self.release(leases, healthy=False)
            raise
        return leases

    async def claim(self, env: str | None = None) -> Lease:
        env = self._turns.pick(self._envs) if env is None else env
        (lease,) = await self._connected(await self.operator.claim(env, 1, None))
        return lease

    async def prepare(self, wants: Mapping[str, int]) -> None:
        """The operator makes them ready on the fleet's pods (a late-binding fleet; a pinned
        one refuses, which is fine: its pods serve their environment already)."""
        try:
            await self.alloc.prepare(wants)
        except (AllocationError, OperatorUnreachable) as exc:
            log.info("prepare %s: %s (claims will switch instead)", dict(wants), exc)

    async def claim_group(self, env: str, size: int) -> list[Lease]:
        return await self._connected(await self.operator.claim(env, size, size if size > 1 else None))

    async def release(self, leases: Lease | list[Lease], healthy: bool = True) -> None:
        """Release the claims the leases belong to (a group's one claim, once): the operator
        resets the instances, and replaces one whose reset fails."""
        leases = _leases(leases)
        for lease in leases:
            await lease.disconnect()
        for claim_id in dict.fromkeys(lease.claim_id for lease in leases):
            if claim_id:
                await self.operator.release(claim_id)

    async def close(self) -> None:
        await self.operator.release_holder()  # an episode cut short: its instances go back now
        await self.operator.close()


def run_source(bundles: list[Any], replicas: int, group_size: int | None = None, *,
               database_url: str | None = None, settings: OperatorSettings | None = None,
               instances: int | None = None, **serving: Any) -> InstanceSource:
    """The instance source of a training or evaluation run (start it with ``async with``): inside
    a Campaign's Job (``AWM_OPERATOR_URL`` and ``AWM_FLEET`` set, or ``settings`` given) the
    campaign's fleet, ``replicas`` instances of every environment held for the run; elsewhere a
    local fleet of ``replicas`` per environment on ``database_url`` - or, with ``instances``, that
    many in all, each switched to the environment a claim asks for (late binding: a catalog of a
    thousand environments needs no thousand instances; in a Campaign's Job with ``instances``,
    the campaign's late-binding fleet, one operator claim per group) - (``serving``: its judge,
    verifier kind and ``allow_ungated``). The one place a run decides where instances come from."""
    settings = settings or OperatorSettings.from_env()
    if settings is not None and instances is not None:  # a late-binding fleet: a claim per group
        return OperatorSource(settings, [b.name for b in bundles],
                              scenarios={b.name: b.scenario.description for b in bundles})
    if settings is not None:
        return HeldClaimsSource(settings, [b.name for b in bundles], replicas, group_size,
                                {b.name: b.scenario.description for b in bundles})
    return LocalFleetSource(bundles, replicas, database_url=database_url, instances=instances, **serving)


_configured: dict[str, InstanceSource] = {}


def source_from_config(config: Any) -> InstanceSource:
    """The process's instances for a framework adapter's configuration (made once per config, so
    every environment object of a run shares one pool or one operator client):

    * ``{"instances_file": PATH}`` - the lines ``awm serve --json`` printed;
    * ``{"operator": {"url", "namespace", "fleet", "environments"}}`` - claims from an EnvFleet
      (``{"operator": {"environments": [...]}}`` alone: the rest from a Campaign Job's
      environment, ``AWM_OPERATOR_URL``/``AWM_NAMESPACE``/``AWM_FLEET``).

    Call it on the loop the instances are used from (:func:`awm.integrations.loop.shared_loop`).
    """
    data = dict(config.items()) if hasattr(config, "items") else dict(config)
    key = json.dumps({k: data.get(k) for k in ("instances_file", "operator")}, sort_keys=True, default=str)
    if key in _configured:
        return _configured[key]
    made: InstanceSource
    if data.get("instances_file"):
        made = PoolSource.from_json_lines(data["instances_file"])
    elif data.get("operator") is not None:
        op = dict(data["operator"].items()) if hasattr(data["operator"], "items") else dict(data["operator"])
        settings = OperatorSettings.from_env()
        if op.get("url"):
            settings = OperatorSettings(op["url"].rstrip("/"), op.get("namespace") or "default", op["fleet"],
                                        op.get("campaign"))
        if settings is None:
            raise ValueError("operator: give url and fleet, or run in a Campaign Job (AWM_OPERATOR_URL, AWM_FLEET)")
        made = OperatorSource(settings, list(op.get("environments") or []))
    else:
        raise ValueError("say where the instances are: instances_file (awm serve --json) or operator")
    _configured[key] = made
    return made
