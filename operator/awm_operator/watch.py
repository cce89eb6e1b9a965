"""The env pods' list+watch, feeding each fleet's in-memory pool (an informer, minus the caching
library).

Why not a kopf handler: kopf deep-copies every event's body to compute a diff, for every
handler kind, and filters labels on the client side. A fleet of 1,024 pods produces ~5 events
per pod while it comes up; on 2 cores that copying was the operator's largest CPU cost (measured
with py-spy: ~16 % of all samples, more than the JSON decoding). Pods need none of kopf's
machinery (no finalizers, no progress, no retries), so this watch asks the API server for env
pods only (server-side label selector) and hands each event to the fleet that owns the pod.

It runs in every replica, paused or not, so a standby has a warm pool when it takes over.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from awm_operator.kube import LIST_PAGE, ApiError, Kube
from awm_operator.pods import APP_NAME, L_NAME, PodInfo
from awm_operator.state import Fleets

log = logging.getLogger("awm.operator.watch")

SELECTOR = f"{L_NAME}={APP_NAME}"
WATCH_S = 300  # the API server ends each watch after this long; it is then resumed
# A watch the API server keeps open sends a bookmark about every minute (allowWatchBookmarks; the
# watch cache's defaultBookmarkFrequency), so a stream silent for this long is dead: its peer went
# away without closing it (a node, a route, a conntrack entry lost). Relisting then, instead of at
# the request's end (330 s), bounds how long the pools miss pod events (pods Ready that no claim
# sees). Without a watch cache (no bookmarks) an idle watch is relisted this often: one list.
SILENCE_S = 150.0


def owner_fleet(pod: dict[str, Any]) -> str | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "EnvFleet":
            return str(ref.get("name"))
    return None


def apply_event(fleets: Fleets, kind: str, pod: dict[str, Any]) -> None:
    meta = pod.get("metadata") or {}
    fleet_name = owner_fleet(pod)
    if fleet_name is None:
        return
    fleet = fleets.ensure(meta.get("namespace", ""), fleet_name)
    if kind == "DELETED":
        fleet.remove_pod(meta["name"])
    else:
        fleet.update_pod(PodInfo.from_pod(pod))


class PodWatcher:
    def __init__(self, kube: Kube, fleets: Fleets, namespace: str | None, page: int = LIST_PAGE,
                 silence_s: float = SILENCE_S) -> None:
        self.kube, self.fleets, self.namespace, self.page = kube, fleets, namespace, page
        self.silence_s = silence_s
        self.synced = asyncio.Event()  # the first list has been applied

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods" if self.namespace else "/api/v1/pods"

    async def run(self) -> None:
        """List, then watch from the list's resourceVersion; relist when the watch expires."""
        while True:
            try:
                version = await self._list()
                while version:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the API server restarting, a network blip
                log.warning("pod watch (%s) failed: %s; relisting", self.namespace or "all namespaces", exc)
                await asyncio.sleep(1.0)

    async def _list(self) -> str:
        """List in pages (``Kube.list_pages``), applying each page as it comes."""
        seen: dict[tuple[str, str], set[str]] = {}
        version = ""
        async for page in self.kube.list_pages(self.path, [("labelSelector", SELECTOR)], self.page, timeout=120):
            version = version or str(page["metadata"]["resourceVersion"])
            for pod in page.get("items") or []:
                apply_event(self.fleets, "ADDED", pod)
                meta = pod["metadata"]
                seen.setdefault((meta.get("namespace", ""), owner_fleet(pod) or ""), set()).add(meta["name"])
        for fleet in self.fleets:  # pods deleted while we were not watching
            if self.namespace and fleet.namespace != self.namespace:
                continue
            for name in set(fleet.pods) - seen.get((fleet.namespace, fleet.name), set()):
                fleet.remove_pod(name)
        self.synced.set()
        return version

    async def _watch(self, version: str) -> str | None:
        """Stream events; return the version to resume from, or None to relist (410 Gone)."""
        query = [("labelSelector", SELECTOR), ("watch", "true"), ("resourceVersion", version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(WATCH_S))]
        timeout = aiohttp.ClientTimeout(total=WATCH_S + 30, sock_connect=30, sock_read=self.silence_s)
        response = await self.kube.api.call_api(
            self.path, "GET", query_params=query, header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"], _preload_content=False, _request_timeout=timeout)
        try:
            if response.status != 200:
                raise ApiError(response.status, (await response.read()).decode(errors="replace"))
            async for line in response.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        return None
                    raise ApiError(int(obj.get("code") or 500), json.dumps(obj))
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    apply_event(self.fleets, kind, obj)
        finally:
            response.release()
        return version
