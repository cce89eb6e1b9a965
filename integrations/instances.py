"""Where an integration's episodes get awm instances: a fixed set of running ones, or claims from
the Kubernetes operator's allocation API.

Every RL framework adapter (OpenEnv, TRL, verl, SkyRL) needs the same two things - one instance
of an environment for one episode, and, for GRPO, *a group* of instances of one environment for
the ``G`` samples of one prompt - so both sources offer both, with one contract:

* :class:`InstancePool` - instances already running: a :class:`~awm.fleet.LocalFleet`'s, or the
  lines ``awm serve --json`` prints. A group is claimed whole (under a lock), never piecemeal: two
  groups that each held half of the pool and waited for the other half would wait forever.
* :class:`OperatorInstances` - an EnvFleet through ``awm_operator.client.AllocationClient``: one
  claim of one instance per episode, one group claim (``count=G, groupSize=G``) per GRPO group;
  releasing it makes the operator reset the instances and return them to the pool. Claims carry
  a TTL and a holder, so a trainer that dies does not keep its instances.

A group may be smaller than the number of samples (a local pool with fewer instances than
``G``): the caller then runs the samples on the group's instances in turns.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Slot:
    """One claimed instance: its environment, name and URLs (and the operator claim it is in)."""

    env: str
    name: str
    mcp_url: str
    control_url: str
    claim_id: str | None = None


class Instances(Protocol):
    """The contract every adapter uses (tests run it against both implementations' shapes)."""

    def envs(self) -> list[str]: ...

    async def claim(self, env: str | None = None) -> Slot: ...

    async def claim_group(self, env: str, size: int) -> list[Slot]: ...

    async def release(self, slots: Slot | list[Slot]) -> None: ...

    async def close(self) -> None: ...


class InstancePool:
    """Running instances handed out per environment (waiting while all are in use).

    ``max_steps`` and ``reward`` are the episode settings of whoever serves from the pool (the
    OpenEnv server reads them); the pool itself only hands out instances.
    """

    def __init__(self, slots: list[Slot], max_steps: int = 30, reward: Any = None) -> None:
        self.queues: dict[str, asyncio.Queue[Slot]] = {}
        for slot in slots:
            self.queues.setdefault(slot.env, asyncio.Queue()).put_nowait(slot)
        self.size = len(slots)
        self.capacity = {env: q.qsize() for env, q in self.queues.items()}
        self.max_steps = max_steps
        self.reward = reward
        self._turn = itertools.count()
        self._group_lock: asyncio.Lock | None = None

    @classmethod
    def from_fleet(cls, fleet: Any, **settings: Any) -> InstancePool:
        """The instances of a started :class:`~awm.fleet.LocalFleet`."""
        return cls([Slot(h.env, h.name, h.mcp_url, h.control_url) for h in fleet.instances], **settings)

    @classmethod
    def from_json_lines(cls, path: str | Path, **settings: Any) -> InstancePool:
        """The instances ``awm serve --json`` printed (one JSON object per line)."""
        slots = []
        for line in Path(path).read_text().splitlines():
            if line.strip().startswith("{"):
                data = json.loads(line)
                slots.append(Slot(data["env"], data["instance"], data["mcp_url"], data["control_url"]))
        if not slots:
            raise ValueError(f"{path}: no instances (expected the lines of `awm serve --json`)")
        return cls(slots, **settings)

    def envs(self) -> list[str]:
        return sorted(self.queues)

    def _queue(self, env: str | None) -> asyncio.Queue[Slot]:
        if env is None:
            envs = self.envs()
            env = envs[next(self._turn) % len(envs)]
        if env not in self.queues:
            raise ValueError(f"unknown environment {env!r} (serving: {', '.join(self.envs())})")
        return self.queues[env]

    async def claim(self, env: str | None = None) -> Slot:
        """One instance of ``env`` (round-robin over the environments when None)."""
        return await self._queue(env).get()

    async def claim_group(self, env: str, size: int) -> list[Slot]:
        """``size`` instances of ``env``, or all it has if fewer, claimed whole."""
        queue = self._queue(env)
        if self._group_lock is None:
            self._group_lock = asyncio.Lock()
        async with self._group_lock:
            return [await queue.get() for _ in range(min(size, self.capacity[env]))]

    async def release(self, slots: Slot | list[Slot]) -> None:
        for slot in [slots] if isinstance(slots, Slot) else slots:
            self.queues[slot.env].put_nowait(slot)

    def release_nowait(self, slot: Slot) -> None:
        self.queues[slot.env].put_nowait(slot)

    async def close(self) -> None:
        return None


class OperatorInstances:
    """Instances of an EnvFleet, claimed per episode or per GRPO group from the operator.

    ``settings`` is a :class:`awm.trainer.k8s_source.KubernetesSettings` (from a Campaign Job's
    environment: ``KubernetesSettings.from_env()``); ``envs`` names the fleet's environments
    (the allocation API claims by environment).
    """

    def __init__(self, settings: Any, envs: list[str], ttl_seconds: float | None = 600.0,
                 wait_seconds: float = 60.0, client: Any = None) -> None:
        from awm_operator.client import AllocationClient

        self.settings = settings
        self._envs = list(envs)
        self.ttl_seconds, self.wait_seconds = ttl_seconds, wait_seconds
        self.alloc = client or AllocationClient(settings.operator_url, settings.namespace, settings.fleet)
        self._own = client is None
        self.holder = f"campaign/{settings.campaign}" if getattr(settings, "campaign", None) else None
        self._turn = itertools.count()

    def envs(self) -> list[str]:
        return list(self._envs)

    async def _claim(self, env: str, count: int, group_size: int | None) -> list[Slot]:
        got = await self.alloc.claim(count=count, group_size=group_size, environment=env,
                                     wait_seconds=self.wait_seconds, ttl_seconds=self.ttl_seconds, holder=self.holder)
        return [Slot(i["environment"], i["pod"], i["mcpUrl"], i["controlUrl"], got["id"]) for i in got["instances"]]

    async def claim(self, env: str | None = None) -> Slot:
        if env is None:
            env = self._envs[next(self._turn) % len(self._envs)]
        (slot,) = await self._claim(env, 1, None)
        return slot

    async def claim_group(self, env: str, size: int) -> list[Slot]:
        return await self._claim(env, size, size if size > 1 else None)

    async def release(self, slots: Slot | list[Slot]) -> None:
        """Release the claims the slots belong to (a group's one claim, once)."""
        for claim_id in dict.fromkeys(s.claim_id for s in ([slots] if isinstance(slots, Slot) else slots)):
            if claim_id:
                await self.alloc.release(claim_id)

    async def close(self) -> None:
        if self.holder:  # whatever this holder still has (an episode cut short) goes back now
            await self.alloc.release_holder(self.holder)
        if self._own:
            await self.alloc.close()


_configured: dict[str, Any] = {}


def instances_from_config(config: Any) -> Any:
    """The process's instances for a framework's environment config (made once per config, so
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
    if data.get("instances_file"):
        made: Any = InstancePool.from_json_lines(data["instances_file"])
    elif data.get("operator") is not None:
        from awm.trainer.k8s_source import KubernetesSettings

        op = dict(data["operator"].items()) if hasattr(data["operator"], "items") else dict(data["operator"])
        settings = KubernetesSettings.from_env()
        if op.get("url"):
            settings = KubernetesSettings(op["url"].rstrip("/"), op.get("namespace") or "default", op["fleet"],
                                          op.get("campaign"))
        if settings is None:
            raise ValueError("operator: give url and fleet, or run in a Campaign Job (AWM_OPERATOR_URL, AWM_FLEET)")
        made = OperatorInstances(settings, list(op.get("environments") or []))
    else:
        raise ValueError("say where the instances are: instances_file (awm serve --json) or operator")
    _configured[key] = made
    return made
