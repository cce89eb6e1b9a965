"""The operator's in-memory view of each fleet, fed by kopf's watch events.

Allocation must not cost an API list per claim: each fleet keeps its pods (parsed from watch
events and from the operator's own write responses) and, per environment, the ordered set of
allocatable ones. Claims in progress *reserve* pods synchronously (the event loop is single
threaded), so two claims in one operator never pick the same pod; across operator replicas the
JSON-patch test-and-set on the state label is what keeps an instance from being bound twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from awm_operator.crds import EnvFleetSpec
from awm_operator.pods import ALLOCATED, PodInfo


@dataclass(frozen=True)
class ClaimRequest:
    count: int
    environment: str | None = None
    group_size: int | None = None

    def problem(self, spec: EnvFleetSpec | None) -> str | None:
        """Why this request can never be satisfied by the fleet, or None."""
        if self.count < 1:
            return "count must be at least 1"
        if self.group_size and self.count % self.group_size:
            return f"count ({self.count}) must be a multiple of groupSize ({self.group_size})"
        if spec is not None:
            if self.environment and self.environment not in spec.environments:
                return f"environment {self.environment!r} is not in the fleet"
            if spec.autoscale and self.count > spec.max_replicas:
                return f"count ({self.count}) exceeds the fleet's maxReplicas ({spec.max_replicas})"
        return None


def plan(available: Mapping[str, Iterable[str]], req: ClaimRequest) -> list[list[str]] | None:
    """Pick pods for a claim, or None if the pool cannot satisfy all of it (claims are
    all-or-nothing). GRPO groups come each from one environment, taken from whichever has the
    most instances left; plain claims draw one at a time from the fullest environment, which
    keeps the pool balanced across environments."""
    pools = {env: list(names) for env, names in available.items()
             if names and (req.environment is None or env == req.environment)}
    taken = dict.fromkeys(pools, 0)

    def left(env: str) -> int:
        return len(pools[env]) - taken[env]

    if req.group_size:
        groups = []
        for _ in range(req.count // req.group_size):
            env = max(pools, key=left, default=None)
            if env is None or left(env) < req.group_size:
                return None
            groups.append(pools[env][taken[env]:taken[env] + req.group_size])
            taken[env] += req.group_size
        return groups
    if sum(len(v) for v in pools.values()) < req.count:
        return None
    picked: list[str] = []
    while len(picked) < req.count:
        env = max(pools, key=left)
        # take a run from the fullest environment until it is no longer the fullest
        others = max((left(e) for e in pools if e != env), default=0)
        n = min(req.count - len(picked), max(1, left(env) - others))
        picked += pools[env][taken[env]:taken[env] + n]
        taken[env] += n
    return [picked]


@dataclass
class Counts:
    replicas: int = 0      # pods that exist and are not being deleted
    starting: int = 0
    ready: int = 0         # ready and unallocated: the warm pool
    allocated: int = 0


@dataclass
class Fleet:
    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    spec: EnvFleetSpec | None = None
    spec_error: str | None = None
    body: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    available: dict[str, dict[str, None]] = field(default_factory=lambda: defaultdict(dict))
    reserved: set[str] = field(default_factory=set)
    doomed: set[str] = field(default_factory=set)            # deleted by us, not yet gone
    pending: dict[str, int] = field(default_factory=dict)   # claim id -> instances it waits for
    active: bool = False                                    # this replica's daemon runs it
    deleted: bool = False
    admin_dsn: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    _capacity: asyncio.Event = field(default_factory=asyncio.Event)
    pods_gone_at: float = 0.0                               # last pod removal (database sweep)

    # ---- spec
    def set_body(self, body: dict[str, Any]) -> None:
        meta = body.get("metadata") or {}
        self.body, self.uid = body, meta.get("uid", self.uid)
        generation = int(meta.get("generation") or 0)
        if self.spec is None or generation != self.generation:
            try:
                self.spec, self.spec_error = EnvFleetSpec.model_validate(body.get("spec") or {}), None
            except ValueError as exc:
                self.spec_error = str(exc)
            self.generation = generation
        self.poke()

    # ---- pods
    def update_pod(self, info: PodInfo) -> None:
        old = self.pods.get(info.name)
        if old is not None and info.rv and old.rv and info.rv < old.rv:
            return  # a watch event older than a write response we already applied
        if info.name in self.doomed:
            info.deleting = True
        self.pods[info.name] = info
        if old is not None:
            self.available[old.env].pop(info.name, None)
        if info.allocatable and info.name not in self.reserved:
            self.available[info.env][info.name] = None
            self._grew()
        if old is None or (old.state, old.ready, old.phase, old.deleting, old.claim) != (
                info.state, info.ready, info.phase, info.deleting, info.claim):
            self.poke()

    def remove_pod(self, name: str) -> None:
        old = self.pods.pop(name, None)
        self.doomed.discard(name)
        if old is not None:
            self.available[old.env].pop(name, None)
            self.pods_gone_at = time.monotonic()
            self.poke()

    def forget_available(self, name: str) -> None:
        """A pod lost a race we did not see yet: not allocatable until its next event."""
        info = self.pods.get(name)
        if info is not None:
            self.available[info.env].pop(name, None)
            info.state = "unknown"  # until the watch brings the winner's version

    def doom(self, info: PodInfo) -> None:
        """About to delete it: no longer counted nor allocatable, whatever events still say."""
        info.deleting = True
        self.doomed.add(info.name)
        self.available[info.env].pop(info.name, None)

    def spare(self, info: PodInfo) -> None:
        """The deletion did not happen (a precondition failed): count it again."""
        self.doomed.discard(info.name)
        current = self.pods.get(info.name)
        if current is not None:
            current.deleting = False
            self.update_pod(current)

    def counts(self) -> Counts:
        c = Counts()
        for p in self.pods.values():
            if p.deleting:
                continue
            c.replicas += 1
            if p.state == ALLOCATED or p.claim is not None:
                c.allocated += 1
            elif p.allocatable:
                c.ready += 1
            else:
                c.starting += 1
        return c

    def claim_pods(self, claim_id: str) -> list[PodInfo]:
        return [p for p in self.pods.values() if p.claim == claim_id]

    # ---- allocation support
    def available_lists(self) -> dict[str, list[str]]:
        return {env: list(names) for env, names in self.available.items() if names}

    def reserve(self, names: Iterable[str]) -> None:
        for name in names:
            self.reserved.add(name)
            info = self.pods.get(name)
            if info is not None:
                self.available[info.env].pop(name, None)

    def unreserve(self, names: Iterable[str]) -> None:
        for name in names:
            self.reserved.discard(name)
            info = self.pods.get(name)
            if info is not None and info.allocatable:
                self.available[info.env][name] = None
                self._grew()

    async def wait_capacity(self, timeout: float | None) -> None:
        """Until more instances may be allocatable (or the fleet's state changed)."""
        event = self._capacity
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass

    def _grew(self) -> None:
        self._capacity.set()
        self._capacity = asyncio.Event()

    def poke(self) -> None:
        self.wake.set()

    def demand(self) -> int:
        return sum(self.pending.values())


class Fleets:
    """Every fleet this operator has seen, keyed by (namespace, name)."""

    def __init__(self) -> None:
        self._fleets: dict[tuple[str, str], Fleet] = {}

    def get(self, namespace: str, name: str) -> Fleet | None:
        return self._fleets.get((namespace, name))

    def ensure(self, namespace: str, name: str) -> Fleet:
        key = (namespace, name)
        fleet = self._fleets.get(key)
        if fleet is None:
            fleet = self._fleets[key] = Fleet(namespace, name)
        return fleet

    def drop(self, namespace: str, name: str) -> None:
        fleet = self._fleets.pop((namespace, name), None)
        if fleet is not None:
            fleet.deleted, fleet.active = True, False
            fleet._grew()  # waiting claims notice the fleet is gone

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._fleets.values()))

    def acting(self) -> bool:
        """Whether this replica acts (kopf stops every daemon of a paused, standby replica)."""
        fleets = [f for f in self._fleets.values() if f.spec is not None]
        return not fleets or any(f.active for f in fleets)
