"""The operator's client for the pods' control API (operator/awm_operator/podhttp.py), against
real servers: uvicorn (what the env server runs) and raw sockets that misbehave on purpose."""

from __future__ import annotations

import asyncio
import json
import socket
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from awm_operator import podhttp
from awm_operator.podhttp import PodHttp, PodHttpError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def uvicorn_server(**config: object) -> AsyncIterator[tuple[str, list[str]]]:
    """A Starlette app on uvicorn (the env server's stack): /bind echoes, /chunked streams, and
    every connection a request arrived on is recorded."""
    peers: list[str] = []

    async def bind(request: Request) -> JSONResponse:
        peers.append(f"{request.client.host}:{request.client.port}")  # type: ignore[union-attr]
        body = await request.json()
        return JSONResponse({"env": body.get("env"), "host": request.headers["host"],
                             "type": request.headers["content-type"]})

    async def chunked(_: Request) -> StreamingResponse:
        async def parts() -> AsyncIterator[bytes]:
            for part in (b'{"env": ', b'"crm", ', b'"n": 3}'):
                yield part
        return StreamingResponse(parts(), media_type="application/json")

    async def refuse(_: Request) -> JSONResponse:
        return JSONResponse({"detail": "unknown environment"}, status_code=404)

    async def healthz(request: Request) -> JSONResponse:
        peers.append(f"{request.client.host}:{request.client.port}")  # type: ignore[union-attr]
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/bind", bind, methods=["POST"]), Route("/chunked", chunked, methods=["POST"]),
                            Route("/refuse", refuse, methods=["POST"]), Route("/healthz", healthz, methods=["GET"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **config))  # type: ignore[arg-type]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", peers
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def raw_server(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server speaking whatever ``handler`` writes; the list counts the connections made."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_answers_over_kept_alive_connections_with_uvicorn(http: str) -> None:
    async with uvicorn_server(http=http) as (base, peers):
        client = PodHttp()
        answers = [await client.post_json(f"{base}/bind", {"env": f"e{i}"}, timeout=10) for i in range(5)]
        assert [a.status for a in answers] == [200] * 5
        assert [a.json()["env"] for a in answers] == [f"e{i}" for i in range(5)]
        assert answers[0].json()["host"] == base.removeprefix("http://")  # the pod's host guard checks it
        assert answers[0].json()["type"] == "application/json"
        assert len(set(peers)) == 1  # one connection, reused
        many = await asyncio.gather(*(client.post_json(f"{base}/bind", {"env": str(i)}, timeout=10) for i in range(200)))
        assert [a.json()["env"] for a in many] == [str(i) for i in range(200)]
        chunked = await client.post_json(f"{base}/chunked", {}, timeout=10)
        assert chunked.json() == {"env": "crm", "n": 3}
        refused = await client.post_json(f"{base}/refuse", {"env": "x"}, timeout=10)
        assert refused.status == 404 and "unknown environment" in refused.text()
        await client.close()


async def test_a_connection_opened_ahead_serves_the_next_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """open() leaves one more kept connection each time, even beside an idle one (a step's
    fan-out needs one per pod); the env server's listener keeps it idle past its head deadline,
    and the next requests take it instead of connecting."""
    from awm.envserver import listener

    protocol = listener.protocol("httptools")
    monkeypatch.setattr(protocol, "head_timeout_s", 0.5)
    async with uvicorn_server(http=protocol, timeout_keep_alive=30) as (base, peers):
        client = PodHttp()
        assert client.idle_count(base) == 0
        for n in (1, 2):
            assert await client.open(f"{base}/healthz", timeout=5) is True
            assert client.idle_count(f"{base}/bind") == n  # counted by address, whatever the path
        opened = set(peers)
        assert len(opened) == 2
        await asyncio.sleep(1.0)  # idle past the head deadline: the keep-alive's wait, not cut
        answers = await asyncio.gather(*(client.post_json(f"{base}/bind", {"env": e}, timeout=5) for e in "ab"))
        assert [a.json()["env"] for a in answers] == ["a", "b"]
        assert set(peers) == opened and client.idle_count(base) == 2  # no connection was made
        await client.close()


async def test_a_connection_opened_ahead_that_the_pod_closes_is_not_kept() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()

    async with raw_server(handler) as (base, connections):
        client = PodHttp()
        assert await client.open(base + "/healthz", timeout=5) is False
        assert client.idle_count(base) == 0 and len(connections) == 1
    with pytest.raises(PodHttpError, match="cannot connect"):
        await client.open(base + "/healthz", timeout=5)  # the server is gone
    with pytest.raises(PodHttpError, match="not an http"):
        client.idle_count("10.0.0.1:8081")
    await client.close()


async def test_a_connection_the_pod_closed_while_idle_is_replaced() -> None:
    async with uvicorn_server(timeout_keep_alive=1) as (base, peers):
        client = PodHttp()
        await client.post_json(f"{base}/bind", {"env": "a"}, timeout=10)
        await asyncio.sleep(1.5)  # uvicorn closed it; the client may not have seen that yet
        assert (await client.post_json(f"{base}/bind", {"env": "b"}, timeout=10)).json()["env"] == "b"
        assert len(set(peers)) == 2
        await client.close()


async def test_a_request_lost_to_a_closing_connection_is_sent_once_more() -> None:
    """The pod closes a kept-alive connection as the request arrives (the keep-alive race): the
    request was never read, so it goes again on a new connection."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b'{"env": "first"}'))
        await writer.drain()
        await reader.read(1)  # the next request's first byte: close without answering

    async with raw_server(handler) as (base, connections):
        client = PodHttp()
        assert (await client.post_json(base + "/bind", {}, timeout=5)).json() == {"env": "first"}
        assert (await client.post_json(base + "/bind", {}, timeout=5)).json() == {"env": "first"}
        assert len(connections) == 2
        await client.close()


async def test_an_answer_cut_short_is_an_error_and_not_sent_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"env\"")
        await writer.drain()

    async with raw_server(handler) as (base, connections):
        client = PodHttp()
        with pytest.raises(PodHttpError, match="mid-answer"):
            await client.post_json(base + "/reset", {}, timeout=5)
        assert len(connections) == 1


@pytest.mark.parametrize("answer, why", [
    (b"SSH-2.0-OpenSSH_9.6\r\n", "malformed"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}", "malformed"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "malformed"),
])
async def test_what_is_not_http_is_an_error(answer: bytes, why: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(handler) as (base, _):
        with pytest.raises(PodHttpError, match=why):
            await PodHttp().post_json(base + "/bind", {}, timeout=5)


async def test_an_answer_over_the_cap_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(podhttp, "MAX_ANSWER_BYTES", 1000)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(100):  # endless, in chunks: no length to check up front
            writer.write(b"100\r\n" + b"x" * 256 + b"\r\n")
            await writer.drain()

    async with raw_server(handler) as (base, _):
        with pytest.raises(PodHttpError, match="larger than 1000 bytes"):
            await PodHttp().post_json(base + "/bind", {}, timeout=5)


async def test_a_pod_that_never_answers_times_out_and_its_connection_is_dropped() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_request(reader)
        if json.loads(body).get("slow"):
            await asyncio.sleep(30)
        writer.write(ok(b'{"env": "x"}'))
        await writer.drain()
        await read_request(reader)  # a second request on this connection is never answered either

    async with raw_server(handler) as (base, connections):
        client = PodHttp()
        with pytest.raises(PodHttpError, match="no answer within 0.3 s"):
            await client.post_json(base + "/bind", {"slow": True}, timeout=0.3)
        assert (await client.post_json(base + "/bind", {}, timeout=5)).json() == {"env": "x"}
        assert len(connections) == 2  # the timed-out one was not reused
        await client.close()


async def test_a_refused_connection_and_a_bad_url_are_errors() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        client = PodHttp()
        with pytest.raises(PodHttpError, match="cannot connect"):
            await client.post_json(f"http://127.0.0.1:{port}/bind", {}, timeout=5)
    for url in ("ftp://10.0.0.1/bind", "http:///bind", "no url", "http://10.0.0.1:port/bind",
                "http://10.0.0.1:99999/bind", "http://10.0.0.1/b\u00efnd"):
        with pytest.raises(PodHttpError, match="not an http"):
            await client.post_json(url, {}, timeout=5)


async def test_bytes_after_an_answer_end_the_connection() -> None:
    """A pod that answers twice to one request: the second answer is never taken for the next
    request's."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(ok(b'{"env": "asked"}') + ok(b'{"env": "unasked"}'))
            await writer.drain()

    async with raw_server(handler) as (base, connections):
        client = PodHttp()
        for _ in range(3):
            assert (await client.post_json(base + "/bind", {}, timeout=5)).json() == {"env": "asked"}
        assert len(connections) == 3
        await client.close()


async def test_connections_probe_a_peer_that_may_vanish() -> None:
    """A pod whose node is gone sends no FIN: keep-alive probes find it while the connection is
    idle, and a request it never acknowledges ends at TCP_USER_TIMEOUT instead of the deadline."""
    async with uvicorn_server() as (base, _):
        client = PodHttp()
        await client.post_json(f"{base}/bind", {"env": "a"}, timeout=10)
        (idle,) = client._idle.values()
        sock = idle[0].transport.get_extra_info("socket")
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == podhttp.KEEPALIVE_IDLE_S
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == podhttp.USER_TIMEOUT_MS
        await client.close()
