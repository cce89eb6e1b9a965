"""uvicorn's HTTP/1.1 protocols with a deadline on a request's head.

uvicorn closes a keep-alive connection that stays idle, but the first byte of a request cancels
that timer and nothing else bounds the wait for the rest of the head: a client that sends a
partial request line or trickles header bytes holds its connection (and a file descriptor of the
env server) forever. Here every request head must be complete within ``HEAD_TIMEOUT_S``, however
the bytes arrive, or the connection is closed: the first head on a connection counts from the
connection's start (uvicorn has no timer there), each later one from its first byte. The idle
wait between a response and the next request's first byte is the listener's keep-alive
(``timeout_keep_alive``: 5 s on the MCP listener, ``CONTROL_KEEP_ALIVE_S`` on the control
listener), not this deadline, which would otherwise cut every kept connection at 10 s. Part of a
head sent while the previous response was still going out waits like an idle connection, under
the keep-alive, and gets the deadline with its next byte: at most the keep-alive plus the
deadline, about what an idle client may hold anyway. Bodies are bounded in size by the apps
(control: 1 MiB, MCP: its body cap) and in time by the caller's own deadline.
"""

from __future__ import annotations

import asyncio
from typing import Any

from awm import settings

HEAD_TIMEOUT_S = settings.AWM_HEAD_TIMEOUT_S  # read once, when the server starts
# How long the control listener keeps an idle connection (uvicorn's default is 5 s). The operator
# switches and resets its pods in bursts a GRPO step apart (seconds to minutes): a connection kept
# from a group's release to its next claim spares the operator a TCP connect per pod, which cost
# its event loop about as much as the request itself (1,024 connects per step; docs/benchmarks.md).
# Only the operator and the trainer reach the control API (never the agent), and a connection
# that starts a request still has the head deadline above.
CONTROL_KEEP_ALIVE_S = 300


class _HeadDeadline:
    """Mixin over a uvicorn HTTP protocol (which sets ``self.cycle`` once a request's head is
    parsed, and calls ``on_response_complete`` when the server waits for the next one)."""

    head_timeout_s = HEAD_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None
    _idle = False  # a response went out and the next head has not started: the keep-alive's wait

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        loop = asyncio.get_running_loop()
        self._head_timer = loop.call_later(self.head_timeout_s, self._head_overdue)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_overdue(self) -> None:
        self._head_timer = None
        transport = getattr(self, "transport", None)
        if transport is not None and not transport.is_closing():
            transport.close()

    def _head_arrived(self) -> bool:
        """The request (its head *and* its body) has arrived: a head alone is not enough, or a
        client that vanishes mid-body holds the connection (a descriptor and a coroutine) for
        ever, the app waiting for a body that never comes (found by bench/soak.py)."""
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        if self._idle:  # the next request's first bytes: its head's deadline starts now
            self._idle = False
            self._arm_head_deadline()
        super().data_received(data)  # type: ignore[misc]
        if self._head_timer is not None and self._head_arrived():
            self._disarm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        # Unless a pipelined request has started already, the connection is idle: uvicorn's
        # keep-alive timer (armed just now) bounds that wait, and a later byte starts the deadline.
        self._idle = not self._head_arrived()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)  # type: ignore[misc]


def protocol(http: str) -> type[asyncio.Protocol]:
    """The protocol class for uvicorn's ``http`` setting (auto: httptools when installed).

    Only the chosen implementation is imported: h11 costs an env server ~2 MB of its own memory
    that a server on httptools never uses (one of 16+ instances per node)."""
    if http in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:
            if http == "httptools":
                raise SystemExit("envserver: --http httptools: httptools is not installed") from None
        else:
            return type("HttpToolsHeadDeadline", (_HeadDeadline, HttpToolsProtocol), {})
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return type("H11HeadDeadline", (_HeadDeadline, H11Protocol), {})
