"""The operator's client for its pods' control API: POST /bind, /reset and /prepare, fanned out.

Why not aiohttp's client here: the operator switches and resets pods in bursts (a GRPO step of
64 groups x 16 sends 1,024 ``/bind`` requests at once, and its release 1,024 ``/reset``), all on
the one event loop that also answers the allocation API. aiohttp's client costs about 115 us of
CPU per request there (on uvloop: its session, timer, tracing, cookie, URL and response layers),
this one about 45 us, so a step's 1,024 binds take ~45 ms of the loop instead of ~120 ms
(bench/podhttp.py; docs/benchmarks.md).

It speaks only what the env server's control API needs: an HTTP/1.1 POST of a JSON body, a JSON
answer, keep-alive connections per pod address. The answer is parsed by httptools (llhttp, the
parser uvicorn and aiohttp are built on), so content-length and chunked bodies and malformed
answers are the parser's business; what is here is the connection pool, a deadline per request,
a cap on an answer's size and one retry when a kept-alive connection turns out to have been
closed by the pod before it read the request. Connections are kept for minutes (the env server's
control listener keeps them 300 s): a pod's connection from its release serves its next claim,
and the reconciler opens one to each free pod ahead of its first claim (``open``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import httptools

MAX_ANSWER_BYTES = 1 << 20  # a control answer is a few hundred bytes; more is a broken pod
# Idle connections are kept this long: under the env server's control keep-alive (300 s,
# awm.envserver.listener.CONTROL_KEEP_ALIVE_S), so that a pod's connection from a group's release
# (its /reset) is there for its next claim (/bind) a training step later. An older pod closes
# after 5 s: the connection is then seen closed, or sent on once and replaced (below).
IDLE_SECONDS = 240.0
# A pod that vanished (its node gone) sends no FIN or RST: keep-alive probes find it while the
# connection is idle, and TCP_USER_TIMEOUT ends a request whose bytes it never acknowledges.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 30, 10, 3
USER_TIMEOUT_MS = 20_000
SWEEP_SECONDS = 30.0  # how often idle connections that closed or aged are let go
MAX_IN_FLIGHT = 1024  # requests at once (a step of 64 x 16 waits for none): bounds the sockets


class PodHttpError(Exception):
    """No usable answer: the pod refused the connection, closed it, timed out or answered
    something that is not HTTP."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The answer's JSON (ValueError when it is none)."""
        return json.loads(self.body)

    def text(self, limit: int = 300) -> str:
        return self.body[:limit].decode("utf-8", "replace")


@dataclass(frozen=True)
class _Target:
    key: tuple[str, int, bool]  # host, port, TLS: the pool's key
    host_header: bytes
    path: bytes


@lru_cache(maxsize=16384)
def _target(url: str) -> _Target:
    try:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("no http(s) scheme or no host")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)  # (a port that is not a number: ValueError)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return _Target((parts.hostname, port, tls), parts.netloc.encode("idna"), path.encode("ascii"))
    except (ValueError, UnicodeError) as exc:  # a pod's annotation is not trusted to be well-formed
        raise PodHttpError(f"not an http(s) URL: {url!r} ({exc})") from None


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, each answer read by a fresh parser."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.parser: httptools.HttpResponseParser | None = None
        self.body: list[bytes] = []
        self.size = 0
        self.got_bytes = False  # of the current request's answer
        self.keep_alive = False
        self.closed = False
        self.idle_since = 0.0
        self.timer: asyncio.TimerHandle | None = None  # the current request's deadline

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # best effort: not every kernel has every option
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)

    def data_received(self, data: bytes) -> None:
        if self.parser is None:  # bytes nobody asked for: the connection is not ours to trust
            self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(PodHttpError(f"malformed answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            why = "closed the connection before answering" if not self.got_bytes else "closed the connection mid-answer"
            self._fail(_Closed(why, self.got_bytes) if exc is None else _Closed(f"{why}: {exc}", self.got_bytes))

    # -- httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size > MAX_ANSWER_BYTES:
            self._fail(PodHttpError(f"answer larger than {MAX_ANSWER_BYTES} bytes"))
            self.close()
            return
        self.body.append(body)

    def on_message_complete(self) -> None:
        parser, self.parser = self.parser, None
        if parser is None:  # a second answer in the same bytes: nobody asked for it
            self.close()
            return
        self.keep_alive = parser.should_keep_alive()
        self._stop_timer()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(Answer(parser.get_status_code(), b"".join(self.body)))

    # -- ours
    def send(self, request: bytes, deadline: float, timeout: float) -> asyncio.Future[Answer]:
        """Write ``request``; the future is the answer, or PodHttpError once ``deadline`` (the
        loop's clock) passes. A timer handle, not ``asyncio.timeout``: that costs more CPU than
        the rest of a request here."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.body, self.size, self.got_bytes, self.keep_alive = [], 0, False, False
        self.timer = loop.call_at(deadline, self._expire, timeout)
        self.transport.write(request)
        return self.waiter

    def _expire(self, timeout: float) -> None:
        self.timer = None
        self._fail(PodHttpError(f"no answer within {timeout:g} s"))
        self.close()  # an answer may still come: not on this connection

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def reusable(self, now: float) -> bool:
        return (not self.closed and self.keep_alive and self.parser is None and self.transport is not None
                and not self.transport.is_closing() and now - self.idle_since < IDLE_SECONDS)

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def _fail(self, exc: BaseException) -> None:
        self._stop_timer()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.parser = None


class _Closed(PodHttpError):
    def __init__(self, why: str, got_bytes: bool) -> None:
        super().__init__(why)
        self.got_bytes = got_bytes


class PodHttp:
    """Keep-alive connections to the pods, keyed by address. One per event loop (the allocator's).

        answer = await http.post_json("http://10.244.0.7:8081/bind", {"env": "crm"}, timeout=300)
        if answer.status == 200: answer.json()
    """

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self._idle: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._gate = asyncio.Semaphore(max_in_flight)
        self._tls: ssl.SSLContext | None = None
        self._closed = False
        self._swept = time.monotonic()

    async def post_json(self, url: str, payload: Any, timeout: float) -> Answer:
        """POST ``payload`` as JSON; the pod's answer, whatever its status. Raises PodHttpError
        when there is none (also for a URL that is not http(s))."""
        target = _target(url)
        body = json.dumps(payload).encode()  # (no keyword arguments: json's cached encoder)
        request = b"".join((b"POST ", target.path, b" HTTP/1.1\r\nHost: ", target.host_header,
                            b"\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: ",
                            str(len(body)).encode(), b"\r\n\r\n", body))
        return await self._request(target, request, timeout)

    async def open(self, url: str, timeout: float) -> bool:
        """One more kept connection to the address of ``url``, opened ahead of need: a GET of
        ``url`` on a new connection, which the pod answers (whatever the status) and then keeps
        idle for the next request (a connection that never sent one would meet the env
        server's head deadline). True if it was kept, False if the pod closed it after
        answering; PodHttpError when there was no answer."""
        target = _target(url)
        request = b"".join((b"GET ", target.path, b" HTTP/1.1\r\nHost: ", target.host_header,
                            b"\r\nAccept: application/json\r\n\r\n"))
        async with self._gate:
            deadline = asyncio.get_running_loop().time() + timeout
            conn = await self._connect(target.key, deadline, timeout)
            await self._round_trip(target.key, conn, request, deadline, timeout)
            return not conn.closed

    def idle_count(self, url: str) -> int:
        """Kept connections to the address of ``url`` that wait for a request (one pod's
        address, or one shared by many pods, as a benchmark's stub is)."""
        now = time.monotonic()
        return sum(conn.reusable(now) for conn in self._idle.get(_target(url).key, ()))

    async def _request(self, target: _Target, request: bytes, timeout: float) -> Answer:
        async with self._gate:  # the deadline runs from here: a request waits for the gate only
            deadline = asyncio.get_running_loop().time() + timeout  # behind others that have theirs
            conn = self._take_idle(target.key)
            if conn is not None:
                try:
                    return await self._round_trip(target.key, conn, request, deadline, timeout)
                except _Closed as exc:
                    if exc.got_bytes:
                        raise
                    # closed while idle, before the pod read the request: once more, on a new connection
            conn = await self._connect(target.key, deadline, timeout)
            return await self._round_trip(target.key, conn, request, deadline, timeout)

    async def _round_trip(self, key: tuple[str, int, bool], conn: _Connection, request: bytes,
                          deadline: float, timeout: float) -> Answer:
        try:
            answer = await conn.send(request, deadline, timeout)
        except BaseException:
            conn.close()  # its state is unknown (a timeout, a cancel, half an answer)
            raise
        if conn.keep_alive and not self._closed:
            conn.idle_since = now = time.monotonic()
            self._idle.setdefault(key, deque()).append(conn)
            if now - self._swept > SWEEP_SECONDS:
                self._sweep(now)
        else:
            conn.close()
        return answer

    def _sweep(self, now: float) -> None:
        """Close idle connections too old to reuse, and forget addresses left with none (pods
        come and go: the pool must not keep every address it ever spoke to)."""
        self._swept = now
        for key in list(self._idle):
            keep: deque[_Connection] = deque()
            for conn in self._idle[key]:
                if conn.reusable(now):
                    keep.append(conn)
                else:
                    conn.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    def _take_idle(self, key: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been closed
            if conn.reusable(now):
                return conn
            conn.close()
        if idle is not None:
            del self._idle[key]
        return None

    async def _connect(self, key: tuple[str, int, bool], deadline: float, timeout: float) -> _Connection:
        host, port, tls = key
        if tls and self._tls is None:
            self._tls = ssl.create_default_context()
        try:
            async with asyncio.timeout_at(deadline):  # a pod IP that is gone: no answer to a SYN
                _, conn = await asyncio.get_running_loop().create_connection(
                    _Connection, host, port, ssl=self._tls if tls else None)
        except TimeoutError:
            raise PodHttpError(f"no answer within {timeout:g} s (connecting to {host}:{port})") from None
        except OSError as exc:
            raise PodHttpError(f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
