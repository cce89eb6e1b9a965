"""Opening the operator's connections to a fleet's free pods before their claims need them.

A claim's first ``/bind`` (or a release's ``/reset``) to a pod would otherwise connect first, and
a GRPO step's 1,024 connects cost the operator's event loop about as much again as the binds
(docs/benchmarks.md): the first step of a fleet paid it. So each reconcile pass starts, in the
background, a task that opens a connection to every free ready pod that has none kept. Once
open, a connection is kept for the pod's next request (``podhttp.IDLE_SECONDS``); one that aged
out unused is opened again on a later pass. This job of the reconciler owns that task and its
back-off.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from awm_operator.allocator import Allocator
from awm_operator.podhttp import PodHttpError
from awm_operator.state import Fleet

CONNECT_AHEAD_CONCURRENCY = 32  # connections to free pods opened at once, in the background
CONNECT_AHEAD_TIMEOUT_S = 5.0
CONNECT_AHEAD_BACKOFF_S = 10.0  # after a round where a pod refused or closed what it answered on
CONNECT_AHEAD_ROUNDS = 64  # rounds per task at most (each takes in the pods freed meanwhile)


class ConnectAhead:
    """The fleet's free pods, connected to ahead of their claims (through ``allocator.pods``)."""

    def __init__(self, fleet: Fleet, allocator: Allocator) -> None:
        self.fleet, self.allocator = fleet, allocator
        self.task: asyncio.Task[None] | None = None  # connections to free pods being opened ahead
        self.quiet_until = float("-inf")  # after a round a pod refused or did not keep: none till then

    def start(self) -> None:
        """In the background, open the operator's connection to every free ready pod that has
        none kept (unless a round is running, or backing off)."""
        if (self.task is None or self.task.done()) and time.monotonic() >= self.quiet_until:
            if self._to_connect():
                self.task = asyncio.create_task(
                    self._connect(), name=f"awm connect {self.fleet.namespace}/{self.fleet.name}")

    def _to_connect(self) -> list[str]:
        """One URL per connection to open: free pods' addresses, less the connections kept idle
        there (an address shared by many pods, as a benchmark's stub is, takes one per pod)."""
        http, fleet = self.allocator.pods, self.fleet
        wanted: Counter[str] = Counter()
        for names in list(fleet.available.values()):
            for name in names:
                info = fleet.pods.get(name)
                if info is not None and info.control_url:
                    wanted[info.control_url.rstrip("/") + "/healthz"] += 1
        urls: list[str] = []
        for url, n in wanted.items():
            try:
                urls += [url] * (n - http.idle_count(url))
            except PodHttpError:  # a pod's annotation that is no URL: its claims will say so
                continue
        return urls

    async def _connect(self) -> None:
        http, sem = self.allocator.pods, asyncio.Semaphore(CONNECT_AHEAD_CONCURRENCY)

        async def one(url: str) -> bool:
            async with sem:
                try:
                    return await http.open(url, CONNECT_AHEAD_TIMEOUT_S)
                except PodHttpError:  # not answering yet, or gone: a later round tries again
                    return False

        for _ in range(CONNECT_AHEAD_ROUNDS):  # each round: the free pods without one, then those freed meanwhile
            urls = self._to_connect()
            if not urls:
                return
            if not all(await asyncio.gather(*(one(url) for url in urls))):
                # A pod refused, timed out or closed the connection it answered on: no round
                # again for a while, or such pods would cost a round every pass (0.2 s apart).
                self.quiet_until = time.monotonic() + CONNECT_AHEAD_BACKOFF_S
                return

    def cancel(self) -> None:
        """Stop a round in flight (the fleet's daemon ends)."""
        if self.task is not None:
            self.task.cancel()
