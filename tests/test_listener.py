"""The env server's listeners close a connection whose request head does not arrive in time,
however slowly its bytes trickle in (a real uvicorn server on a real socket, both parsers)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvicorn

from awm.envserver import listener


async def app(scope, receive, send):  # the smallest ASGI app: 200 "ok"
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_request_head_must_arrive_within_its_deadline(http, monkeypatch):
    cls = listener.protocol(http)
    monkeypatch.setattr(cls, "head_timeout_s", 1.0)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http=cls, log_level="error",
                                           lifespan="off", timeout_keep_alive=30))
    server.install_signal_handlers = lambda: None
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    def trickle(after_a_request: bool = False) -> tuple[float, bytes]:
        """A slowloris client: one header byte every 0.2 s, never the blank line (on a fresh
        connection, or on one kept alive after an honest request and an idle pause)."""
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(10)
            if after_a_request:
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = b""
                while not answer.endswith(b"\r\n\r\nok"):
                    chunk = s.recv(1024)
                    assert chunk, f"the server closed the connection before answering: {answer!r}"
                    answer += chunk
                time.sleep(1.5)  # idle past the head deadline: the keep-alive's wait, not the head's
            start = time.monotonic()
            s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            try:
                while time.monotonic() - start < 8:
                    s.sendall(b"a")
                    time.sleep(0.2)
                    s.setblocking(False)
                    try:
                        if s.recv(1024) == b"":
                            return time.monotonic() - start, b""
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start, b""
            return time.monotonic() - start, b"still open"

    def keep_alive() -> list[bytes]:
        """An honest client: three requests on one connection, each after an idle pause longer
        than the head deadline (the keep-alive, 30 s here, bounds an idle connection; the head
        deadline counts from a request's first byte)."""
        out = []
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.settimeout(5)
            for _ in range(3):
                s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                answer = b""
                while not answer.endswith(b"\r\n\r\nok"):
                    chunk = s.recv(1024)
                    if not chunk:
                        break
                    answer += chunk
                out.append(answer)
                time.sleep(1.6)
        return out

    try:
        took, left = await asyncio.to_thread(trickle)
        assert left == b"", "a trickling client kept its connection"
        assert took < 6
        took, left = await asyncio.to_thread(trickle, True)
        assert left == b"", "a trickling client kept its kept-alive connection"
        assert took < 6
        answers = await asyncio.to_thread(keep_alive)
        assert len(answers) == 3 and all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"ok") for a in answers), answers
    finally:
        server.should_exit = True
        await task


def test_a_server_on_httptools_never_imports_h11():
    """An env server holds only the HTTP parser it uses (h11 is ~2 MB of every instance's memory)."""
    import subprocess
    import sys

    code = ("import sys; from awm.envserver import __main__, listener; "
            "assert listener.protocol('auto').__name__ == 'HttpToolsHeadDeadline'; "
            "print('h11' in sys.modules, 'websockets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
