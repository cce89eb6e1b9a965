"""The operator's fan-out to its pods: what one ``POST /bind`` costs the operator's event loop.

    .venv/bin/python -m bench.podhttp --json          # 1,024 requests per fan-out, 8 rounds per client

A GRPO step of 64 groups x 16 makes the operator send 1,024 ``/bind`` requests at once, and its
release 1,024 ``/reset``; the operator's single event loop (uvloop) sends them while it also
answers the allocation API. This sends fan-outs of ``--requests`` POSTs to a pod stand-in with the
env server's HTTP stack (uvicorn with httptools, Starlette; in its own process, as pods are) and
measures the CPU time of the sending process per request and the wall time of a fan-out.

Same run, alternated round by round: the operator's client (``awm_operator.podhttp.PodHttp``)
against the baseline, aiohttp's ``ClientSession`` as the operator used it before (a
``TCPConnector(limit=256, limit_per_host=0)``, ``json=``, ``response.json()``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import uvloop

from awm_operator.podhttp import PodHttp
from bench.runtime import machine

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def serve(sock: socket.socket) -> None:
    """The pod stand-in: answers /bind as the env server's control API does (a small JSON)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def bind(request: Request) -> JSONResponse:
        env = (await request.json()).get("env")
        return JSONResponse({"env": env, "switched": True, "cached": False, "bind_ms": 0.0, "cached_envs": [env]})

    app = Starlette(routes=[Route("/bind", bind, methods=["POST"])])
    uvicorn.Server(uvicorn.Config(app, http="httptools", loop="uvloop", log_level="warning", access_log=False,
                                  lifespan="off")).run(sockets=[sock])


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS


async def fan_out(send: Callable[[int], Awaitable[str]], n: int) -> tuple[float, float]:
    """(wall ms, this process's CPU ms) of ``n`` requests sent at once."""
    c0, t0 = time.process_time(), time.perf_counter()
    envs = await asyncio.gather(*(send(i) for i in range(n)))
    wall, cpu = (time.perf_counter() - t0) * 1000, (time.process_time() - c0) * 1000
    assert envs == [f"env{i % 64:04d}" for i in range(n)], "every answer is its own request's"
    return wall, cpu


async def measure(url: str, requests: int, rounds: int, server_pid: int) -> dict[str, Any]:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256, limit_per_host=0),
                                    timeout=aiohttp.ClientTimeout(total=60))
    pods = PodHttp()

    async def by_aiohttp(i: int) -> str:
        async with session.post(url, json={"env": f"env{i % 64:04d}"}) as r:
            return str((await r.json(content_type=None))["env"])

    async def by_podhttp(i: int) -> str:
        return str((await pods.post_json(url, {"env": f"env{i % 64:04d}"}, timeout=60)).json()["env"])

    clients = {"aiohttp": by_aiohttp, "podhttp": by_podhttp}
    for send in clients.values():  # warm-up: connections open, code paths taken
        await fan_out(send, requests)
    samples: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": [], "server": []} for k in clients}
    for r in range(rounds):
        for name in (list(clients) if r % 2 == 0 else list(reversed(clients))):
            s0 = cpu_ms(server_pid)
            wall, cpu = await fan_out(clients[name], requests)
            samples[name]["wall"].append(wall)
            samples[name]["cpu"].append(cpu)
            samples[name]["server"].append(cpu_ms(server_pid) - s0)
    await session.close()
    await pods.close()
    out: dict[str, Any] = {}
    for name, s in samples.items():
        out[name] = {"fan_out_wall_ms_p50": round(statistics.median(s["wall"]), 1),
                     "fan_out_wall_ms_range": [round(min(s["wall"]), 1), round(max(s["wall"]), 1)],
                     "client_cpu_us_per_request_p50": round(statistics.median(s["cpu"]) * 1000 / requests, 1),
                     "client_cpu_us_per_request_range": [round(min(s["cpu"]) * 1000 / requests, 1),
                                                         round(max(s["cpu"]) * 1000 / requests, 1)],
                     "server_cpu_us_per_request_p50": round(statistics.median(s["server"]) * 1000 / requests, 1)}
    out["client_cpu_ratio_aiohttp_over_podhttp"] = round(
        out["aiohttp"]["client_cpu_us_per_request_p50"] / out["podhttp"]["client_cpu_us_per_request_p50"], 2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1024, help="requests per fan-out (a step of 64 x 16: 1,024)")
    ap.add_argument("--rounds", type=int, default=8, help="fan-outs per client, alternated")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default prints it indented)")
    args = ap.parse_args()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    server = multiprocessing.get_context("spawn").Process(target=serve, args=(sock,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/bind"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(sock.getsockname(), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        time.sleep(0.5)
        result = {"machine": {**machine(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
                  "requests": args.requests, "rounds": args.rounds,
                  **uvloop.run(measure(url, args.requests, args.rounds, server.pid))}  # type: ignore[arg-type]
    finally:
        server.terminate()
        server.join(5)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
