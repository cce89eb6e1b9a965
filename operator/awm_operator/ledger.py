"""Each fleet's allocation ledger: which claim holds which instances, in one ConfigMap.

Why one object per fleet and not a label on each pod: a binding must be durable (an operator
restart, or a standby taking over, must not hand an allocated instance out again) and atomic (all
of a claim's instances or none). Marking pods costs the API server about 15 ms of CPU per pod
write (decoding, validation, etcd, and the fan-out to the scheduler, the kubelets and every pod
watcher): one write per claimed instance and one more per released one held 2 cores to about 25
claim-and-release cycles per second, and an 8 x 8 GRPO claim took 64 writes.

The ledger is the ConfigMap ``<fleet>-claims`` (owned by the EnvFleet, so it goes with it): one key
per claim, whose value lists the claim's GRPO groups of pod names. It is written by *group commit*:
changes that arrive while a write is in flight go together in the next one, a JSON merge patch
carrying the resourceVersion it was based on. The API server applies it only to that version
(optimistic concurrency), so of two operator replicas writing at once one gets 409, rereads the
ledger and keeps only what does not clash. Idle, a claim costs one write as before; under load one
write carries many claims. Pods are not written at all: ``kubectl get cm <fleet>-claims -o yaml``
shows who holds what.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from awm_operator.crds import GROUP, VERSION
from awm_operator.kube import MERGE, ApiError, Kube
from awm_operator.metrics import Metrics
from awm_operator.state import ClaimRecord, Fleet

log = logging.getLogger("awm.operator.ledger")

MAX_CONFLICT_RETRIES = 8
Changes = dict[str, ClaimRecord | None]  # claim id -> its new record, or None to remove it


class LostRace(RuntimeError):
    """Another operator replica bound one of the claim's instances first."""


def ledger_name(fleet: str) -> str:
    """``<fleet>-claims``; a fleet name near the 253-character limit gets a hashed tail."""
    name = f"{fleet}-claims"
    if len(name) <= 253:
        return name
    return f"{fleet[:230]}-{hashlib.sha256(fleet.encode()).hexdigest()[:8]}-claims"


class Ledger:
    """The I/O side of a fleet's claims: the committed state itself lives on the ``Fleet``
    (``fleet.claims`` / ``fleet.owner``), updated only after the API server accepted a write."""

    def __init__(self, kube: Kube, fleet: Fleet, metrics: Metrics) -> None:
        self.kube, self.fleet, self.metrics = kube, fleet, metrics
        self.name = ledger_name(fleet.name)
        self.version: str | None = None
        self._queue: list[tuple[Changes, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.fleet.namespace}/configmaps/{self.name}"

    async def load(self) -> None:
        """Read the ledger (creating it if there is none) into the fleet."""
        try:
            obj = await self.kube.request("GET", self.path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            obj = await self._create()
        records: dict[str, ClaimRecord] = {}
        for claim_id, text in (obj.get("data") or {}).items():
            try:
                records[claim_id] = ClaimRecord.parse(text)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ledger %s/%s: ignoring unreadable claim %s: %s", self.fleet.namespace, self.name,
                            claim_id, exc)
        self.version = obj["metadata"]["resourceVersion"]
        self.fleet.set_claims(records)

    async def _create(self) -> dict[str, Any]:
        """An empty ledger, or, if it vanished while we held claims, the claims we know of."""
        fleet = self.fleet
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": self.name, "namespace": fleet.namespace,
                             "labels": {"app.kubernetes.io/name": "awm-ledger", "awm.dev/fleet": fleet.name[:63]},
                             "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "EnvFleet",
                                                  "name": fleet.name, "uid": fleet.uid, "controller": True}]},
                "data": {cid: r.dump() for cid, r in fleet.claims.items()}}
        try:
            return await self.kube.request("POST", f"/api/v1/namespaces/{fleet.namespace}/configmaps", body)
        except ApiError as exc:
            if exc.status != 409:  # 409: another replica created it just now
                raise
            return await self.kube.request("GET", self.path)

    async def commit(self, changes: Changes) -> None:
        """Durably apply ``changes``; returns once the API server has them (then the fleet does
        too). Raises ``LostRace`` if a new claim clashes with one another replica wrote."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((changes, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._flush(), name=f"awm ledger {self.fleet.name}")
        await future

    async def _flush(self) -> None:
        conflicts = 0
        while self._queue:
            batch, self._queue = self._queue, []
            merged: Changes = {}
            for changes, _ in batch:
                merged.update(changes)
            try:
                await self._write(merged)
            except ApiError as exc:
                if exc.status in (404, 409) and conflicts < MAX_CONFLICT_RETRIES:
                    conflicts += 1
                    self.metrics.ledger_writes.labels(self.fleet.namespace, self.fleet.name, "conflict").inc()
                    try:
                        await self.load()
                    except Exception as load_error:  # noqa: BLE001 - fail the batch with it
                        _fail(batch, load_error)
                        continue
                    self._queue[:0] = self._keep_unclashing(batch)
                    continue
                self.metrics.ledger_writes.labels(self.fleet.namespace, self.fleet.name, "error").inc()
                _fail(batch, exc)
                continue
            except BaseException as exc:  # noqa: BLE001 - cancelled or a network error: tell the callers
                _fail(batch, exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            conflicts = 0
            self.metrics.ledger_writes.labels(self.fleet.namespace, self.fleet.name, "ok").inc()
            self.metrics.ledger_batch.observe(len(batch))
            for claim_id, record in merged.items():
                if record is None:
                    self.fleet.unassign(claim_id)
                else:
                    self.fleet.assign(claim_id, record)
            for _, future in batch:
                if not future.done():
                    future.set_result(None)

    async def _write(self, changes: Changes) -> None:
        body = {"metadata": {"resourceVersion": self.version},
                "data": {cid: (None if r is None else r.dump()) for cid, r in changes.items()}}
        obj = await self.kube.request("PATCH", self.path, body, MERGE)
        self.version = obj["metadata"]["resourceVersion"]

    def _keep_unclashing(self, batch: list[tuple[Changes, asyncio.Future[None]]]) -> list[tuple[Changes, asyncio.Future[None]]]:
        """After a reread: new claims whose pods another writer took lose; the rest go again."""
        keep = []
        for changes, future in batch:
            clash = [n for cid, r in changes.items() if r is not None
                     for n in r.pods if self.fleet.owner.get(n, cid) != cid]
            if clash:
                future.set_exception(LostRace(f"instances taken by another operator replica: {clash[:3]}"))
            else:
                keep.append((changes, future))
        return keep


def _fail(batch: list[tuple[Changes, asyncio.Future[None]]], exc: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(exc)
