"""The operator's in-memory view of each fleet, fed by the pod watch and the fleet's ledger.

Allocation must not cost an API list per claim: each fleet keeps its pods (parsed from watch
events and from the operator's own write responses), the claims of its ledger (``ledger.py``:
which claim holds which pods) and, per environment, the ordered set of allocatable pods: ready,
not held by a claim, not reserved. Claims in progress *reserve* pods synchronously (the event
loop is single threaded), so two claims in one operator never pick the same pod; across operator
replicas the ledger's optimistic concurrency is what keeps an instance from being bound twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Collection, Iterable, Mapping

from awm.claims import ClaimRequest
from awm_operator.crds import EnvFleetSpec
from awm_operator.databases import Shard
from awm_operator.pods import PodInfo

if TYPE_CHECKING:  # ledger.py imports this module: a type only (import-linter skips these imports)
    from awm_operator.ledger import Ledger


@dataclass
class ClaimRecord:
    """One claim in the ledger: its GRPO groups of pod names (one group for a plain claim)."""

    groups: list[list[str]]
    created: float = field(default_factory=time.time)
    expires: float | None = None   # unix time after which the operator releases it; None: never
    holder: str | None = None      # who holds it (a campaign's trainer): its successor releases it
    owner: str | None = None       # the authenticated identity that made it (allocation API with auth)

    @property
    def pods(self) -> list[str]:
        return [n for g in self.groups for n in g]

    def group_of(self, pod: str) -> int:
        return next(i for i, g in enumerate(self.groups) if pod in g)

    def dump(self) -> str:
        data: dict[str, Any] = {"groups": self.groups, "created": round(self.created, 3),
                                "expires": None if self.expires is None else round(self.expires, 3)}
        if self.holder is not None:
            data["holder"] = self.holder
        if self.owner is not None:
            data["owner"] = self.owner
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> "ClaimRecord":
        data = json.loads(text)
        return cls(groups=[[str(n) for n in g] for g in data["groups"]], created=float(data.get("created") or 0),
                   expires=None if data.get("expires") is None else float(data["expires"]),
                   holder=data.get("holder"), owner=data.get("owner"))


def unsatisfiable(req: ClaimRequest, spec: EnvFleetSpec | None, environments: list[str] | None = None) -> str | None:
    """Why ``req`` can never be satisfied by the fleet, or None (``environments``: the fleet's,
    where a selector chose them; None while it has not been resolved). What the request alone
    can say (a count, groups that do not divide it) its model says when it is read."""
    if spec is not None:
        known = environments if spec.environment_selector is not None else spec.environments
        if req.environment and known is not None and req.environment not in known:
            return f"environment {req.environment!r} is not in the fleet"
        if spec.autoscale and req.count > spec.max_replicas:
            return f"count ({req.count}) exceeds the fleet's maxReplicas ({spec.max_replicas})"
    return None


def plan(available: Mapping[str, Collection[str]], req: ClaimRequest) -> list[list[str]] | None:
    """Pick pods for a claim, or None if the pool cannot satisfy all of it (claims are
    all-or-nothing). GRPO groups come each from one environment, taken from whichever has the
    most instances left; plain claims draw one at a time from the fullest environment, which
    keeps the pool balanced across environments. Only the pods taken are read from the pools
    (a 4,096-instance pool is not copied for a one-instance claim)."""
    pools = {env: names for env, names in available.items()
             if names and (req.environment is None or env == req.environment)}
    taken = dict.fromkeys(pools, 0)

    def left(env: str) -> int:
        return len(pools[env]) - taken[env]

    def take(env: str, n: int) -> list[str]:
        names = list(islice(pools[env], taken[env], taken[env] + n))
        taken[env] += n
        return names

    if req.group_size:
        groups = []
        for _ in range(req.count // req.group_size):
            env = max(pools, key=left, default=None)
            if env is None or left(env) < req.group_size:
                return None
            groups.append(take(env, req.group_size))
        return groups
    if sum(len(v) for v in pools.values()) < req.count:
        return None
    picked: list[str] = []
    while len(picked) < req.count:
        env = max(pools, key=left)
        # take a run from the fullest environment until it is no longer the fullest
        others = max((left(e) for e in pools if e != env), default=0)
        picked += take(env, min(req.count - len(picked), max(1, left(env) - others)))
    return [picked]


def plan_late(available: Mapping[str, Collection[str]], req: ClaimRequest,
              spare: Collection[str] = (), holding: Mapping[str, Collection[str]] | None = None,
              ) -> list[list[str]] | None:
    """:func:`plan` for a late-binding fleet, where every free pod can serve the claim's
    environment (``available`` is keyed by what each pod serves now, or was made ready for):
    pods filed under it first (a repeat claim costs them a reset, not a switch), then those that
    keep it cached (``holding``: a reset too), then any others, those in ``spare`` (made ready
    for another environment) last. A claim for no environment is planned as :func:`plan` does
    (GRPO groups of one environment each, the one their pods are filed under). Its cost is the
    claim's size, not the fleet's: a claim of an environment no free pod holds takes the first
    others it finds."""
    if req.environment is None:
        return plan(available, req)
    picked = list(islice(available.get(req.environment, ()), req.count))
    held: set[str] = set()  # also filed under another environment: not to be picked twice
    if holding and len(picked) < req.count:
        held.update(islice((n for n in holding.get(req.environment, ()) if n not in spare), req.count - len(picked)))
        picked.extend(held)
    for last in (False, True):
        for env, names in available.items():
            if len(picked) >= req.count:
                break
            if env != req.environment:
                picked.extend(islice((n for n in names if (n in spare) == last and n not in held),
                                     req.count - len(picked)))
    if len(picked) < req.count:
        return None
    size = req.group_size or req.count
    return [picked[i:i + size] for i in range(0, req.count, size)]


@dataclass
class Counts:
    replicas: int = 0      # pods that exist and are not being deleted
    starting: int = 0
    ready: int = 0         # ready and unallocated: the warm pool
    allocated: int = 0

    def as_dict(self) -> dict[str, int]:
        """What the operator's API lists (a fleet's ``show``, the fleets and campaigns lists)."""
        return dataclasses.asdict(self)


@dataclass
class Fleet:
    namespace: str
    name: str
    uid: str = ""
    generation: int = 0
    spec: EnvFleetSpec | None = None
    spec_error: str | None = None
    selected: list[str] | None = None  # what its environmentSelector chose (None: not resolved yet)
    body: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, PodInfo] = field(default_factory=dict)
    # Free pods by the environment they serve now (a late-binding pod's last switch, else its own).
    available: dict[str, dict[str, None]] = field(default_factory=lambda: defaultdict(dict))
    reserved: set[str] = field(default_factory=set)
    doomed: set[str] = field(default_factory=set)            # deleted by us, not yet gone
    pending: dict[str, ClaimRequest] = field(default_factory=dict)  # claim id -> what it waits for
    claiming: set[str] = field(default_factory=set)         # claim ids being bound now (one request each)
    claims: dict[str, ClaimRecord] = field(default_factory=dict)  # the ledger, as last written
    owner: dict[str, str] = field(default_factory=dict)     # pod name -> claim id holding it
    releasing: set[str] = field(default_factory=set)        # claim ids being released
    ledger: Ledger | None = None  # while this replica acts on the fleet
    active: bool = False                                    # this replica's daemon runs it
    deleted: bool = False
    shards: dict[str, Shard] = field(default_factory=dict)  # its Postgres shards, as last probed (databases.py)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    urgent: bool = False                                    # woken by poke(), not only nudge()
    _capacity: asyncio.Event = field(default_factory=asyncio.Event)
    pods_gone_at: float = 0.0                               # last pod removal (database sweep)
    # binding: late - the environment each pod was last switched to by this replica (a pod's
    # label and annotation name the one it started on). Best effort: a claim of an environment
    # always switches its pods (a no-op where they serve it), so a lost entry costs nothing.
    bound_env: dict[str, str] = field(default_factory=dict)
    # binding: late - pods asked to make an environment ready ahead of its claims (POST
    # /prepare): filed under that environment while free, so a claim of it lands there and
    # costs a reset, not a switch. Forgotten once the pod is switched to anything.
    prepared: dict[str, str] = field(default_factory=dict)
    # binding: late - the environments each pod keeps besides the one it is filed under (its
    # answers' ``cached_envs``: served before, or made ready), and the free pods by each of them.
    # A claim of such an environment lands there next (a reset, not a switch): over a GRPO run's
    # steps the pods' caches spread the catalog, so a claim nobody told ahead finds a pod that
    # holds its environment. Best effort like bound_env: a claim always switches its pods.
    cached: dict[str, tuple[str, ...]] = field(default_factory=dict)
    holding: dict[str, dict[str, None]] = field(default_factory=lambda: defaultdict(dict))

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
            self._unfile(old)
        if self._free(info):
            self._file(info)
            self._grew()
        if old is None or (old.ready, old.phase, old.deleting, old.control_url, old.problem) != (
                info.ready, info.phase, info.deleting, info.control_url, info.problem):
            self.poke()

    def _free(self, info: PodInfo) -> bool:
        return info.allocatable and info.name not in self.reserved and info.name not in self.owner

    def remove_pod(self, name: str) -> None:
        old = self.pods.pop(name, None)
        self.doomed.discard(name)
        if old is not None:
            self._unfile(old)  # filed under what it served: before its switch is forgotten
            self.pods_gone_at = time.monotonic()
            self.poke()
        self.bound_env.pop(name, None)
        self.prepared.pop(name, None)
        self.cached.pop(name, None)

    def env_of(self, name: str) -> str | None:
        """The environment a pod serves now, as far as this replica knows."""
        info = self.pods.get(name)
        return self.bound_env.get(name, info.env) if info is not None else self.bound_env.get(name)

    def key_of(self, name: str) -> str | None:
        """What a pod is filed under (:meth:`_key`): the environment a group claim that names
        none switches it to."""
        info = self.pods.get(name)
        return self._key(info) if info is not None else self.bound_env.get(name)

    def _key(self, info: PodInfo) -> str:
        """What a free pod is filed under: the environment it was made ready for, else the one
        it serves. A claim of either costs the pod a reset."""
        return self.prepared.get(info.name) or self.bound_env.get(info.name, info.env)

    def _file(self, info: PodInfo) -> None:
        """Among the free pods: under its key, and under each other environment it holds."""
        key = self._key(info)
        self.available[key][info.name] = None
        for env in self.cached.get(info.name, ()):
            if env != key:
                self.holding[env][info.name] = None

    def _unfile(self, info: PodInfo) -> bool:
        """Take the pod out of the free pods (True if it was there). An environment left with
        none goes too: a late fleet's pods move among a catalog's thousand environments, and the
        plans walk the environments that have free pods, not every one ever served."""
        for env in self.cached.get(info.name, ()):
            holders = self.holding.get(env)
            if holders is not None:
                holders.pop(info.name, None)
                if not holders:
                    del self.holding[env]
        key = self._key(info)
        names = self.available.get(key)
        if names is None or info.name not in names:
            return False
        del names[info.name]
        if not names:
            del self.available[key]
        return True

    def switched(self, name: str, env: str, cached: Iterable[str] | None = None) -> None:
        """binding: late - the pod said it serves ``env`` now (it is held by a claim, but a claim
        released meanwhile may have freed it already: it is filed under ``env`` then), and, when
        it said so, which environments it keeps (``cached``)."""
        def change() -> None:
            self.bound_env[name] = env
            self.prepared.pop(name, None)
            if cached is not None:
                self.cached[name] = tuple(cached)
        self._refile(name, change)

    def reported(self, name: str, env: str, cached: Iterable[str] | None) -> None:
        """binding: late - a held pod's answer at its release: what it serves (its client may
        have switched it) and keeps. What it was made ready for meanwhile stays its key."""
        def change() -> None:
            self.bound_env[name] = env
            if cached is not None:
                self.cached[name] = tuple(cached)
        self._refile(name, change)

    def holds(self, name: str, cached: Iterable[str]) -> None:
        """binding: late - the environments the pod said it keeps (a preparation's answer)."""
        def change() -> None:
            self.cached[name] = tuple(cached)
        self._refile(name, change)

    def mark_prepared(self, name: str, env: str | None) -> None:
        """binding: late - the pod is making ``env`` ready (None: it failed to, or forget it)."""
        def change() -> None:
            if env is None:
                self.prepared.pop(name, None)
            else:
                self.prepared[name] = env
        self._refile(name, change)

    def _refile(self, name: str, change: Callable[[], None]) -> None:
        """Apply ``change`` to what a pod is filed under, keeping a free pod filed."""
        info = self.pods.get(name)
        free = info is not None and self._unfile(info)
        change()
        if free:
            assert info is not None
            self._file(info)

    def to_prepare(self, wants: Mapping[str, int]) -> dict[str, str]:
        """binding: late - pods to make ready for ``wants`` (environment -> instances wanted
        ready, e.g. a GRPO step's groups, known before they are claimed) -> {pod: environment}.
        Pods filed under an environment (serving it, or made ready for it), free or held by a
        claim, count toward it. The rest come from free pods of environments not wanted, then
        from held ones (they make it ready while their episode runs, and are filed under it
        when released); never from pods made ready for another environment already."""
        held = [self.pods[n] for n, claim in self.owner.items()
                if claim not in self.releasing and n in self.pods and not self.pods[n].deleting]
        have: dict[str, int] = defaultdict(int)
        for info in held:
            have[self._key(info)] += 1
        need = {env: n - have[env] - len(self.available.get(env, ()))
                - sum(1 for name in self.holding.get(env, ()) if name not in self.prepared) for env, n in wants.items()}
        need = {env: n for env, n in need.items() if n > 0}
        if not need:
            return {}
        # A pod made ready for an environment told earlier keeps it (a trainer tells its next
        # groups a few at a time): only pods not made ready for anything are asked.
        free = (n for env, names in self.available.items() if env not in wants for n in names
                if n not in self.prepared and not any(e in wants for e in self.cached.get(n, ())))
        others = (info.name for info in held if self._key(info) not in wants and info.name not in self.prepared)
        candidates = iter([*islice(free, sum(need.values())), *islice(others, sum(need.values()))])
        return {name: env for env, n in need.items() for name in islice(candidates, n)}

    @property
    def late(self) -> bool:
        return bool(self.spec is not None and self.spec.late)

    def doom(self, info: PodInfo) -> None:
        """About to delete it: no longer counted nor allocatable, whatever events still say."""
        info.deleting = True
        self.doomed.add(info.name)
        self._unfile(info)

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
            if p.name in self.owner:
                c.allocated += 1
            elif p.allocatable:
                c.ready += 1
            else:
                c.starting += 1
        return c

    # ---- the ledger's claims
    def claim_pods(self, claim_id: str) -> list[PodInfo]:
        """The claim's pods that still exist (a lost pod is in the record, not here)."""
        record = self.claims.get(claim_id)
        return [self.pods[n] for n in record.pods if n in self.pods] if record else []

    def lost_pods(self, claim_id: str) -> list[str]:
        """Pods of the claim that are gone, failed or being deleted: their instance is lost."""
        record = self.claims.get(claim_id)
        if record is None:
            return []
        return [n for n in record.pods if n not in self.pods or self.pods[n].failed or self.pods[n].deleting]

    def set_claims(self, claims: dict[str, ClaimRecord]) -> None:
        """The ledger as read from the API server (start-up, takeover, a conflict)."""
        for claim_id in list(self.claims):
            if claim_id not in claims:
                self.unassign(claim_id)
        for claim_id, record in claims.items():
            self.assign(claim_id, record)

    def assign(self, claim_id: str, record: ClaimRecord) -> None:
        old = self.claims.get(claim_id)
        if old is not None:
            for name in set(old.pods) - set(record.pods):
                self.owner.pop(name, None)
        self.claims[claim_id] = record
        for name in record.pods:
            self.owner[name] = claim_id
            info = self.pods.get(name)
            if info is not None:
                self._unfile(info)
        self.nudge()

    def unassign(self, claim_id: str) -> None:
        """The claim is gone from the ledger: its pods are allocatable again (if still ready)."""
        record = self.claims.pop(claim_id, None)
        if record is None:
            return
        for name in record.pods:
            if self.owner.get(name) == claim_id:
                del self.owner[name]
            info = self.pods.get(name)
            if info is not None and self._free(info):
                self._file(info)
                self._grew()
        self.nudge()

    # ---- allocation support
    def available_lists(self) -> dict[str, list[str]]:
        return {env: list(names) for env, names in self.available.items() if names}

    def reserve(self, names: Iterable[str]) -> None:
        for name in names:
            self.reserved.add(name)
            info = self.pods.get(name)
            if info is not None:
                self._unfile(info)

    def unreserve(self, names: Iterable[str]) -> None:
        for name in names:
            self.reserved.discard(name)
            info = self.pods.get(name)
            if info is not None and self._free(info):
                self._file(info)
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
        """Something the reconciler acts on (pods, the spec, waiting claims): a pass soon."""
        self.urgent = True
        self.wake.set()

    def nudge(self) -> None:
        """Only what the status counts changed (a claim bound or released): a pass within the
        status interval does. A pass looks at every pod and claim (~20 ms of CPU at 4,096
        instances), and claims at hundreds a second ran one every 0.2 s, blocking the loop that
        serves them."""
        self.wake.set()

    def demand(self) -> int:
        return sum(req.count for req in self.pending.values())

    def floors(self, environments: list[str], replicas: int) -> dict[str, int]:
        """What each environment must hold: its allocated instances, then (within ``replicas``,
        oldest claim first) what waiting claims ask of it. A claim for one environment asks all of
        its count there; a GRPO claim asks each group of one environment: where the most
        unallocated pods already are (no pod is moved for it), else the least loaded one. Without
        this, an even spread of the autoscaled total can leave every environment a few instances
        short of a group, and the claim would wait forever. Claims are all-or-nothing, so one that
        cannot fit within ``replicas`` asks nothing (it must not strip the other environments of
        a fixed fleet for a claim that can never bind). Claims for any environment need no
        floor: the total serves them."""
        need = dict.fromkeys(environments, 0)
        for name in self.owner:
            p = self.pods.get(name)
            if p is not None and not p.deleting and p.env in need:
                need[p.env] += 1
        if not self.pending or self.late:  # late binding: any free pod serves any claim
            return need
        free = dict.fromkeys(environments, 0)
        if any(req.group_size for req in self.pending.values()):
            for p in self.pods.values():
                if not (p.deleting or p.failed) and p.env in free and p.name not in self.owner \
                        and p.name not in self.reserved:
                    free[p.env] += 1
        room = replicas - sum(need.values())
        for req in self.pending.values():
            if req.count > room:
                continue
            if req.environment is not None and req.environment in need:
                need[req.environment] += req.count
                free[req.environment] = max(free[req.environment] - req.count, 0)
            elif req.group_size and need:
                g = req.group_size
                for _ in range(req.count // g):
                    env = max(need, key=lambda e: (free[e] >= g, free[e], -need[e]))
                    free[env] = max(free[env] - g, 0)
                    need[env] += g
            else:
                continue
            room -= req.count
        return need


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
