"""The rollout service: workers claim env instances, run episodes concurrently, and stream
finished GRPO groups to the learner with bounded staleness.

* :class:`InstanceSource` is where instances come from. :class:`LocalFleetSource` serves them
  with :class:`awm.fleet.LocalFleet`; :class:`PoolSource` takes instances already running
  (URLs); :class:`awm.trainer.k8s_source.KubernetesSource` claims them from the operator's fleet.
* A *group* is G episodes of one task, each on an instance reset to the task's snapshot (the
  reset engine makes every reset identical; ``verify_reset`` checksums it too). GRPO compares
  the G rewards, so they must differ only by the policy's sampling.
* Asynchronous mode (:meth:`RolloutService.start` + :meth:`next_groups`): a producer keeps at
  most ``max_inflight_groups`` groups running or waiting, so environments work while the
  learner trains. Every turn carries the policy version that generated it; a group whose oldest
  turn is more than ``max_staleness`` versions behind the learner is dropped, not trained on.
  Synchronous mode (:meth:`collect`) runs a batch and returns it, for comparison and evaluation.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from awm.bundle import EnvBundle
from awm.trainer.agent import AgentConfig, EnvHandle, run_episode
from awm.trainer.policy import Policy, PolicyUnavailable
from awm.trainer.reward import RewardConfig
from awm.trainer.trajectory import Trajectory, TrajectoryLog

log = logging.getLogger("awm.trainer.rollout")


@dataclass
class Lease:
    """One claimed instance; the source keeps its connected clients between claims."""

    env: str
    name: str
    mcp_url: str
    control_url: str
    scenario: str = ""
    handle: EnvHandle | None = field(default=None, repr=False)


class InstancesUnavailable(RuntimeError):
    """No instance of an environment could be used for a long while: the fleet, not an episode,
    is broken, and the run stops with what it finished."""


class InstanceSource(abc.ABC):
    """Where episodes get instances: claim one of an environment, give it back after the episode."""

    @abc.abstractmethod
    def envs(self) -> list[str]: ...

    @abc.abstractmethod
    async def claim(self, env: str) -> Lease:
        """An instance of ``env`` that nobody else uses until :meth:`release` (waits if none is free)."""

    @abc.abstractmethod
    async def release(self, lease: Lease, healthy: bool = True) -> None:
        """Give the instance back; ``healthy=False`` means it failed us and must be checked first."""

    async def close(self) -> None:
        return None


class PoolSource(InstanceSource):
    """A fixed set of running instances (e.g. from ``awm serve --json``)."""

    def __init__(self, leases: list[Lease], ready_timeout_s: float = 120.0, claim_timeout_s: float = 600.0) -> None:
        self._queues: dict[str, asyncio.Queue[Lease]] = {}
        self._all = list(leases)
        self._checks: set[asyncio.Task[None]] = set()
        self.ready_timeout_s = ready_timeout_s
        self.claim_timeout_s = claim_timeout_s
        self._leased: dict[str, int] = {}  # per environment: instances claimed and not yet released
        for lease in leases:
            self._queues.setdefault(lease.env, asyncio.Queue()).put_nowait(lease)

    def envs(self) -> list[str]:
        return list(self._queues)

    def capacity(self, env: str) -> int:
        return sum(1 for lease in self._all if lease.env == env)

    async def claim(self, env: str) -> Lease:
        """A connected instance of ``env``. One that cannot be reached goes to a background check
        and the next one is tried: a dead instance is our failure, never the episode's. Waiting
        while others use every instance is normal; when none of ``env``'s instances is in use or
        free for ``claim_timeout_s`` (all are down): :class:`InstancesUnavailable`."""
        if env not in self._queues:
            raise KeyError(f"no instances of environment {env!r}")
        queue = self._queues[env]
        down_since: float | None = None
        last = "every instance is being checked"
        while True:
            now = time.monotonic()
            if self._leased.get(env, 0) or not queue.empty():
                down_since = None  # the pool works: others hold the instances, or one is free
            elif down_since is None:
                down_since = now
            elif now - down_since >= self.claim_timeout_s:
                raise InstancesUnavailable(f"no instance of {env!r} could be used for {self.claim_timeout_s:g} s "
                                           f"(last: {last})")
            try:
                async with asyncio.timeout(min(5.0, self.claim_timeout_s)):
                    lease = await queue.get()
            except TimeoutError:
                continue
            if lease.handle is not None:
                self._leased[env] = self._leased.get(env, 0) + 1
                return lease
            try:
                lease.handle = await EnvHandle.connect(lease.mcp_url, lease.control_url, lease.env, lease.name,
                                                       lease.scenario)
                self._leased[env] = self._leased.get(env, 0) + 1
                return lease
            except asyncio.CancelledError:
                self._queues[env].put_nowait(lease)
                raise
            except Exception as exc:  # noqa: BLE001 - that instance is checked again; try the next
                last = f"{lease.name}: {type(exc).__name__}: {exc}"
                log.warning("instance %s cannot be reached (%s); trying another", lease.name, last)
                self._recheck(lease)

    async def release(self, lease: Lease, healthy: bool = True) -> None:
        self._leased[lease.env] = max(self._leased.get(lease.env, 0) - 1, 0)
        if healthy:
            self._queues[lease.env].put_nowait(lease)
        else:
            self._recheck(lease)

    def _recheck(self, lease: Lease) -> None:
        """Drop the connection, then :meth:`_revive` the instance in the background."""
        async def check() -> None:
            handle, lease.handle = lease.handle, None
            if handle is not None:
                with contextlib.suppress(Exception):
                    await handle.close()
            await self._revive(lease)

        task = asyncio.get_running_loop().create_task(check())
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _wait_ready(self, lease: Lease) -> bool:
        """Whether the instance answers /readyz within ``ready_timeout_s`` (it may be restarting)."""
        from awm.client import ControlClient

        control = ControlClient(lease.control_url, timeout=5)
        deadline = time.monotonic() + self.ready_timeout_s
        try:
            while time.monotonic() < deadline:
                if await control.ready():
                    return True
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
        self._queues[lease.env].put_nowait(lease)

    async def close(self) -> None:
        for task in list(self._checks):
            task.cancel()
        for lease in self._all:
            if lease.handle is not None:
                with contextlib.suppress(Exception):
                    await lease.handle.close()
                lease.handle = None


class LocalFleetSource(PoolSource):
    """Instances served on this machine by a :class:`~awm.fleet.LocalFleet` (started here)."""

    def __init__(self, bundles: list[EnvBundle], replicas: int, database: Any = None, verifier_workers: int = 1,
                 **serving: Any) -> None:
        """``serving``: the fleet's judge, verifier_kind and allow_ungated (awm.fleet.LocalFleet)."""
        super().__init__([])
        from awm.fleet import LocalFleet

        self.fleet = LocalFleet(bundles, replicas=replicas, database=database, verifier_workers=verifier_workers,
                                **serving)
        self._scenarios = {b.name: b.scenario.description for b in bundles}

    async def start(self) -> LocalFleetSource:
        await self.fleet.start()
        leases = [Lease(h.env, h.name, h.mcp_url, h.control_url, self._scenarios.get(h.env, ""))
                  for h in self.fleet.instances]
        PoolSource.__init__(self, leases)
        return self

    async def __aenter__(self) -> LocalFleetSource:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await super().close()
        await self.fleet.stop()


@dataclass(frozen=True)
class TaskRef:
    env: str
    task_id: str


@dataclass
class Group:
    group_id: str
    task: TaskRef
    trajectories: list[Trajectory]

    @property
    def policy_version(self) -> int:
        return min((t.policy_version for t in self.trajectories), default=0)


@dataclass
class RolloutConfig:
    group_size: int = 4
    max_staleness: int = 1
    max_inflight_groups: int = 4
    seed: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> RolloutConfig:
        return cls(**(data or {}))


class RolloutService:
    def __init__(self, source: InstanceSource, policy: Policy, tasks: list[TaskRef], agent: AgentConfig,
                 reward: RewardConfig, cfg: RolloutConfig, log: TrajectoryLog | None = None,
                 on_trajectory: Callable[[Trajectory], None] | None = None) -> None:
        if not tasks:
            raise ValueError("no tasks to roll out")
        self.source, self.policy, self.tasks = source, policy, list(tasks)
        self.agent, self.reward, self.cfg, self.log = agent, reward, cfg, log
        self.on_trajectory = on_trajectory
        self._rng = random.Random(cfg.seed)
        self._order: list[TaskRef] = []
        self._queue: asyncio.Queue[Group | BaseException] = asyncio.Queue()
        self._slots = asyncio.Semaphore(cfg.max_inflight_groups)
        self._producer: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self.dropped_stale = 0
        self.wait_s = 0.0  # time the learner spent waiting in next_groups()
        self.policy_failure: PolicyUnavailable | None = None  # once set, no new episode starts

    def rng_state(self) -> dict[str, Any]:
        """Where the task order stands (for a checkpoint: a resumed run sees the same tasks next)."""
        return {"rng": self._rng.getstate(), "order": [(t.env, t.task_id) for t in self._order]}

    def set_rng_state(self, state: dict[str, Any] | None) -> None:
        if state:
            self._rng.setstate(state["rng"])
            self._order = [TaskRef(env, task_id) for env, task_id in state["order"]]

    def next_task(self) -> TaskRef:
        """Tasks in a fresh shuffled order each pass, so every task is seen equally often."""
        if not self._order:
            self._order = list(self.tasks)
            self._rng.shuffle(self._order)
        return self._order.pop()

    async def run_group(self, task: TaskRef) -> Group:
        group_id = uuid.uuid4().hex[:12]
        # every episode ends before the group does (a failed one must not leave its siblings
        # running on instances that are about to be closed)
        results = await asyncio.gather(*(self._episode(task, group_id, i) for i in range(self.cfg.group_size)),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return Group(group_id, task, list(results))  # type: ignore[arg-type]

    async def _episode(self, task: TaskRef, group_id: str, index: int) -> Trajectory:
        if self.policy_failure is not None:
            raise self.policy_failure
        lease = await self.source.claim(task.env)
        healthy = True
        try:
            if self.policy_failure is not None:  # failed while we waited for the instance
                raise self.policy_failure
            assert lease.handle is not None
            traj = await run_episode(self.policy, lease.handle, task.task_id, self.agent, self.reward, self.log,
                                     group_id, index)
            healthy = traj.infra_error is None
        except PolicyUnavailable as exc:
            # the instance is fine (the next episode resets it anyway); the policy is not: episodes
            # still waiting for an instance never start, the ones running finish on their own
            self.policy_failure = self.policy_failure or exc
            raise
        except BaseException:
            healthy = False
            raise
        finally:
            await self.source.release(lease, healthy)
        if self.on_trajectory:
            self.on_trajectory(traj)
        return traj

    # -- synchronous -------------------------------------------------------------------------

    async def collect(self, n_groups: int) -> list[Group]:
        """Run ``n_groups`` groups now (concurrently) and return them: the synchronous baseline."""
        t0 = time.perf_counter()
        groups = await asyncio.gather(*(self.run_group(self.next_task()) for _ in range(n_groups)))
        self.wait_s += time.perf_counter() - t0
        return list(groups)

    # -- asynchronous ------------------------------------------------------------------------

    def start(self) -> None:
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(self._produce())

    async def _produce(self) -> None:
        while True:
            await self._slots.acquire()
            task = asyncio.get_running_loop().create_task(self._produce_one(self.next_task()))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _produce_one(self, task: TaskRef) -> None:
        try:
            group = await self.run_group(task)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - e.g. PolicyUnavailable: hand it to the learner
            await self._queue.put(exc)
            return
        await self._queue.put(group)

    async def next_groups(self, n: int) -> list[Group]:
        """The next ``n`` finished groups that are fresh enough for the learner's current version."""
        t0 = time.perf_counter()
        out: list[Group] = []
        try:
            while len(out) < n:
                item = await self._queue.get()
                self._slots.release()
                if isinstance(item, BaseException):
                    raise item
                if self.policy.version - item.policy_version > self.cfg.max_staleness:
                    self.dropped_stale += 1
                    continue
                out.append(item)
        finally:
            self.wait_s += time.perf_counter() - t0
        return out

    async def stop(self) -> None:
        tasks = [t for t in [self._producer, *self._running] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._producer = None
