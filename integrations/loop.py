"""One event loop on a daemon thread, for frameworks that call the environment synchronously.

TRL calls ``rollout_func`` and SkyRL calls ``BaseTextEnv.step`` from plain (possibly many)
threads, while awm's clients, instance pools and local fleet are asyncio objects bound to the
loop they were made on. Everything of an integration therefore lives on this one loop, and
synchronous callers submit coroutines to it and wait for the result.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")


class BackgroundLoop:
    def __init__(self, name: str = "awm-integration") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and return its result (from any thread but the loop's own)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("BackgroundLoop.run called from its own loop: await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


_shared: BackgroundLoop | None = None
_lock = threading.Lock()


def shared_loop() -> BackgroundLoop:
    """The process's loop for integrations (made on first use)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = BackgroundLoop()
        return _shared
