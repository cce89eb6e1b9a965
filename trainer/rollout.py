"""The rollout service: workers claim env instances, run episodes concurrently, and stream
finished GRPO groups to the learner with bounded staleness.

* Instances come from an :class:`awm.episode.sources.InstanceSource` (a local fleet, running
  instances, or an EnvFleet's claims held for the run: :func:`awm.episode.sources.run_source`
  chooses); each episode is :func:`awm.trainer.agent.run_episode` on one claimed instance.
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

import asyncio
import collections
import contextlib
import logging
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from awm.episode.reward import RewardConfig
from awm.episode.sources import InstanceSource, InstancesUnavailable, Lease, LocalFleetSource, PoolSource
from awm.trainer.agent import AgentConfig, run_episode
from awm.trainer.policy import Policy, PolicyUnavailable
from awm.trainer.trajectory import Trajectory, TrajectoryLog

log = logging.getLogger("awm.trainer.rollout")

# The sources are the episode layer's; these names stay importable from here for the trainer's users.
__all__ = ["Group", "InstanceSource", "InstancesUnavailable", "Lease", "LocalFleetSource", "PoolSource",
           "RolloutConfig", "RolloutService", "TaskRef"]


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
        self._order: list[TaskRef] = []  # the pass's tasks still to run, the next one last
        self._ahead = 0  # tasks at the end of the order told to the source already (_look_ahead)
        self._telling: set[asyncio.Task[None]] = set()
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
            self._ahead = 0

    def next_task(self) -> TaskRef:
        """Tasks in a fresh shuffled order each pass, so every task is seen equally often."""
        if not self._order:
            self._order = list(self.tasks)
            self._rng.shuffle(self._order)
            self._ahead = 0
        task = self._order.pop()
        self._ahead = max(0, self._ahead - 1)
        return task

    def _look_ahead(self) -> None:
        """Tell the source which environments the next groups will claim (the next
        ``max_inflight_groups`` tasks of the order, each told once), so that a late-binding
        fleet makes them ready while the current groups run (:meth:`InstanceSource.prepare`)."""
        window = min(self.cfg.max_inflight_groups, len(self._order))
        if window <= self._ahead:
            return
        upcoming = self._order[len(self._order) - window:len(self._order) - self._ahead]
        self._ahead = window
        wants: collections.Counter[str] = collections.Counter()
        for task in upcoming:
            wants[task.env] += self.cfg.group_size
        told = asyncio.get_running_loop().create_task(self.source.prepare(dict(wants)))
        self._telling.add(told)
        told.add_done_callback(self._telling.discard)

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
        tasks = [self.next_task() for _ in range(n_groups)]
        self._look_ahead()  # the next step's groups, made ready while these run
        groups = await asyncio.gather(*(self.run_group(task) for task in tasks))
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
            self._look_ahead()
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
        tasks = [t for t in [self._producer, *self._running, *self._telling] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._producer = None
