"""Fleet benchmark: the operator on a real control plane (k8s/harness.py; kwok fakes the pods).

    .venv/bin/python -m bench.fleet --json            # 1,024 instances (about 3-4 minutes)
    .venv/bin/python -m bench.fleet --instances 256   # smaller

What it measures (the operator runs as its own process, ``python -m awm_operator``, as in a
cluster; the clients run in this process):

* ``time_to_ready_s``: EnvFleet created until its status says ``ready == instances``.
* ``claim_p50_ms`` / ``claim_p99_ms``: one-instance claims through the allocation API, one at a
  time from a warm pool (each released again between claims; the release is not timed).
* ``claims_per_s``: sustained: 16 clients claiming and releasing one instance in a loop;
  ``ledger_writes_per_claim``: the operator's ledger writes per claim-and-release cycle meanwhile.
  ``sustained_by_clients``: the same for each ``--clients`` count (default 16, 32, 64): claims/s,
  claim p50/p99, ledger writes and CPU (all processes) per cycle.
* ``baseline_pod_write_claims_per_s``: the same loop when a claim and a release each write the
  pod (the operator's previous design), measured in the same run.
* ``grpo_claim_p50_ms``: 8 groups of 8 instances in one claim.
* ``envclaim_p50_ms`` / ``envclaim_p99_ms``: the EnvClaim resource: POST until a watch sees it Bound.
* ``full_*``: the fleet full: every instance but 64 held by its own one-instance claim (a realistic
  ``holder``), as a trainer taking single instances would leave it: the time to fill it, the
  ledger's size and number of ConfigMaps (``ledger_bytes``, ``ledger_objects``; one ConfigMap may
  hold 1 MiB), claim p50/p99 and sustained claims/s on the 64 free instances, and the time to
  release all of them with one ``DELETE .../claims?holder=``.
* ``recover_s``: 100 ready pods deleted until the fleet is back at ``ready == instances``.
* ``etcd_db_mb_after_*``: the size of etcd's database file (a ledger write stores its whole
  ConfigMap again; etcd's quota here is 2 GiB).
* ``rss_mb`` / ``peak_rss_mb``: resident memory of the operator and each control-plane process
  after the ramp, and the peak of each over the whole run.

``--late``: a GRPO step of the paper's shape (``--step-groups`` group claims of ``--group-size``,
all at once, each of another environment) on a per-environment fleet and on a late-binding fleet
over a ``--catalog-envs`` catalog: ``steps`` back to back (``--steps``), ``client_switch_steps``
(``"switch": "client"``) and ``steps_after_idle`` (6 s apart, as a trainer's rollouts space them:
past uvicorn's default keep-alive of 5 s); each with the step's bound time, its group
claims' p50/p99 and the CPU each process spent until bound (``cpu_ms``); then sustained claims of
random environments, and ``instances_replaced`` (releases whose reset failed: none expected).

Releases reset each instance through its control API: every pod points (``awm.dev/control-url``)
at a stub control API (``StubPods``, a process of its own) that answers ``/reset`` and ``/bind``
at once. The clients authenticate
with a ServiceAccount token (the operator's API checks it with TokenReview and RBAC, cached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import httptools
import httpx
import uvloop

from awm.claims import Claim, ClaimedInstance
from awm.episode.allocation import AllocationClient, bearer
from awm_operator.cli import render
from awm_operator.crds import definitions
from k8s import harness
from tests.k8s_e2e import CLIENTS_NS, client_token, grant_claims


NS = "awm-bench"
IDLE_GAP_S = 6.0  # between the steps_after_idle: past uvicorn's default keep-alive (5 s)
API = f"/apis/awm.dev/v1alpha1/namespaces/{NS}"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 2)


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem, 1), "python": platform.python_version(),
            "kernel": platform.release()}


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of a process, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def nodes_for(instances: int, pods_per_node: int = 512) -> int:
    """kwok nodes enough for the fleet with a quarter to spare (pods being replaced still hold a
    slot until they are gone), at least the harness's usual 4."""
    return max(4, -(-instances * 5 // 4 // pods_per_node))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _StubPod(asyncio.Protocol):
    """Every pod's control API at once, answering at once: what the operator sends a pod (POST
    /bind, /reset) parsed by httptools (the parser uvicorn runs in the env server)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        self.parser = httptools.HttpRequestParser(self)
        self.url, self.body = b"", b""

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        url, body, self.url, self.body = self.url, self.body, b"", b""
        status = b"200 OK"
        if url == b"/bind":  # late binding: the operator's side only
            env = json.loads(body or b"{}").get("env")
            answer: dict[str, Any] = {"env": env, "switched": True, "cached": False, "bind_ms": 0.0}
        elif url == b"/reset":
            answer = {"episode_id": "bench", "pristine": True, "reset_ms": 0.0}
        else:
            status, answer = b"404 Not Found", {"detail": "not found"}
        out = json.dumps(answer).encode()
        self.transport.write(b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (status, len(out), out))
        if not self.parser.should_keep_alive():
            self.transport.close()


def _serve_stub(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_StubPod, sock=sock, backlog=4096)
        await server.serve_forever()

    uvloop.run(main())


class StubPods:
    """The control API every kwok pod points at (``awm.dev/control-url``), in a process of its own.

    On a cluster each pod answers on its own CPU; here one stub answers for all 1,024 pods on the
    same 2 cores as the operator, the control plane and the clients, so it is kept as cheap as it
    can be (tens of microseconds a request) and off this process's event loop, which runs the
    clients. Its listen backlog is large: a fan-out of a thousand connections at once overflowed
    aiohttp's default of 128, and each dropped SYN waited a second to be sent again."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.process = multiprocessing.get_context("spawn").Process(target=_serve_stub, args=(self.sock,),
                                                                    name="awm-bench-stub-pods", daemon=True)
        self.process.start()

    def cpu_s(self) -> float:
        return cpu_seconds(self.process.pid) if self.process.pid else 0.0  # type: ignore[arg-type]

    async def cleanup(self) -> None:
        self.process.terminate()
        self.process.join(5)
        self.sock.close()


async def switch_instance(session: aiohttp.ClientSession, inst: ClaimedInstance) -> None:
    """What a trainer's lease does with an instance claimed with ``"switch": "client"``."""
    async with session.post(f"{inst.control_url}/bind", json={"env": inst.environment}) as r:
        assert r.status == 200, await r.text()


class Bench:
    def __init__(self, cp: Any, instances: int, log: Any) -> None:
        self.cp, self.n, self.log = cp, instances, log
        self.profile: str | None = None
        self.stub: StubPods | None = None  # the pods' control API, once a fleet is made
        self.clients: list[int] = [16]
        self.steps = 3  # --late: GRPO steps per fleet and switching mode
        pki = Path(cp.workdir) / "pki"
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self.k8s = httpx.AsyncClient(base_url=cp.server, verify=tls, timeout=60,
                                     limits=httpx.Limits(max_connections=64))

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by each control-plane process, the operator and this client."""
        out = {name: cpu_seconds(p.pid) for name, p in self.cp.procs.items()}
        out["operator"], out["clients"] = cpu_seconds(self.operator_pid), cpu_seconds(os.getpid())
        if self.stub is not None:
            out["stub_pods"] = self.stub.cpu_s()
        return out

    def spy(self, phase: str, seconds: float) -> subprocess.Popen[bytes] | None:
        """With --profile: py-spy samples the operator for ``seconds`` (collapsed stacks)."""
        if not self.profile:
            return None
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        return subprocess.Popen([exe, "record", "--pid", str(self.operator_pid), "--duration", str(int(seconds)),
                                 "--rate", "100", "--nonblocking", "--format", "raw",
                                 "--output", f"{self.profile}-{phase}.txt"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def rss(self, field: str = "VmRSS") -> dict[str, float]:
        out = {name: rss_mb(p.pid, field) for name, p in self.cp.procs.items()}
        out["operator"] = rss_mb(self.operator_pid, field)
        return out

    def etcd_db_mb(self) -> float:
        """etcd's database file: every ledger write stores the whole ConfigMap again, and until
        the API server compacts (every 5 min) etcd keeps each version; the file grows to its
        high-water mark and counts against etcd's 2 GiB quota."""
        db = Path(self.cp.workdir) / "etcd" / "member" / "snap" / "db"
        return round(db.stat().st_size / 1e6, 1) if db.exists() else 0.0

    async def ledger_size(self) -> tuple[int, int]:
        """(bytes of claim data, ConfigMaps) of the bench fleet's ledger."""
        r = await self.k8s.get(f"/api/v1/namespaces/{NS}/configmaps",
                               params={"labelSelector": "app.kubernetes.io/name=awm-ledger,awm.dev/fleet=bench"})
        items = r.json()["items"]
        size = sum(len(k) + len(v) for cm in items for k, v in (cm.get("data") or {}).items())
        return size, len(items)

    async def full_fleet(self, session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
        """Hold all but 64 instances in one-instance claims, measure claims on the rest, release."""
        out: dict[str, Any] = {}
        holder = "campaign/grpo-qwen3-8b-run-017"
        hold = self.n - 64
        held: list[str] = []

        async def filler(count: int) -> None:
            for _ in range(count):
                async with session.post(base, json={"count": 1, "waitSeconds": 30, "holder": holder}) as r:
                    assert r.status == 201, await r.text()
                    held.append((await r.json())["id"])
        t = time.monotonic()
        await asyncio.gather(*(filler(hold // 16 + (1 if i < hold % 16 else 0)) for i in range(16)))
        out["full_fill_s"] = round(time.monotonic() - t, 1)
        out["full_held_claims"] = len(held)
        out["ledger_bytes"], out["ledger_objects"] = await self.ledger_size()
        self.log(f"{len(held)} claims held in {out['full_fill_s']} s; ledger {out['ledger_bytes']} bytes "
                 f"in {out['ledger_objects']} ConfigMap(s)")
        spy = self.spy("full", 10)
        lat = []
        for _ in range(100):
            t = time.perf_counter()
            async with session.post(base, json={"count": 1}) as r:
                assert r.status == 201, await r.text()
                claim_id = (await r.json())["id"]
            lat.append((time.perf_counter() - t) * 1000)
            async with session.delete(f"{base}/{claim_id}") as r:
                assert r.status == 200, await r.text()
        out["full_claim_p50_ms"], out["full_claim_p99_ms"] = pct(lat, 0.5), pct(lat, 0.99)
        done, stop_at = [], time.monotonic() + 5.0

        async def worker() -> None:
            while time.monotonic() < stop_at:
                async with session.post(base, json={"count": 1, "waitSeconds": 30}) as r:
                    assert r.status == 201, await r.text()
                    claim_id = (await r.json())["id"]
                done.append(1)
                async with session.delete(f"{base}/{claim_id}") as r:
                    assert r.status == 200, await r.text()
        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(16)))
        out["full_claims_per_s"] = round(len(done) / (time.monotonic() - t), 1)
        if spy is not None:
            spy.wait()
        self.log(f"full fleet: claim p50 {out['full_claim_p50_ms']} ms, p99 {out['full_claim_p99_ms']} ms, "
                 f"{out['full_claims_per_s']} claims/s")
        t = time.monotonic()
        async with session.delete(base, params={"holder": holder}, timeout=aiohttp.ClientTimeout(total=600)) as r:
            assert r.status == 200, await r.text()
            released = len((await r.json())["released"])
        out["full_release_s"] = round(time.monotonic() - t, 1)
        assert released == len(held), (released, len(held))
        out["etcd_db_mb_after_full"] = self.etcd_db_mb()
        self.log(f"{released} claims released (one DELETE ?holder=) in {out['full_release_s']} s; "
                 f"etcd database {out['etcd_db_mb_after_full']} MB")
        return out

    async def fleet_status(self) -> dict[str, Any]:
        r = await self.k8s.get(f"{API}/envfleets/bench")
        return r.json().get("status") or {}

    async def wait_ready(self, timeout: float = 600) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            s = await self.fleet_status()
            if s.get("ready") == self.n and s.get("replicas") == self.n:
                return time.monotonic() - t0
            await asyncio.sleep(0.25)
        raise TimeoutError(f"fleet not ready after {timeout}s: {await self.fleet_status()}")

    async def metric(self, name: str, having: str = "") -> float:
        """The sum of the operator's samples of ``name`` (whose labels contain ``having``)."""
        text = (await self.k8s.get(self.metrics_url)).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + "{", name + " ")) and having in line)

    async def ledger_writes(self) -> float:
        return await self.metric("awm_ledger_writes_total", 'result="ok"')

    async def passes(self) -> tuple[float, float]:
        """(reconcile passes so far, their seconds): a pass holds the event loop that serves claims."""
        return await self.metric("awm_reconcile_seconds_count"), await self.metric("awm_reconcile_seconds_sum")

    async def sustained(self, session: aiohttp.ClientSession, base: str, clients: int, seconds: float,
                        profile: bool = False, envs: list[str] | None = None,
                        phase: str = "sustained", client_switch: bool = False) -> dict[str, Any]:
        """``clients`` loops, each claiming one instance and releasing it, for ``seconds``: claims/s,
        claim latency, ledger writes and every process's CPU per cycle. Throughput depends on how
        many claims are in flight (a write carries every change queued while the previous one was
        in flight), so the benchmark reports it at several counts. ``envs``: each claim names one
        of them, at random (late binding: a claim of another environment switches its pod).
        ``client_switch``: claims ask ``"switch": "client"`` and the client switches each instance
        itself (POST /bind to its control URL, as a trainer's lease does) before releasing it."""
        import random

        rng = random.Random(clients)
        done: list[int] = []
        claim_lat: list[float] = []
        stop_at = 0.0  # set just before the clients start

        async def worker() -> None:
            while time.monotonic() < stop_at:
                t = time.perf_counter()
                body = {"count": 1, "waitSeconds": 30, **({"environment": rng.choice(envs)} if envs else {}),
                        **({"switch": "client"} if client_switch else {})}
                async with session.post(base, json=body) as r:
                    assert r.status == 201, await r.text()
                    got = Claim.read(await r.json())
                    claim_id = got.id
                for inst in got.instances:
                    if inst.switched is False:  # the client's switch: part of the claim's latency
                        await switch_instance(session, inst)
                claim_lat.append((time.perf_counter() - t) * 1000)
                done.append(1)
                async with session.delete(f"{base}/{claim_id}") as r:
                    assert r.status == 200, await r.text()

        cpu1, writes0, passes0 = self.cpu(), await self.ledger_writes(), await self.passes()
        spy = self.spy(phase, seconds) if profile else None
        t = time.monotonic()
        stop_at = t + seconds
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.monotonic() - t
        if spy is not None:
            spy.wait()
        writes, cpu2, passes1 = await self.ledger_writes() - writes0, self.cpu(), await self.passes()
        cpu = {k: round(cpu2[k] - cpu1[k], 2) for k in cpu1}
        n_passes = passes1[0] - passes0[0]
        return {"clients": clients, "claims_per_s": round(len(done) / elapsed, 1),
                "p50_ms": pct(claim_lat, 0.5), "p99_ms": pct(claim_lat, 0.99),
                "ledger_writes_per_cycle": round(writes / len(done), 3),
                "cpu_ms_per_cycle": round(sum(cpu.values()) * 1000 / len(done), 2), "cpu_s": cpu,
                "reconcile_passes": int(n_passes),
                "reconcile_pass_mean_ms": round((passes1[1] - passes0[1]) * 1000 / n_passes, 2) if n_passes else None}

    async def pod_write_baseline(self, seconds: float = 10.0) -> float:
        """The design this operator replaced, measured on the same control plane: a claim marks
        its pod with a compare-and-swap JSON patch, a release unmarks it (16 clients, each on pods
        of its own). Nothing else differs: same API server, same pods, same client machine."""
        r = await self.k8s.get(f"/api/v1/namespaces/{NS}/pods",
                               params={"labelSelector": "awm.dev/fleet=bench", "limit": "64"})
        pods = [p["metadata"]["name"] for p in r.json()["items"]]
        key = "/metadata/annotations/awm.dev~1bench-claim"
        headers = {"Content-Type": "application/json-patch+json"}
        done: list[int] = []
        stop_at = time.monotonic() + seconds

        async def worker(mine: list[str]) -> None:
            i = 0
            while time.monotonic() < stop_at:
                url = f"/api/v1/namespaces/{NS}/pods/{mine[i % len(mine)]}"
                i += 1
                claim = [{"op": "test", "path": "/metadata/labels/awm.dev~1fleet", "value": "bench"},
                         {"op": "add", "path": key, "value": "c"}]
                (await self.k8s.patch(url, content=json.dumps(claim), headers=headers)).raise_for_status()
                done.append(1)
                release = [{"op": "test", "path": key, "value": "c"}, {"op": "remove", "path": key}]
                (await self.k8s.patch(url, content=json.dumps(release), headers=headers)).raise_for_status()
        t = time.monotonic()
        await asyncio.gather(*(worker(pods[i::16]) for i in range(16)))
        return round(len(done) / (time.monotonic() - t), 1)

    async def envclaim_latencies(self, count: int) -> list[float]:
        """POST an EnvClaim, wait on a watch until it is Bound, delete it; one at a time."""
        out = []
        for i in range(count):
            name = f"ec-{i}"
            bound = asyncio.get_running_loop().create_future()

            async def watch(name: str = name, bound: asyncio.Future = bound) -> None:
                params = {"watch": "true", "fieldSelector": f"metadata.name={name}"}
                async with self.k8s.stream("GET", f"{API}/envclaims", params=params, timeout=None) as r:
                    async for line in r.aiter_lines():
                        if not line:
                            continue
                        obj = json.loads(line).get("object") or {}
                        if (obj.get("status") or {}).get("phase") == "Bound" and not bound.done():
                            bound.set_result(time.perf_counter())
                            return

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.05)  # the watch is established
            t0 = time.perf_counter()
            r = await self.k8s.post(f"{API}/envclaims", json={
                "apiVersion": "awm.dev/v1alpha1", "kind": "EnvClaim", "metadata": {"name": name},
                "spec": {"fleet": "bench", "count": 1}})
            r.raise_for_status()
            t1 = await asyncio.wait_for(bound, 30)
            out.append((t1 - t0) * 1000)
            watcher.cancel()
            await self.k8s.delete(f"{API}/envclaims/{name}")
        return out

    async def step(self, alloc: Any, fleet: str, envs: list[str], group: int,
                   client_switch: bool = False) -> dict[str, Any]:
        """One GRPO step: a group claim per environment, all at once (as a trainer's rollout
        service starts a step's groups); the time until every group is bound, and per group.
        ``client_switch``: the client switches the group's instances itself, all at once (as
        :class:`awm.episode.sources.OperatorSource` does), inside the group's time; the time until
        the claims are answered (``step_claimed_ms``, ``group_answer_*``) is then reported too:
        the operator's part, where the switches that follow hit one stub process instead
        of a thousand pods, each with its own CPU."""
        lat: list[float] = []
        answered: list[float] = []
        t0 = time.perf_counter()

        async def one(env: str) -> str:
            t = time.perf_counter()
            got = await alloc.claim(group, group_size=group, environment=env, wait_seconds=120,
                                    switch="client" if client_switch else "operator")
            answered.append(time.perf_counter())
            pending = [i for i in got.instances if i.switched is False]
            if pending:
                await asyncio.gather(*(switch_instance(self.session, i) for i in pending))
            lat.append((time.perf_counter() - t) * 1000)
            assert all(i.environment == env for i in got.instances), got
            return got.id

        cpu0 = self.cpu()
        ids = await asyncio.gather(*(one(env) for env in envs))
        wall = (time.perf_counter() - t0) * 1000
        cpu1 = self.cpu()
        await asyncio.gather(*(alloc.release(i) for i in ids))
        out = {"groups": len(envs), "group_size": group, "step_bound_ms": round(wall, 1),
               "group_claim_p50_ms": pct(lat, 0.5), "group_claim_p99_ms": pct(lat, 0.99),
               # until bound (not the release): who spent the step's CPU; /proc's 10 ms ticks
               "cpu_ms": {k: round((cpu1[k] - cpu0[k]) * 1000) for k in cpu0 if cpu1[k] > cpu0[k]}}
        if client_switch:
            out["step_claimed_ms"] = round((max(answered) - t0) * 1000, 1)
            out["group_answer_p99_ms"] = pct([(a - t0) * 1000 for a in answered], 0.99)
        return out

    async def run_late(self, catalog_envs: int, step_groups: int, group: int) -> dict[str, Any]:
        """Late binding against today's per-environment fleet, on the same step: ``step_groups``
        GRPO groups of ``group`` over as many distinct environments. The baseline fleet holds
        ``group`` pods of each of the step's environments (the least a per-environment fleet
        needs for it); the late fleet holds the same number of pods over a catalog of
        ``catalog_envs`` environments, and every step draws new environments."""
        import random

        self.stub = stub = StubPods()
        control_url = stub.url
        result: dict[str, Any] = {"catalog_envs": catalog_envs, "step": f"{step_groups} groups x {group}"}
        catalog = [f"env{i:04d}" for i in range(catalog_envs)]
        rng = random.Random(0)
        template = {"annotations": {"awm.dev/control-url": control_url}}
        try:
            for mode in ("pinned", "late"):
                step_envs = rng.sample(catalog, step_groups)
                spec = {"environments": step_envs if mode == "pinned" else catalog, "replicas": self.n, "catalog": {},
                        "database": {"secretName": "awm-db"}, "template": template,
                        "binding": mode}
                fleet = {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": "bench"},
                         "spec": spec}
                t0 = time.monotonic()
                (await self.k8s.post(f"{API}/envfleets", json=fleet)).raise_for_status()
                ready = round(await self.wait_ready(), 1)
                self.log(f"{mode}: {self.n} ready in {ready} s")
                await asyncio.sleep(max(0.0, 3 - (time.monotonic() - t0)))
                out: dict[str, Any] = {"pods": self.n, "time_to_ready_s": ready, "steps": []}
                async with AllocationClient(self.api, NS, "bench") as alloc, aiohttp.ClientSession() as self.session:
                    for by_client in ((False, True) if mode == "late" else (False,)):
                        key = "client_switch_steps" if by_client else "steps"
                        out[key] = []
                        spy = self.spy(f"{mode}-{key}", 8) if self.profile else None
                        t_steps = time.monotonic()
                        for n in range(self.steps):
                            envs = step_envs if mode == "pinned" else rng.sample(catalog, step_groups)
                            out[key].append(await self.step(alloc, "bench", envs, group, client_switch=by_client))
                            self.log(f"{mode} {key} {n}: {out[key][-1]}")
                            if spy is not None and time.monotonic() - t_steps > 8:
                                break  # with --profile: as many steps as the profile's 8 s hold
                        if spy is not None:
                            spy.wait()
                    # Steps as a trainer spaces them (its rollouts take seconds to minutes): each
                    # after an idle gap longer than uvicorn's default keep-alive (5 s), which the
                    # env server's control listener extends (CONTROL_KEEP_ALIVE_S) so that the
                    # operator's connection from a pod's release serves its next claim. (A
                    # step's first use of its pods, steps[0], opens every connection.)
                    out["steps_after_idle"] = []
                    for n in range(3):
                        await asyncio.sleep(IDLE_GAP_S)
                        envs = step_envs if mode == "pinned" else rng.sample(catalog, step_groups)
                        out["steps_after_idle"].append(await self.step(alloc, "bench", envs, group))
                        self.log(f"{mode} steps_after_idle {n}: {out['steps_after_idle'][-1]}")
                # Single claims of a random environment (the late fleet: of its whole catalog, so
                # nearly every claim switches its pod; the pinned one: of the step's environments),
                # from the same lean client as the main benchmark's sustained loop.
                base = f"{self.api}/v1/namespaces/{NS}/envfleets/bench/claims"
                envs = catalog if mode == "late" else step_envs
                async with aiohttp.ClientSession(headers=bearer()) as session:
                    for by_client in ((False, True) if mode == "late" else (False,)):
                        windows = []
                        for n, clients in enumerate(self.clients):
                            await self.sustained(session, base, clients, 2.0, envs=envs,  # warm-up
                                                 client_switch=by_client)
                            windows.append(await self.sustained(
                                session, base, clients, 10.0, profile=n == 0, envs=envs, client_switch=by_client,
                                phase=f"{mode}{'-client-switch' if by_client else ''}-sustained"))
                            self.log(f"{mode}{' (the client switches)' if by_client else ''}: "
                                     f"{windows[-1]['claims_per_s']} claims/s of random environments ({clients} clients)")
                        key = "client_switch_" if by_client else ""
                        out[f"{key}sustained_by_clients"] = windows
                        out[f"{key}claims_per_s_16_clients"] = next(
                            (w["claims_per_s"] for w in windows if w["clients"] == 16), None)
                if mode == "late":
                    out["switch_latency_count"] = await self.metric("awm_claim_switch_seconds_count")
                # a release whose reset failed replaces its pod: none should here (the stub answers)
                out["instances_replaced"] = await self.metric("awm_instances_released_total", 'result="replaced"')
                result[mode] = out
                await self.k8s.delete(f"{API}/envfleets/bench")
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    r = await self.k8s.get(f"/api/v1/namespaces/{NS}/pods",
                                           params={"labelSelector": "awm.dev/fleet=bench", "limit": "1"})
                    if not r.json()["items"] and (await self.k8s.get(f"{API}/envfleets/bench")).status_code == 404:
                        break
                    await asyncio.sleep(0.5)
            result["per_environment_pods_for_the_paper_step"] = 526 * group
        finally:
            await stub.cleanup()
            await self.k8s.aclose()
        return result

    async def run(self) -> dict[str, Any]:
        self.stub = stub = StubPods()
        control_url = stub.url
        result: dict[str, Any] = {}
        try:
            fleet = {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": "bench"},
                     "spec": {"environments": [f"env{i}" for i in range(8)], "replicas": self.n, "catalog": {},
                              "binding": "pinned",
                              "database": {"secretName": "awm-db"},
                              "template": {"annotations": {"awm.dev/control-url": control_url}}}}
            cpu0 = self.cpu()
            t0 = time.monotonic()
            spy = self.spy("ramp", 30)
            (await self.k8s.post(f"{API}/envfleets", json=fleet)).raise_for_status()
            result["time_to_ready_s"] = round(await self.wait_ready(), 1)
            self.log(f"{self.n} ready in {result['time_to_ready_s']} s")
            cpu1 = self.cpu()
            result["cpu_s_during_ramp"] = {k: round(cpu1[k] - cpu0[k], 1) for k in cpu0}
            result["rss_mb"] = self.rss()
            result["etcd_db_mb_after_ramp"] = self.etcd_db_mb()
            await asyncio.sleep(max(0.0, 3 - (time.monotonic() - t0)))

            async with AllocationClient(self.api, NS, "bench") as alloc:
                for _ in range(20):  # warm-up: connections, first allocations
                    await alloc.release((await alloc.claim(1)).id)
                lat = []
                for _ in range(300):
                    t = time.perf_counter()
                    got = await alloc.claim(1)
                    lat.append((time.perf_counter() - t) * 1000)
                    await alloc.release(got.id)
                result["claim_p50_ms"], result["claim_p99_ms"] = pct(lat, 0.5), pct(lat, 0.99)
                self.log(f"claim p50 {result['claim_p50_ms']} ms, p99 {result['claim_p99_ms']} ms")

                grpo = []
                for _ in range(10):
                    t = time.perf_counter()
                    got = await alloc.claim(64, group_size=8)
                    grpo.append((time.perf_counter() - t) * 1000)
                    await alloc.release(got.id)
                result["grpo_claim_p50_ms"] = pct(grpo, 0.5)

            # The sustained load comes from a lean aiohttp client: the clients share the operator's
            # 2 cores here, and httpx's own CPU per request would be measured as much as the operator.
            base = f"{self.api}/v1/namespaces/{NS}/envfleets/bench/claims"
            async with aiohttp.ClientSession(headers=bearer()) as session:
                if spy is not None:
                    spy.wait()  # the ramp's profile is written before the sustained one starts
                windows = []
                for n, clients in enumerate(self.clients):
                    await self.sustained(session, base, clients, 2.0)  # warm-up: connections, batches in step
                    windows.append(await self.sustained(session, base, clients, 10.0, profile=n == 0))
                    self.log(f"{windows[-1]['claims_per_s']} claims/s sustained ({clients} clients, claim+release)")
                first = windows[0]
                result["claims_per_s"] = first["claims_per_s"]
                result["sustained_claim_p50_ms"], result["sustained_claim_p99_ms"] = first["p50_ms"], first["p99_ms"]
                result["ledger_writes_per_claim"] = first["ledger_writes_per_cycle"]
                result["cpu_s_during_sustained"] = first["cpu_s"]
                result["sustained_by_clients"] = windows
                if self.n > 64:
                    result.update(await self.full_fleet(session, base))

            result["baseline_pod_write_claims_per_s"] = await self.pod_write_baseline()
            self.log(f"baseline: {result['baseline_pod_write_claims_per_s']} claim+release cycles/s "
                     "when each costs one pod write each way")

            ec = await self.envclaim_latencies(40)
            result["envclaim_p50_ms"], result["envclaim_p99_ms"] = pct(ec, 0.5), pct(ec, 0.99)
            self.log(f"EnvClaim p50 {result['envclaim_p50_ms']} ms, p99 {result['envclaim_p99_ms']} ms")

            await self.wait_ready(120)
            r = await self.k8s.get(f"/api/v1/namespaces/{NS}/pods",
                                   params={"labelSelector": "awm.dev/fleet=bench", "limit": "100"})
            victims = [p["metadata"]["name"] for p in r.json()["items"]]
            t0 = time.monotonic()
            await asyncio.gather(*(self.k8s.delete(f"/api/v1/namespaces/{NS}/pods/{v}") for v in victims))
            await asyncio.sleep(0.5)
            result["recover_s"] = round(time.monotonic() - t0 + await self.wait_ready(300), 1)
            self.log(f"{len(victims)} pods deleted: back to {self.n} ready in {result['recover_s']} s")
            result["peak_rss_mb"] = self.rss("VmHWM")
        finally:
            await stub.cleanup()
            await self.k8s.aclose()
        return result


def database_shard(instances: int) -> Any:
    """A private embedded Postgres as the fleet's one database shard, sized like a production
    shard for the fleet (two connection slots per instance): the operator places pods only on a
    shard it can reach and that has room, so an unreachable DSN would create no pod at all."""
    import psycopg

    from awm.postgres.server import EmbeddedPostgres

    server = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="awm-fleet-bench-")) / "postgres")
    server.start()
    with psycopg.connect(server.admin_dsn(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET max_connections = {max(500, 2 * instances + 100)}")
    server.restart()
    return server


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--instances", type=int, default=1024)
    ap.add_argument("--nodes", type=int, default=None, help="kwok nodes of 512 pods (default: enough for the fleet)")
    ap.add_argument("--profile", metavar="PREFIX", help="py-spy the operator: PREFIX-ramp.txt, PREFIX-sustained.txt")
    ap.add_argument("--clients", default="16,32,64",
                    help="sustained claim loops to run, one 10 s window per count (the first is the headline)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--late", action="store_true",
                    help="late binding instead: a GRPO step (--step-groups x 16 over distinct environments) on a "
                         "late-binding fleet over --catalog-envs environments, against a per-environment fleet "
                         "of the step's environments (the stub answers /bind at once: the operator's side only; "
                         "bench/switch.py measures an env server's switch)")
    ap.add_argument("--catalog-envs", type=int, default=1000)
    ap.add_argument("--step-groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3, help="--late: GRPO steps per fleet and mode (with --profile: "
                                                           "at most those that fit the profile's 8 s)")
    args = ap.parse_args()
    log = (lambda msg: print(f"# {msg}", file=sys.stderr, flush=True))
    if not harness.binaries_present():
        sys.exit(f"missing Kubernetes binaries in {harness.default_bin_dir()}: run k8s/build.sh")
    load0 = os.getloadavg()
    nodes = args.nodes or nodes_for(args.instances)
    cp = harness.ControlPlane(nodes=nodes)
    kubeconfig = cp.start()
    operator = None
    shard = database_shard(args.instances)  # kwok pods never connect; the operator probes it to place them
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("---\n".join(render(c) for c in definitions()))
        cp.kubectl("apply", "--server-side", "-f", f.name)
        cp.kubectl("wait", "--for=condition=Established", "crd/envfleets.awm.dev", "crd/envclaims.awm.dev")
        cp.kubectl("create", "namespace", NS)
        cp.kubectl("-n", NS, "create", "secret", "generic", "awm-db", f"--from-literal=dsn={shard.admin_dsn()}")
        while cp.kubectl("-n", NS, "get", "serviceaccount", "default", check=False).returncode:
            time.sleep(0.2)
        # The clients authenticate as a trainer would (a ServiceAccount token, RBAC on envclaims):
        # the claim latencies include the operator's token and access reviews (cached).
        os.environ["AWM_API_TOKEN"] = client_token(cp)
        grant_claims(cp, NS, CLIENTS_NS, "trainer")
        port, metrics = harness.free_port(), harness.free_port()
        env = {**os.environ, "KUBECONFIG": kubeconfig, "AWM_NAMESPACES": NS, "AWM_HEALTH_PORT": str(port),
               "AWM_METRICS_PORT": str(metrics), "AWM_LOG_LEVEL": "warning",
               "AWM_ENDPOINT_ANNOTATIONS": "1", "AWM_DB_SWEEP_INTERVAL": "3600"}
        operator = subprocess.Popen([sys.executable, "-m", "awm_operator"], env=env, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or operator.poll() is not None:
                sys.exit("the operator did not start")
            time.sleep(0.2)
        bench = Bench(cp, args.instances, log)
        bench.profile = args.profile
        bench.clients = [int(c) for c in args.clients.split(",")]
        bench.steps = args.steps
        bench.api, bench.operator_pid = f"http://127.0.0.1:{port}", operator.pid
        bench.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        result = asyncio.run(bench.run_late(args.catalog_envs, args.step_groups, args.group_size) if args.late
                             else bench.run())
    finally:
        if operator is not None:
            operator.terminate()
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
        cp.stop()
        shard.stop()
        shutil.rmtree(shard.root.parent, ignore_errors=True)
    versions = harness.read_versions()
    targets = ({"step_bound_ms": 1000, "group_claim_p99_ms": 100, "claims_per_s_16_clients": 1000} if args.late else
               {"time_to_ready_s": 60, "claim_p50_ms": 50, "claim_p99_ms": 200, "claims_per_s": 100})
    out = {"instances": args.instances, **result, "targets": targets,
           "machine": {**machine(), "loadavg_before": [round(x, 2) for x in load0],
                       "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
           "control_plane": {"kubernetes": versions["K8S_VERSION"], "etcd": versions["ETCD_VERSION"],
                             "kwok": versions["KWOK_VERSION"], "nodes": nodes,
                             "pods_per_node": cp.node_pods}}
    print(json.dumps(out, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
