"""Which environments a fleet runs: its list, or what its selector chooses from the catalog's index.

A fleet names its environments, or selects them from its catalog's index (``environmentSelector``).
Reading the index is a request to the catalog server (or a ConfigMap read), which can be slow or
fail; the fleet's reconcile pass must not wait for it. So this job of the reconciler reads it in
a background task and keeps what the read found on the fleet (``Fleet.selected``): re-read every
few minutes, at once when the selector or the catalog changes, retried sooner after a failure
(which the fleet's status reports: :attr:`EnvironmentSelection.error`).
"""

from __future__ import annotations

import asyncio
import logging

from awm_operator.allocator import Allocator
from awm_operator.catalog_index import REFRESH_S, RETRY_S, read_index
from awm_operator.crds import CatalogSource, EnvironmentSelector
from awm_operator.kube import Kube
from awm_operator.state import Fleet

log = logging.getLogger("awm.operator.reconcile")  # one of the fleet reconciler's jobs: its log


class EnvironmentSelection:
    """The fleet's selector, resolved against its catalog's index in the background."""

    def __init__(self, fleet: Fleet, kube: Kube, allocator: Allocator) -> None:
        self.fleet, self.kube, self.allocator = fleet, kube, allocator  # the allocator's HTTP session reads a URL
        self.last_read: tuple[str, float] = ("", 0.0)  # (selector and catalog, when) the index was last read
        self.error: str | None = None  # the last read failed: said in the fleet's status
        self.task: asyncio.Task[None] | None = None  # a catalog index read in flight

    async def environments(self, now: float) -> list[str] | None:
        """The fleet's environments: its list, or what its selector last chose from the catalog's
        index; None while a selector's index was never read (no pod is created or deleted for it).
        The index is read in the background (re-read every few minutes and when the selector or
        the catalog changes), so a slow catalog server never stalls the fleet's reconcile pass."""
        fleet, spec = self.fleet, self.fleet.spec
        assert spec is not None
        selector = spec.environment_selector
        if selector is None:
            if self.task is not None:
                self.task.cancel()
            self.task, self.last_read, self.error, fleet.selected = None, ("", 0.0), None, None
            return spec.environments
        key = selector.model_dump_json() + spec.catalog.model_dump_json()  # not the generation: replicas change it
        last_key, at = self.last_read
        if key != last_key:
            # a new selector or catalog: the old choice (or error) is not its answer, nor is a read
            # still in flight for the old one
            fleet.selected, self.error = None, None
            if self.task is not None:
                self.task.cancel()
                self.task = None
        due = key != last_key or now - at >= (REFRESH_S if self.error is None else RETRY_S)
        if due and self.task is None:
            self.last_read = (key, now)
            self.task = asyncio.create_task(self._resolve(key, selector, spec.catalog))
        return fleet.selected

    async def _resolve(self, key: str, selector: EnvironmentSelector, catalog: CatalogSource) -> None:
        """Resolve the selector against the catalog's index; the outcome lands on the fleet (a
        failed read keeps the last choice and is retried) and wakes its reconciler."""
        fleet = self.fleet
        loop = asyncio.get_running_loop()
        try:
            names = await read_index(self.kube, self.allocator.http, fleet.namespace, catalog)
            chosen = selector.select(names)
            if not chosen:
                raise ValueError(f"the selector matches none of the catalog's {len(names)} environments")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the fleet, retried
            if self.last_read[0] == key:
                self.error = f"catalog index: {exc}"
                log.warning("fleet %s/%s: %s", fleet.namespace, fleet.name, self.error)
                loop.call_later(RETRY_S + 0.01, fleet.poke)
        else:
            if self.last_read[0] == key:  # the selector did not change while we read
                if chosen != fleet.selected:
                    log.info("fleet %s/%s: the selector chose %d environments", fleet.namespace, fleet.name,
                             len(chosen))
                self.error, fleet.selected = None, chosen
                loop.call_later(REFRESH_S + 0.01, fleet.poke)
        finally:
            if self.task is asyncio.current_task():
                self.task = None
            fleet.poke()

    def cancel(self) -> None:
        """Stop a read in flight (the fleet's daemon ends)."""
        if self.task is not None:
            self.task.cancel()
