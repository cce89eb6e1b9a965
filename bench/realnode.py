"""Real-pod benchmark: env pods on a real kubelet node (k8s/node.py), the chart's images.

    sudo .venv/bin/python -m bench.realnode --json            # 1, 8, 32 and 64 env pods
    sudo .venv/bin/python -m bench.realnode --sizes 8 --json
    sudo .venv/bin/python -m bench.realnode --late --json   # 16 late-binding pods, 64 environments in turn

What it measures, each against a baseline taken in the same run:

* ``ready_p50_s`` / ``ready_p99_s`` per fleet size: an env pod first seen in the API until it is
  Ready (bundle init container, database clone, env server start, readiness probe), with images
  already on the node. Baseline: plain pods of the same image that only ``sleep``
  (``baseline_ready_*``): what the node itself costs per pod. Polled every 0.2 s.
* ``milestones_p50_s``: when (p50, seconds after first sighting) the pods were seen scheduled,
  with an IP, past each init container, with the env server running, started (past a startup probe
  if the pod has one) and Ready: where a start's time goes.
* ``pod_memory_mb_p50`` / ``_max``: each env pod's working set from the kubelet's summary API
  (the container cgroup), once the fleet is Ready and idle.
* ``pod_cpu_s_p50``, ``envserver_cpu_s_p50``, ``machine_cpu_s_per_pod``: where a start's CPU goes:
  a whole pod (init containers included), its env server alone, and everything the machine did
  from the fleet's creation to the last Ready (kubelet, containerd, API server, Postgres, ...) per pod,
  and that split by process, net of each one's idle CPU over as long a window
  (``cpu_s_per_pod_by_process``, from /proc: what to make cheaper).
* ``tool_call_p50_ms`` / ``_p99``, ``reset_p50_ms`` / ``_p99``: MCP tool calls and control-API
  resets from this host to a pod IP, through the CNI bridge. Baseline: the same calls to an env
  server running as a host process (awm.fleet.LocalFleet) on the same Postgres (``host_*``).

``--late``: a late-binding EnvFleet of ``--late-pods`` pods (provisioner sidecars) over
``--late-envs`` environments of the generated catalog (awm.synth.varied, in a catalog image built
here and cached): every environment in turn, ``--late-clients`` at a time, claim one instance
(the switch), replay a task through MCP, release, over two sets of ``--late-envs``
environments: first passes (templates made), a pass not told ahead whose environments some pod
keeps (the operator plans each claim onto it), a pass of switches to environments no pod keeps,
one of repeats (cached), one switched by the client, one in waves of ``--late-pods``
environments told to the operator ahead (``prepare``). Reports claim-to-connected p50/p99, the first tool call, episodes complete, instances replaced at release (a non-pristine reset), and each pod's memory with its
cached environments.

Needs root and what tests/test_realnode.py needs (images/build.py, k8s/build.sh, Debian packages).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


from awm import catalog
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from images import build as image_build
from k8s import chart, harness

NS = "awm"
API = f"/apis/awm.dev/v1alpha1/namespaces/{NS}"
ENVS = ["crm", "bike_shop"]
# Requests small enough for 64 env pods on one 2-CPU node (the chart's default, 100m, fits 16):
# what a dense fleet on small nodes would set in its template.
POD_RESOURCES = {"requests": {"cpu": "20m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(round(q * (len(s) - 1))))], 3)


def wait(what: str, ok, timeout: float = 600, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = ok()
        except Exception:
            got = None
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}")


MILESTONES = ("scheduled", "ip", "bundle_done", "provision_done", "server_running", "started", "ready")


def milestones(pod: dict[str, Any]) -> set[str]:
    """The start-up milestones a pod has passed: scheduled to the node, sandbox up (an IP), each
    init container done, the env server running, started (its startup probe, if any, passed), Ready."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    inits = {c["name"]: c for c in status.get("initContainerStatuses") or []}
    main = (status.get("containerStatuses") or [{}])[0]
    passed = {"scheduled": bool(spec.get("nodeName")), "ip": bool(status.get("podIP")),
              "bundle_done": "terminated" in (inits.get("bundle", {}).get("state") or {}),
              "provision_done": "terminated" in (inits.get("provision", {}).get("state") or {}),
              "server_running": "running" in (main.get("state") or {}), "started": bool(main.get("started")),
              "ready": any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])}
    return {m for m, ok in passed.items() if ok}


def ready_times(cp: Any, selector: str, n: int, timeout: float = 900,
                phases: dict[str, list[float]] | None = None) -> list[float]:
    """Seconds from a pod's first sighting to its Ready condition, for n pods matching selector;
    ``phases`` gets, per milestone, the seconds at which each pod was first seen past it."""
    seen: dict[str, float] = {}
    passed: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + timeout
    while sum("ready" in m for m in passed.values()) < n and time.monotonic() < deadline:
        now = time.monotonic()
        for p in cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")["items"]:
            name = p["metadata"]["name"]
            seen.setdefault(name, now)
            for m in milestones(p):
                passed.setdefault(name, {}).setdefault(m, now - seen[name])
        time.sleep(0.2)
    ready = [m["ready"] for m in passed.values() if "ready" in m]
    if len(ready) < n:
        raise TimeoutError(f"only {len(ready)} of {n} pods Ready ({selector})")
    if phases is not None:
        for m in MILESTONES:
            phases[m] = [p[m] for p in passed.values() if m in p]
    return ready


def gone(cp: Any, selector: str) -> bool:
    return not cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")["items"]


def baseline_pods(cp: Any, image: str, n: int) -> list[float]:
    name = f"sleepers-{n}"
    cp.api("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": n, "selector": {"matchLabels": {"bench": name}},
                 "template": {"metadata": {"labels": {"bench": name}}, "spec": {
                     "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "sleep", "image": image, "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"],
                                     "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}},
                                     "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}]}}}})
    times = ready_times(cp, f"bench={name}", n)
    cp.api("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/{name}", {"propagationPolicy": "Foreground"})
    wait("sleepers gone", lambda: gone(cp, f"bench={name}"))
    return times


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores; /proc/stat, not idle or iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


PYTHON_GROUPS = (("awm_operator", "operator"), ("envserver", "env server"), ("provision", "provision"),
                 ("-I -S", "sandbox worker"), ("bench/realnode", "this benchmark"))


def process_cpu() -> dict[tuple[int, str], tuple[str, float]]:
    """Every live process's CPU seconds, its own and its reaped children's (runc, CNI plugins,
    init containers are short-lived: they show up in their parent's children time, or in PID 1's
    when orphaned), keyed by (pid, start time) and named by its program (a Python program by
    its module or script)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
        program = Path(argv[0]).name if argv[0] else stat[stat.index("(") + 1:stat.rindex(")")]
        if program.startswith("python"):
            args = " ".join(argv[1:3])
            program = next((g for key, g in PYTHON_GROUPS if key in args), "python (other)")
        elif program.startswith(("containerd-shim", "postgres")):  # postgres retitles its backends
            program = program.split(":")[0].split("-runc")[0]
        out[(int(d.name), fields[19])] = (program, cpu)
    return out


def cpu_by_group(before: dict[tuple[int, str], tuple[str, float]],
                 after: dict[tuple[int, str], tuple[str, float]]) -> dict[str, float]:
    groups: dict[str, float] = {}
    for key, (group, cpu) in after.items():
        groups[group] = groups.get(group, 0.0) + cpu - before.get(key, (group, 0.0))[1]
    return groups


def idle_rates(seconds: float = 5.0) -> tuple[dict[str, float], float]:
    """CPU seconds per second by process group, and the machine's, while nothing is asked of the
    cluster (leases, probes, the operator's resyncs): what a start's window is charged for anyway."""
    procs, busy, t = process_cpu(), busy_cpu_s(), time.monotonic()
    time.sleep(seconds)
    dt = time.monotonic() - t
    return {g: v / dt for g, v in cpu_by_group(procs, process_cpu()).items()}, (busy_cpu_s() - busy) / dt


def cpu_by_process(before: dict[tuple[int, str], tuple[str, float]], window_s: float, machine_s: float,
                   idle: tuple[dict[str, float], float], n: int) -> dict[str, float]:
    """CPU seconds per pod by process group between two ``process_cpu`` samples, net of what the
    group spends idle in as long a window; what exited in between without a surviving parent
    counting it is the rest ("unaccounted")."""
    rates, machine_rate = idle
    groups = cpu_by_group(before, process_cpu())
    net = {g: (v - rates.get(g, 0.0) * window_s) / n for g, v in groups.items()}
    top = dict(sorted(((g, round(v, 3)) for g, v in net.items() if v >= 0.005), key=lambda kv: -kv[1]))
    top["unaccounted"] = round((machine_s - machine_rate * window_s) / n - sum(top.values()), 3)
    return top


def env_fleet(cp: Any, n: int) -> tuple[list[float], list[float], dict[str, float]]:
    """(ready seconds, working-set MB, CPU seconds) of an n-pod EnvFleet. CPU: per pod, from the
    kubelet's summary API (the pod cgroup, which still counts its finished init containers) and its
    env-server container alone; the machine's busy CPU from the fleet's creation to the last Ready."""
    name = f"bench-{n}"
    idle = idle_rates()
    cpu0, procs0, t0 = busy_cpu_s(), process_cpu(), time.monotonic()
    cp.api("POST", f"{API}/envfleets", {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": name},
                                        "spec": {"environments": ENVS, "replicas": n, "catalog": {}, "binding": "pinned",
                                                 "database": {"secretName": "awm-database"},
                                                 "template": {"resources": POD_RESOURCES}}})
    phases: dict[str, list[float]] = {}
    times = ready_times(cp, f"awm.dev/fleet={name}", n, phases=phases)
    machine_cpu = busy_cpu_s() - cpu0
    by_process = cpu_by_process(procs0, time.monotonic() - t0, machine_cpu, idle, n)
    # A slow start with restarts is a failure retried, not a slow start: say so.
    restarts = sum(c.get("restartCount", 0) for p in cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=awm.dev/fleet={name}")["items"]
                   for c in [*(p["status"].get("initContainerStatuses") or []), *(p["status"].get("containerStatuses") or [])])
    time.sleep(5)  # idle: let start-up garbage settle before reading memory

    def pod_stats() -> list[dict[str, Any]] | None:
        """Every pod's summary once the kubelet's housekeeping has filled in its pod-level cgroup."""
        summary = cp.api("GET", f"/api/v1/nodes/{cp.node.name}/proxy/stats/summary")
        found = [p for p in summary["pods"] if p["podRef"]["namespace"] == NS and p["podRef"]["name"].startswith(f"{name}-")]
        full = len(found) == n and all(p.get("memory", {}).get("workingSetBytes") and
                                      p.get("cpu", {}).get("usageCoreNanoSeconds") for p in found)
        return found if full else None

    pods = wait("pod stats", pod_stats, timeout=60, interval=2)
    mem = [p["memory"]["workingSetBytes"] / 1e6 for p in pods]
    pod_cpu = [p["cpu"]["usageCoreNanoSeconds"] / 1e9 for p in pods if "cpu" in p]
    server_cpu = [c["cpu"]["usageCoreNanoSeconds"] / 1e9 for p in pods for c in p.get("containers", [])
                  if c["name"] == "envserver" and "cpu" in c]
    cpu = {"pod_cpu_s_p50": pct(pod_cpu, 0.5) if pod_cpu else None,
           "envserver_cpu_s_p50": pct(server_cpu, 0.5) if server_cpu else None,
           "machine_cpu_s_per_pod": round(machine_cpu / n, 2),
           "cpu_s_per_pod_by_process": by_process, "container_restarts": restarts,
           "milestones_p50_s": {m: pct(v, 0.5) for m, v in phases.items() if v}}
    return times, mem, cpu


def delete_fleet(cp: Any, n: int) -> None:
    name = f"bench-{n}"
    cp.api("DELETE", f"{API}/envfleets/{name}")
    wait("fleet gone", lambda: gone(cp, f"awm.dev/fleet={name}"))


async def call_latency(mcp_url: str, control_url: str, calls: int, resets: int) -> dict[str, float]:
    control = ControlClient(control_url)
    tool_ms, reset_ms = [], []
    try:
        async with McpSession(mcp_url) as mcp:
            await mcp.call_tool("search_accounts", {"limit": 5})  # warm
            for _ in range(calls):
                t0 = time.perf_counter()
                out = await mcp.call_tool("search_accounts", {"limit": 5})
                tool_ms.append((time.perf_counter() - t0) * 1000)
                assert not out.is_error, out.text
        for _ in range(resets):
            t0 = time.perf_counter()
            await control.reset()
            reset_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        await control.close()
    return {"tool_call_p50_ms": pct(tool_ms, 0.5), "tool_call_p99_ms": pct(tool_ms, 0.99),
            "reset_p50_ms": pct(reset_ms, 0.5), "reset_p99_ms": pct(reset_ms, 0.99)}


def admin_dsn_via_service(cp: Any) -> str:
    """The chart's admin DSN with the Service's ClusterIP for its host name (kube-proxy routes
    ClusterIPs from this host too), for the host-process baseline."""
    secret = cp.api("GET", f"/api/v1/namespaces/{NS}/secrets/awm-database")
    dsn = base64.b64decode(secret["data"]["dsn"]).decode()
    svc = cp.api("GET", f"/api/v1/namespaces/{NS}/services/awm-postgres")
    return dsn.replace(f"awm-postgres.{NS}.svc", svc["spec"]["clusterIP"])


async def host_latency(dsn: str, calls: int, resets: int) -> dict[str, float]:
    bundle = catalog.load(None, ["crm"])[0]
    fleet = LocalFleet([bundle], replicas=1, database=Database(dsn))
    await fleet.start()
    try:
        inst = fleet.instances[0]
        return await call_latency(inst.mcp_url, inst.control_url, calls, resets)
    finally:
        await fleet.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--resets", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--late", action="store_true",
                    help="instead: a late-binding fleet of --late-pods pods serving --late-envs environments of the "
                         "generated catalog in turn (switch, episode, release), and its pods' memory")
    ap.add_argument("--late-pods", type=int, default=16)
    ap.add_argument("--late-envs", type=int, default=64)
    ap.add_argument("--late-clients", type=int, default=8, help="episodes at once")
    ap.add_argument("--late-cache-envs", type=int, default=None,
                    help="the fleet's cacheEnvironments (default: --late-envs / --late-pods, so that each pass over "
                         "one set of environments evicts the other from the pods' caches)")
    ap.add_argument("--late-spares", type=int, default=None,
                    help="the fleet's spareDatabases (default: the EnvFleet's); 0 for the baseline without spares, "
                         "2 x --late-envs to keep a spare of every environment of both sets")
    ap.add_argument("--helm-set", action="append", default=[], metavar="KEY=VALUE",
                    help="more chart values for the install (repeatable), e.g. "
                         "'postgres.extraArgs={-c,shared_buffers=1GB}'")
    a = ap.parse_args()
    # SIGTERM (a timeout, a Ctrl-C from a runner) must still stop the node and restore the host
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    builder = image_build.Builder(quiet=True)
    images = {b.name: b for b in builder.build(list(chart.COMPONENTS))}
    cp = harness.ControlPlane(nodes=0, real_node=True)
    out: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "kernel": platform.release(),
                                       "python": platform.python_version(), "load_before": os.getloadavg()[0]}}
    t0 = time.monotonic()
    cp.start(tempfile.mkdtemp(prefix="awm-bench-real-"))
    try:
        out["node_ready_s"] = round(cp.timings["real_node_ready"], 2)
        loads = cp.node.load_images([images[n].archive for n in chart.COMPONENTS])
        out["image_import_s"] = {Path(k).name.split("-")[0]: round(v, 1) for k, v in loads.items()}
        out["image_mb"] = {n: round(images[n].size_bytes / 1e6) for n in chart.COMPONENTS}
        t1 = time.monotonic()
        r = chart.helm_install(cp, {n: b.ref for n, b in images.items()}, release="awm", namespace=NS,
                               sets=tuple(a.helm_set))
        out["helm_sets"] = a.helm_set
        if r.returncode != 0:
            raise RuntimeError(f"helm install: {r.stderr}")
        out["helm_install_s"] = round(time.monotonic() - t1, 1)
        if a.late:
            out["late"] = late_fleet(cp, builder, a.late_pods, a.late_envs, a.late_clients, a.late_cache_envs,
                                     a.late_spares)
            return 0
        sizes = {}
        for n in a.sizes:
            base = baseline_pods(cp, images["envserver"].ref, n)
            times, mem, cpu = env_fleet(cp, n)
            if n == a.sizes[0]:
                pod = next(p for p in cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=awm.dev/fleet=bench-{n}")["items"]
                           if p["metadata"]["annotations"]["awm.dev/environment"] == "crm")
                ip = pod["status"]["podIP"]
                out["pod_network"] = asyncio.run(call_latency(f"http://{ip}:8000/mcp", f"http://{ip}:8001", a.calls, a.resets))
            delete_fleet(cp, n)
            sizes[str(n)] = {"ready_p50_s": pct(times, 0.5), "ready_p99_s": pct(times, 0.99),
                             "baseline_ready_p50_s": pct(base, 0.5), "baseline_ready_p99_s": pct(base, 0.99),
                             "pod_memory_mb_p50": round(statistics.median(mem), 1) if mem else None,
                             "pod_memory_mb_max": round(max(mem), 1) if mem else None,
                             **cpu, "load": os.getloadavg()[0]}
            print(json.dumps({"size": n, **sizes[str(n)]}), file=sys.stderr, flush=True)  # partial results
        out["sizes"] = sizes
        out["host_process"] = asyncio.run(host_latency(admin_dsn_via_service(cp), a.calls, a.resets))
    finally:
        cp.stop()
        out["wall_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(out, indent=None if a.json else 1))
    return 0


# --------------------------------------------------------------------------- late binding (--late)

LATE_RESOURCES = {"requests": {"cpu": "20m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}


def varied_catalog_image(builder: Any, count: int) -> tuple[str, str, list[str]]:
    """A catalog image of ``count`` environments of the generated 1,000-environment catalog
    (awm.synth.varied; every (1000 / count)-th, so small, medium and large ones and every theme):
    busybox with ``/catalog/<env>.json``, as images/catalog/Dockerfile lays it out. Cached by the
    bundles' content beside the other images. -> (ref, archive, environments)."""
    import hashlib
    import shutil

    from awm.synth import varied

    src = varied.cached_catalog(1000, 0)
    every = sorted(p.stem for p in src.glob("*.json") if not p.name.startswith("."))
    names = every[:: max(1, len(every) // count)][:count]
    h = hashlib.sha256()
    for n in names:
        h.update(n.encode() + b"\0" + (src / f"{n}.json").read_bytes())
    key = h.hexdigest()[:16]
    built = builder._cached("catalog-varied", key)  # the image builder's own cache and records
    if built is None:
        t0, ref = time.monotonic(), f"localhost/awm-catalog-varied:{key}"
        busybox = builder.busybox()
        with tempfile.TemporaryDirectory() as d:
            for n in names:
                shutil.copy(src / f"{n}.json", Path(d) / f"{n}.json")
                os.chmod(Path(d) / f"{n}.json", 0o644)
            os.chmod(d, 0o755)
            c = builder.buildah("from", "--pull=never", busybox.ref)
            try:
                builder.buildah("copy", c, d, "/catalog")
                builder.buildah("config", "--user", "65534:65534", "--entrypoint", '["ls", "/catalog"]', c)
                builder.buildah("commit", "--quiet", c, ref)
            finally:
                builder.buildah("rm", c)
        built = builder._save("catalog-varied", key, ref, time.monotonic() - t0)
    return built.ref, built.archive, names


async def late_rounds(operator_url: str, fleet: str, envs: list[str], bundles: dict[str, Any], clients: int,
                      switch: str | None, prepare_waves: int = 0) -> dict[str, Any]:
    """Every environment once, ``clients`` at a time: claim one instance of it (the switch), replay
    its first task's reference solution through MCP, release (the operator's reset with verify).
    -> claim latencies, verdicts, instances replaced at release (a non-pristine reset).

    ``prepare_waves``: the environments in waves of that many, each wave told to the operator
    first (``prepare``, waited for: what a trainer does for its next groups while the current
    ones run) and then claimed: -> also what the preparations cost and whether each claim landed
    on the pod that made its environment ready."""
    from awm.episode.allocation import AllocationClient
    from awm.episode.sources import Lease
    from awm.gates import replay

    todo: list[str] = []
    claim_ms: list[float] = []
    answer_ms: list[float] = []  # the allocation API's answer alone (the rest: the MCP session's set-up)
    made_for: dict[str, str] = {}  # env -> the pod told to make it ready
    landed = 0
    preparations: list[dict[str, Any]] = []
    first_call_ms: list[float] = []
    verdicts: dict[str, str] = {}
    phases: list[dict[str, float]] = []
    replaced = 0

    async def worker(alloc: AllocationClient) -> None:
        nonlocal replaced, landed
        while todo:
            env = todo.pop(0)
            t0 = time.perf_counter()
            got = await alloc.claim(count=1, environment=env, wait_seconds=300, switch=switch or "operator")
            answer_ms.append((time.perf_counter() - t0) * 1000)
            (inst,) = got.instances
            landed += made_for.get(env) == inst.pod
            lease = Lease(env, inst.pod, inst.mcp_url or "", inst.control_url or "", unswitched=inst.switched is False)
            try:
                handle = await lease.connect()  # switches it first when the operator left that to us
                claim_ms.append((time.perf_counter() - t0) * 1000)
                if lease.switched:  # where the pod's switch went (the env server's own account)
                    phases.append({"bind_ms": lease.switched.get("bind_ms", 0.0), **(lease.switched.get("phases_ms") or {})})
                report = await replay(env, bundles[env].tasks[0], handle.mcp, handle.control)
                verdicts[env] = report.verdict
                if report.tool_ms:
                    first_call_ms.append(report.tool_ms[0])
            finally:
                await lease.disconnect()
                released = await alloc.release(got.id)
                replaced += released.replaced

    async with AllocationClient(operator_url, NS, fleet) as alloc:
        t0 = time.perf_counter()
        for start in range(0, len(envs), prepare_waves or len(envs)):
            wave = envs[start:start + (prepare_waves or len(envs))]
            if prepare_waves:
                for _ in range(100):  # the last release's ledger write frees its pod just after the answer
                    if (await alloc.fleet())["ready"] >= len(wave):
                        break
                    await asyncio.sleep(0.05)
                t1 = time.perf_counter()
                made = await alloc.prepare({e: 1 for e in wave}, wait=True)
                made_for.update({env: pod for pod, env in made.pods.items()})
                preparations.append({**made.model_dump(include={"asked", "chosen", "prepared", "cached", "failed"}),
                                     "ms": round((time.perf_counter() - t1) * 1000, 1)})
            todo.extend(wave)
            await asyncio.gather(*(worker(alloc) for _ in range(clients)))
        wall = time.perf_counter() - t0
    waves = {}
    if prepare_waves:
        waves = {"prepare_waves": preparations, "landed_on_prepared_pod": landed,
                 "prepare_wave_ms_p50": pct([w["ms"] for w in preparations], 0.5)}
    return {**waves, "episodes": len(verdicts), "complete": sum(v == "complete" for v in verdicts.values()),
            "claim_answer_p50_ms": pct(answer_ms, 0.5),
            "not_complete": {e: v for e, v in verdicts.items() if v != "complete"},
            "claim_to_connected_p50_ms": pct(claim_ms, 0.5), "claim_to_connected_p99_ms": pct(claim_ms, 0.99),
            "first_call_p50_ms": pct(first_call_ms, 0.5), "replaced_at_release": replaced,
            "switch_phases_p50_ms": {k: pct([p[k] for p in phases if k in p], 0.5)
                                     for k in sorted({k for p in phases for k in p})},
            "wall_s": round(wall, 1)}


def bind_kinds(ips: list[str]) -> dict[str, float]:
    """Switches so far over the pods, by kind (awm_binds_total: new, cached, failed), and the
    databases they got by source (awm_databases_acquired_total: ``database_clone``, ``_ready``,
    ``_spare``), from each env server's own metrics: whether a pass switched to new databases or
    reset cached ones, and where the new ones came from."""
    import re
    import urllib.request

    kinds: dict[str, float] = {}
    for ip in ips:
        with urllib.request.urlopen(f"http://{ip}:8001/metrics", timeout=10) as r:
            text = r.read().decode()
        for m in re.finditer(r'^awm_binds_total\{kind="(\w+)"\} ([0-9.e+]+)$', text, re.M):
            kinds[m[1]] = kinds.get(m[1], 0) + float(m[2])
        for m in re.finditer(r'^awm_databases_acquired_total\{source="(\w+)"\} ([0-9.e+]+)$', text, re.M):
            kinds[f"database_{m[1]}"] = kinds.get(f"database_{m[1]}", 0) + float(m[2])
    return kinds


async def _info(control_url: str) -> dict[str, Any]:
    control = ControlClient(control_url)
    try:
        return await control.info()
    finally:
        await control.close()


def late_fleet(cp: Any, builder: Any, pods: int, count: int, clients: int, cache_envs: int | None = None,
               spares: int | None = None) -> dict[str, Any]:
    """binding: late on the real node: ``pods`` env pods serving two sets of ``count``
    environments of the generated catalog in turn: the environments' first use on the cluster
    (their templates are made), claims not told ahead of environments some pod keeps, switches to
    databases new to the pod, repeats of kept ones, switches made by the client (``"switch":
    "client"``) and claims told ahead; every episode replays a task to complete and every release
    must reset pristine. Then each pod's memory with its cached environments. ``cache_envs``
    (the fleet's cacheEnvironments): ``count / pods`` by default, so that a pass over one set
    evicts the other. ``spares``: the fleet's spareDatabases (None: the EnvFleet's default); a
    switch to an environment with a spare on the shard takes it instead of cloning."""
    cache_envs = cache_envs or max(1, count // pods)
    from awm import catalog as awm_catalog
    from tests.k8s_e2e import CLIENTS_NS, client_token, grant_claims

    ref, archive, names = varied_catalog_image(builder, 2 * count)
    cp.node.load_images([archive])
    from awm.synth import varied

    src = varied.cached_catalog(1000, 0)
    bundles = {n: awm_catalog.find(src, n) for n in names}
    os.environ["AWM_API_TOKEN"] = client_token(cp)
    grant_claims(cp, NS, CLIENTS_NS, "trainer")
    svc = cp.api("GET", f"/api/v1/namespaces/{NS}/services/awm-operator")
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] in ("api", "http"))
    operator_url = f"http://{svc['spec']['clusterIP']}:{port}"
    name = "late"
    t0 = time.monotonic()
    cp.api("POST", f"{API}/envfleets", {"apiVersion": "awm.dev/v1alpha1", "kind": "EnvFleet", "metadata": {"name": name},
                                        "spec": {"environments": names, "replicas": pods, "binding": "late",
                                                 "cacheEnvironments": cache_envs,
                                                 **({"spareDatabases": spares} if spares is not None else {}),
                                                 "catalog": {"image": ref, "path": "/catalog"},
                                                 "serving": {"allowUngated": True},
                                                 "database": {"secretName": "awm-database"},
                                                 "template": {"resources": LATE_RESOURCES}}})
    ready_times(cp, f"awm.dev/fleet={name}", pods)
    out: dict[str, Any] = {"pods": pods, "environments": count, "cache_environments": cache_envs,
                           "spare_databases": spares, "ready_s": round(time.monotonic() - t0, 1)}
    ips = [p["status"]["podIP"] for p in cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=awm.dev/fleet={name}")["items"]]
    # Two sets of ``count`` environments, A and B. Claims are planned "pods that serve it first,
    # then pods that keep it cached, then any others", and the pods keep ``cache_envs`` each, so
    # with pods x cache_envs = count a pass over one set evicts the other from every cache. Each
    # pass's order is rotated from the last one over its set (no claim lands on the pod that
    # serves it by the order alone); awm_binds_total says what each pass's binds were: "new"
    # (a new database) or "cached" (a reset of a kept one).
    a, b = names[:count], names[count:]

    def rot(envs: list[str], k: int) -> list[str]:
        return envs[k:] + envs[:k]

    # (label, environments in claim order, who switches, waves told to the operator ahead)
    passes = (("first_use", a, None, 0),                 # A's templates are made on the shard
              ("first_use_b", b, None, 0),               # B's; the pods now keep B
              ("held", rot(b, 1), None, 0),              # not told ahead: each lands on a pod that keeps it
              ("switch", rot(a, 1), None, 0),            # no pod keeps A any more: new databases
              ("repeat", rot(a, 2), None, 0),            # A again: kept
              ("client_switch", rot(b, 2), "client", 0),  # B, evicted by A, switched by the client
              ("prepared", rot(a, 3), "client", pods))    # A, evicted by B: told ahead in waves of ``pods``
    for label, order, switch, waves in passes:
        before = bind_kinds(ips)
        out[label] = asyncio.run(late_rounds(operator_url, name, order, bundles, clients, switch, waves))
        after = bind_kinds(ips)
        out[label]["binds_by_kind"] = {k: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}
        print(json.dumps({label: out[label]}), file=sys.stderr, flush=True)
    time.sleep(5)
    summary = cp.api("GET", f"/api/v1/nodes/{cp.node.name}/proxy/stats/summary")
    mem = [p["memory"]["workingSetBytes"] / 1e6 for p in summary["pods"]
           if p["podRef"]["namespace"] == NS and p["podRef"]["name"].startswith(f"{name}-")
           and p.get("memory", {}).get("workingSetBytes")]
    out["pod_memory_mb_p50"] = round(statistics.median(mem), 1) if mem else None
    out["pod_memory_mb_max"] = round(max(mem), 1) if mem else None
    listed = cp.api("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=awm.dev/fleet={name}")["items"]
    out["cached_envs_per_pod"] = [len((asyncio.run(_info(f"http://{p['status']['podIP']}:8001"))).get("cached_envs") or [])
                                  for p in listed]
    out["container_restarts"] = sum(c.get("restartCount", 0) for p in listed for c in
                                    [*(p["status"].get("initContainerStatuses") or []),
                                     *(p["status"].get("containerStatuses") or [])])
    cp.api("DELETE", f"{API}/envfleets/{name}")
    wait("late fleet gone", lambda: gone(cp, f"awm.dev/fleet={name}"))
    return out


if __name__ == "__main__":
    sys.exit(main())
