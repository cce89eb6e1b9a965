"""Each fleet's allocation ledger: which claim holds which instances, in ConfigMaps.

Why ConfigMaps and not a label on each pod: a binding must be durable (an operator restart, or a
standby taking over, must not hand an allocated instance out again) and atomic (all of a claim's
instances or none). Marking pods costs the API server about 15 ms of CPU per pod write (decoding,
validation, etcd, and the fan-out to the scheduler, the kubelets and every pod watcher): one write
per claimed instance and one more per released one held 2 cores to about 25 claim-and-release
cycles per second, and an 8 x 8 GRPO claim took 64 writes.

The ledger is the ConfigMap ``<fleet>-claims`` (owned by the EnvFleet, so it goes with it), and
once that one is full ``<fleet>-claims-1``, ``-2``, ... (``shards.py``: a ConfigMap holds at most
1 MiB, and 4,096 one-instance claims can need 3 MB): one key per claim, whose value lists the
claim's GRPO groups of pod names. It is written by *group commit*: changes that arrive while a
write is in flight go together in the next one, one JSON merge patch per shard they touch, each
carrying the resourceVersion it was based on. The API server applies it only to that version
(optimistic concurrency), so of two operator replicas writing at once one gets 409, rereads the
ledger and keeps only what does not clash. Idle, a claim costs one write as before; under load one
write carries many claims. Pods are not written at all: ``kubectl get cm -l
app.kubernetes.io/name=awm-ledger`` shows who holds what.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from awm_operator.crds import GROUP, VERSION
from awm_operator.kube import MERGE, ApiError, Kube
from awm_operator.metrics import Metrics
from awm_operator.pods import label_value
from awm_operator.shards import SHARD_BYTES, entry_size, place, shard_index, shard_name
from awm_operator.state import ClaimRecord, Fleet

log = logging.getLogger("awm.operator.ledger")

MAX_CONFLICT_RETRIES = 8
LABEL = "app.kubernetes.io/name=awm-ledger"
Changes = dict[str, ClaimRecord | None]  # claim id -> its new record, or None to remove it
Batch = list[tuple[Changes, asyncio.Future[None]]]


def ledger_name(fleet: str) -> str:
    """The first (often the only) shard: ``<fleet>-claims``."""
    return shard_name(fleet, 0)


class LostRace(RuntimeError):
    """Another operator replica bound one of the claim's instances first."""


@dataclass
class Shard:
    """One ConfigMap of the ledger as this replica last read or wrote it."""

    name: str
    version: str | None = None                         # None: it does not exist (yet)
    sizes: dict[str, int] = field(default_factory=dict)  # claim id -> bytes it takes here
    used: int = 0

    def put(self, claim_id: str, text: str | None) -> None:
        self.used -= self.sizes.pop(claim_id, 0)
        if text is not None:
            self.sizes[claim_id] = entry_size(claim_id, text)
            self.used += self.sizes[claim_id]


class Ledger:
    """The I/O side of a fleet's claims: the committed state itself lives on the ``Fleet``
    (``fleet.claims`` / ``fleet.owner``), updated only after the API server accepted a write."""

    def __init__(self, kube: Kube, fleet: Fleet, metrics: Metrics, shard_bytes: int = SHARD_BYTES) -> None:
        self.kube, self.fleet, self.metrics = kube, fleet, metrics
        self.shard_bytes = shard_bytes
        self.name = ledger_name(fleet.name)
        self.shards: list[Shard] = []
        self._queue: Batch = []
        self._writer: asyncio.Task[None] | None = None

    @property
    def base(self) -> str:
        return f"/api/v1/namespaces/{self.fleet.namespace}/configmaps"

    def _shard(self, index: int) -> Shard:
        while len(self.shards) <= index:
            self.shards.append(Shard(shard_name(self.fleet.name, len(self.shards))))
        return self.shards[index]

    async def load(self) -> None:
        """Read every shard (creating the first if there is none) into the fleet. A shard this
        replica held claims in that is gone (deleted by hand) is written back as it knew it."""
        fleet = self.fleet
        query = [("labelSelector", f"{LABEL},awm.dev/fleet={label_value(fleet.name)}")]
        found: dict[int, dict[str, Any]] = {}
        for obj in (await self.kube.request("GET", self.base, query=query)).get("items") or []:
            index = shard_index(fleet.name, obj["metadata"]["name"])
            if index is not None:
                found[index] = obj
        known = {i: s for i, s in enumerate(self.shards) if s.version is not None}
        for index in sorted({0, *known} - set(found)):
            held = known[index].sizes if index in known else {}
            found[index] = await self._create(index, {c: fleet.claims[c].dump() for c in held if c in fleet.claims})
        self.shards = []
        records: dict[str, ClaimRecord] = {}
        for index in sorted(found):
            obj, shard = found[index], self._shard(index)
            shard.version = obj["metadata"]["resourceVersion"]
            for claim_id, text in (obj.get("data") or {}).items():
                shard.put(claim_id, text)
                try:
                    records.setdefault(claim_id, ClaimRecord.parse(text))
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ledger %s/%s: ignoring unreadable claim %s: %s", fleet.namespace, shard.name,
                                claim_id, exc)
        self._observe()
        fleet.set_claims(records)

    async def _create(self, index: int, data: dict[str, str], adopt: bool = True) -> dict[str, Any]:
        """Create shard ``index`` holding ``data``. If it exists already (another replica made it
        just now, or a list did not show it yet): read it (``adopt``), else the 409 goes up as a
        conflict, so the batch is routed again on what the shard holds."""
        fleet = self.fleet
        name = shard_name(fleet.name, index)
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": fleet.namespace,
                             "labels": {"app.kubernetes.io/name": "awm-ledger",
                                        "awm.dev/fleet": label_value(fleet.name)},
                             "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "EnvFleet",
                                                  "name": fleet.name, "uid": fleet.uid, "controller": True}]},
                "data": data}
        try:
            return await self.kube.request("POST", self.base, body)
        except ApiError as exc:
            if exc.status != 409 or not adopt:
                raise
            return await self.kube.request("GET", f"{self.base}/{name}")

    async def commit(self, changes: Changes) -> None:
        """Durably apply ``changes``; returns once the API server has them (then the fleet does
        too). Raises ``LostRace`` if a new claim clashes with one another replica wrote."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((changes, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._flush(), name=f"awm ledger {self.fleet.name}")
        await future

    def _route(self, merged: Changes) -> dict[int, dict[str, str | None]]:
        """Each shard's part of the changes: a claim's change goes where the claim is (a copy left
        in a second shard by an interrupted write is removed there), a new claim to the first
        shard with room, counting what this batch frees and fills."""
        writes: dict[int, dict[str, str | None]] = {}
        used = [s.used for s in self.shards]
        new: list[tuple[str, str]] = []
        for claim_id, record in merged.items():
            holders = [i for i, s in enumerate(self.shards) if claim_id in s.sizes]
            text = None if record is None else record.dump()
            if text is not None and not holders:
                new.append((claim_id, text))
                continue
            for n, i in enumerate(holders):
                keep = text if n == 0 else None
                writes.setdefault(i, {})[claim_id] = keep
                used[i] += (0 if keep is None else entry_size(claim_id, keep)) - self.shards[i].sizes[claim_id]
        for claim_id, text in new:
            size = entry_size(claim_id, text)
            i = place(used, size, self.shard_bytes)
            if i == len(used):
                used.append(0)
            used[i] += size
            writes.setdefault(i, {})[claim_id] = text
        return writes

    async def _flush(self) -> None:
        conflicts = 0
        while self._queue:
            batch, self._queue = self._queue, []
            merged: Changes = {}
            for changes, _ in batch:
                merged.update(changes)
            writes = self._route(merged)
            try:
                results = await asyncio.gather(*(self._write(i, data) for i, data in writes.items()),
                                               return_exceptions=True)
            except asyncio.CancelledError as exc:  # the operator stopping: tell the callers
                _fail(batch, exc)
                raise
            failed: dict[str, BaseException] = {}   # claim id -> why its shard's write failed
            for data, result in zip(writes.values(), results):
                if isinstance(result, BaseException):
                    failed.update(dict.fromkeys(data, result))
            for claim_id, record in merged.items():
                if claim_id in failed:
                    continue
                if record is None:
                    self.fleet.unassign(claim_id)
                else:
                    self.fleet.assign(claim_id, record)
            self._observe()
            unsettled: Batch = []
            for changes, future in batch:
                if any(claim_id in failed for claim_id in changes):
                    unsettled.append((changes, future))
                elif not future.done():
                    future.set_result(None)
            if not failed:
                conflicts = 0
                self.metrics.ledger_batch.observe(len(batch))
                continue
            errors = list(failed.values())
            other = [e for e in errors if not (isinstance(e, ApiError) and e.status in (404, 409))]
            if other or conflicts >= MAX_CONFLICT_RETRIES:
                _fail(unsettled, other[0] if other else errors[0])
                continue
            conflicts += 1
            try:
                await self.load()
            except Exception as load_error:  # noqa: BLE001 - fail the batch with it
                _fail(unsettled, load_error)
                continue
            self._queue[:0] = self._keep_unclashing(unsettled)

    async def _write(self, index: int, data: dict[str, str | None]) -> None:
        """One shard's part of a batch: a merge patch on the version we know, or its creation."""
        shard, fleet = self._shard(index), self.fleet
        try:
            if shard.version is None:
                obj = await self._create(index, {k: v for k, v in data.items() if v is not None}, adopt=False)
            else:
                body = {"metadata": {"resourceVersion": shard.version}, "data": data}
                obj = await self.kube.request("PATCH", f"{self.base}/{shard.name}", body, MERGE)
        except ApiError as exc:
            result = "conflict" if exc.status in (404, 409) else "error"
            self.metrics.ledger_writes.labels(fleet.namespace, fleet.name, result).inc()
            raise
        shard.version = obj["metadata"]["resourceVersion"]
        for claim_id, text in data.items():
            shard.put(claim_id, text)
        self.metrics.ledger_writes.labels(fleet.namespace, fleet.name, "ok").inc()

    def _observe(self) -> None:
        fleet = self.fleet
        self.metrics.ledger_bytes.labels(fleet.namespace, fleet.name).set(sum(s.used for s in self.shards))
        self.metrics.ledger_shards.labels(fleet.namespace, fleet.name).set(
            sum(1 for s in self.shards if s.version is not None))

    def _keep_unclashing(self, batch: Batch) -> Batch:
        """After a reread: a claim whose pods another writer took loses, and so does a claim that
        another writer bound to other pods under the same id (two replicas acting on one EnvClaim:
        kopf's peering lets two act at once for a while, e.g. when both start together, so a
        rewrite here would silently move the claim to pods its EnvClaim's status does not name).
        The rest go again."""
        keep = []
        for changes, future in batch:
            clash = [n for cid, r in changes.items() if r is not None
                     for n in r.pods if self.fleet.owner.get(n, cid) != cid]
            rebound = [cid for cid, r in changes.items() if r is not None
                       and cid in self.fleet.claims and self.fleet.claims[cid].groups != r.groups]
            if clash or rebound:
                what = f"instances {clash[:3]}" if clash else f"claim {rebound[0]}, to other instances,"
                future.set_exception(LostRace(f"{what} taken by another operator replica"))
            else:
                keep.append((changes, future))
        return keep


def _fail(batch: Batch, exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
