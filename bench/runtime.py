"""Runtime benchmark: reset, tool calls, episode overhead against the reference-style baseline,
memory per instance, and episode throughput with 16 concurrent instances.

    python -m bench.runtime [--quick] [--json] [--env bike_shop] [--database-url DSN]

Everything is measured in this run, on this machine, against the embedded Postgres (or the given
server). The baseline is what the reference system pays per episode: a database rebuilt from its
SQL, a fresh server process, a new MCP session, then the verification.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path
from typing import Any


from awm import catalog
from awm.bundle import EnvBundle
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.postgres import provision


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 3)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pss_mb(pid: int) -> float:
    """Proportional set size: shared pages (the interpreter, libraries) split among their users."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_ms(pid: int) -> tuple[float, float]:
    """CPU time of ``pid`` itself and of the children it has reaped, in ms (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) * tick, (int(fields[13]) + int(fields[14])) * tick


def tree_cpu_ms(pid: int) -> float:
    """CPU time of ``pid`` and every descendant, living or reaped, in ms."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            total += sum(cpu_ms(p))
        except OSError:
            pass  # ended between the listing and the read (its time is in its parent's)
    return total


async def episode_cpu(bundle: EnvBundle, handle, control: ControlClient, mcp: McpSession, n: int) -> dict[str, Any]:
    """CPU per episode (reset, the reference solution's calls, verify) one after another on one
    instance: the env server's own, and its descendants' (fork server, workers: forks included)."""
    tasks = [t for t in bundle.tasks if t.solution]
    server0, tree0, t0 = cpu_ms(handle.pid)[0], tree_cpu_ms(handle.pid), time.perf_counter()
    for i in range(n):
        task = tasks[i % len(tasks)]
        await control.reset(task.id)
        for step in task.solution:
            await mcp.call_tool(step.tool, step.arguments)
        await control.verify(task.final_answer)
    await asyncio.sleep(0.3)  # the last episode's worker replacements
    server = cpu_ms(handle.pid)[0] - server0
    return {"episode_wall_ms": round((time.perf_counter() - t0 - 0.3) * 1000 / n, 2),
            "episode_cpu_server_ms": round(server / n, 2),
            "episode_cpu_workers_ms": round((tree_cpu_ms(handle.pid) - tree0 - server) / n, 2)}


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (the fork server is a child of a pool thread; the workers and
    the spare are the fork server's children)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            todo += kids
    return found


def read_tool(bundle: EnvBundle) -> tuple[str, dict[str, Any]]:
    """A read-only tool call from the reference solutions (its first step is usually a lookup)."""
    for task in bundle.tasks:
        for step in task.solution:
            if step.tool.startswith(("get_", "list_", "search_", "find_")):
                return step.tool, step.arguments
    step = bundle.tasks[0].solution[0]
    return step.tool, step.arguments


async def measure_instance(bundle: EnvBundle, handle, n_resets: int, n_calls: int) -> dict[str, Any]:
    control = ControlClient(handle.control_url)
    tool, args = read_tool(bundle)
    writer = next(t for t in bundle.tasks if len(t.solution) >= 2)
    reset_ms, reset_http_ms, first_call_ms, pristine = [], [], [], True
    async with McpSession(handle.mcp_url) as mcp:
        for _ in range(n_resets):
            for i, step in enumerate(writer.solution):  # dirty the state the way an episode does
                t0 = time.perf_counter()
                await mcp.call_tool(step.tool, step.arguments)
                if i == 0:  # the episode's first call: on the worker the reset renewed
                    first_call_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            result = await control.reset(writer.id)
            reset_http_ms.append((time.perf_counter() - t0) * 1000)
            reset_ms.append(result["reset_ms"])
            pristine &= (await control.checksum())["pristine"]  # every measured reset is checked
        lean = []
        for _ in range(n_calls):
            t0 = time.perf_counter()
            out = await mcp.call_tool(tool, args)
            lean.append((time.perf_counter() - t0) * 1000)
            assert not out.is_error, out.text
        cpu = await episode_cpu(bundle, handle, control, mcp, 3 * n_resets)
        overhead = []
        for _ in range(max(20, n_resets // 5)):
            t0 = time.perf_counter()
            await control.reset(writer.id)
            await control.verify(writer.final_answer)
            overhead.append((time.perf_counter() - t0) * 1000)
    from fastmcp import Client

    sdk = []
    async with Client(handle.mcp_url) as client:
        for _ in range(max(50, n_calls // 4)):
            t0 = time.perf_counter()
            await client.call_tool(tool, args, raise_on_error=True)
            sdk.append((time.perf_counter() - t0) * 1000)
    await control.close()
    server_rss = rss_mb(handle.pid)
    workers = children(handle.pid)
    worker_rss = sum(rss_mb(c) for c in workers)
    server_pss, worker_pss = pss_mb(handle.pid), sum(pss_mb(c) for c in workers)
    return {
        "tool": tool,
        "reset_p50_ms": pct(reset_ms, 0.5), "reset_p99_ms": pct(reset_ms, 0.99),
        "reset_http_p50_ms": pct(reset_http_ms, 0.5), "reset_http_p99_ms": pct(reset_http_ms, 0.99),
        "reset_pristine": pristine, "resets_measured": len(reset_ms),
        "tool_call_p50_ms": pct(lean, 0.5), "tool_call_p99_ms": pct(lean, 0.99),
        "first_call_after_reset_p50_ms": pct(first_call_ms, 0.5),
        "first_call_after_reset_p99_ms": pct(first_call_ms, 0.99),
        "tool_call_fastmcp_client_p50_ms": pct(sdk, 0.5), "tool_call_fastmcp_client_p99_ms": pct(sdk, 0.99),
        "episode_overhead_p50_ms": pct(overhead, 0.5), **cpu,
        "rss_mb_per_instance": round(server_rss + worker_rss, 1),
        "rss_mb_server": round(server_rss, 1), "rss_mb_workers": round(worker_rss, 1),
        "pss_mb_per_instance": round(server_pss + worker_pss, 1), "pss_mb_server": round(server_pss, 1),
        "pss_mb_workers": round(worker_pss, 1), "workers": len(workers),
    }


# What each confinement layer costs: the same instance measured with layers switched off (weak
# isolation accepted for the measurement only). "none" is a worker process with no confinement.
LAYER_STEPS = [("none", ""), ("+namespaces+rlimits", "namespaces,rlimits"),
               ("+fsview", "namespaces,fsview,rlimits"), ("+landlock", "namespaces,fsview,rlimits,landlock"),
               ("+seccomp (all)", "namespaces,fsview,rlimits,landlock,seccomp")]


def zygote_start_ms(layers: str, n: int = 5) -> float:
    """Median time to a fork server's "ready" (imports, namespaces, the file view), and its first
    environment zygote's: paid once per env server start (and per environment served), never per
    episode."""
    from awm.sandbox.pool import make_zygote

    os.environ["AWM_SANDBOX_LAYERS"] = layers
    try:
        times = []
        for _ in range(n):
            zygote = make_zygote(False)
            t0 = time.perf_counter()
            with zygote._lock:  # the clean zygote and an environment zygote forked from it, each ready
                zygote._current()
            times.append((time.perf_counter() - t0) * 1000)
            zygote.close()
    finally:
        os.environ.pop("AWM_SANDBOX_LAYERS")
    return pct(times, 0.5)


async def layer_costs(bundle: EnvBundle, database: Database, n_calls: int) -> dict[str, Any]:
    tool, args = read_tool(bundle)
    writer = next(t for t in bundle.tasks if len(t.solution) >= 2)
    out: dict[str, Any] = {}
    for label, layers in LAYER_STEPS:
        os.environ["AWM_SANDBOX_LAYERS"] = layers
        os.environ["AWM_ALLOW_WEAK_ISOLATION"] = "1"
        try:
            fleet = LocalFleet([bundle], database=database, fleet_id="layers")
            await fleet.start()
        finally:
            os.environ.pop("AWM_SANDBOX_LAYERS")
            os.environ.pop("AWM_ALLOW_WEAK_ISOLATION")
        try:
            handle = fleet.instances[0]
            control = ControlClient(handle.control_url)
            calls, verifies = [], []
            async with McpSession(handle.mcp_url) as mcp:
                for _ in range(n_calls):
                    t0 = time.perf_counter()
                    await mcp.call_tool(tool, args)
                    calls.append((time.perf_counter() - t0) * 1000)
                for _ in range(max(20, n_calls // 10)):
                    await control.reset(writer.id)
                    verifies.append((await control.verify(writer.final_answer))["verify_ms"])
            await control.close()
            out[label] = {"tool_call_p50_ms": pct(calls, 0.5), "verify_p50_ms": pct(verifies, 0.5),
                          "worker_pss_mb": round(sum(pss_mb(c) for c in children(handle.pid)), 1),
                          "zygote_start_ms": zygote_start_ms(layers)}
        finally:
            await fleet.stop()
    return {"layers": out}


async def baseline(bundle: EnvBundle, database: Database, runs: int) -> dict[str, Any]:
    """Per episode: rebuild the database from SQL text, start a fresh server process, open a new
    MCP session, verify; then tear everything down (what the reference runtime does)."""
    import psycopg
    from psycopg import sql

    task = next(t for t in bundle.tasks if len(t.solution) >= 2)
    times = []
    for i in range(runs):
        name = f"awm_bench_baseline_{i}"
        t0 = time.perf_counter()

        def rebuild() -> provision.Instance:
            with psycopg.connect(database.admin_dsn, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
            with provision._admin(database.admin_dsn, name) as db:
                provision.load_snapshot(db, bundle)
            template = provision.Template(name, bundle.name, "")
            return provision.create_instance(database.admin_dsn, template, name + "_run")

        instance = await asyncio.to_thread(rebuild)
        fleet = LocalFleet([bundle], database=database, fleet_id=f"base{i}")
        handle_db = instance
        fleet._provision = lambda: [_handle(bundle, handle_db, fleet)]  # type: ignore[method-assign]
        await fleet.start()
        handle = fleet.instances[0]
        async with McpSession(handle.mcp_url):
            control = ControlClient(handle.control_url)
            await control.reset(task.id)
            await control.verify(task.final_answer)
            await control.close()
        times.append((time.perf_counter() - t0) * 1000)
        await fleet.stop()
        await asyncio.to_thread(provision.drop_instance, database.admin_dsn, name)
    return {"baseline_episode_overhead_p50_ms": pct(times, 0.5), "baseline_runs": runs}


def _handle(bundle: EnvBundle, instance: provision.Instance, fleet: LocalFleet):
    from awm.fleet import InstanceHandle

    path = fleet._workdir / f"{bundle.name}.json"
    path.write_text(bundle.model_dump_json())
    return InstanceHandle(bundle.name, instance.dbname, path, instance)


async def throughput(bundle: EnvBundle, database: Database, instances: int, seconds: float) -> dict[str, Any]:
    fleet = LocalFleet([bundle], replicas=instances, database=database, fleet_id="tput")
    t0 = time.perf_counter()
    await fleet.start()
    startup = time.perf_counter() - t0
    counts = [0] * instances
    tool_calls = [0] * instances
    deadline = time.perf_counter() + seconds

    async def worker(i: int, handle) -> None:
        control = ControlClient(handle.control_url)
        async with McpSession(handle.mcp_url) as mcp:
            while time.perf_counter() < deadline:
                task = bundle.tasks[counts[i] % len(bundle.tasks)]
                await control.reset(task.id)
                for step in task.solution:
                    await mcp.call_tool(step.tool, step.arguments)
                    tool_calls[i] += 1
                await control.verify(task.final_answer)
                counts[i] += 1
        await control.close()

    t1 = time.perf_counter()
    await asyncio.gather(*(worker(i, h) for i, h in enumerate(fleet.instances)))
    wall = time.perf_counter() - t1
    await fleet.stop()
    return {"episodes_per_s": round(sum(counts) / wall, 2), "concurrent_instances": instances,
            "tool_calls_per_s": round(sum(tool_calls) / wall, 1), "fleet_startup_s": round(startup, 2)}


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(Path("/proc/meminfo").read_text().split()[1]) / 1024 / 1024
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem, 1), "python": platform.python_version(),
            "kernel": platform.release()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bundle = catalog.load(args.catalog, [args.env])[0]
    database = await asyncio.to_thread(Database.open, args.database_url)
    n_resets, n_calls = (100, 300) if args.quick else (1000, 2000)
    try:
        fleet = LocalFleet([bundle], database=database, fleet_id="bench")
        await fleet.start()
        try:
            result = await measure_instance(bundle, fleet.instances[0], n_resets, n_calls)
        finally:
            await fleet.stop()
        result.update(await baseline(bundle, database, 3 if args.quick else 10))
        result["speedup"] = round(result["baseline_episode_overhead_p50_ms"] / result["episode_overhead_p50_ms"], 1)
        result.update(await throughput(bundle, database, 16, 5 if args.quick else 20))
        result.update(await layer_costs(bundle, database, 300 if args.quick else 1000))
        import psycopg
        with psycopg.connect(database.admin_dsn) as conn:
            pg_version = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        await asyncio.to_thread(database.close)
    result.update({"env": bundle.name, "quick": args.quick, "postgres": pg_version, "machine": machine()})
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer samples; finishes in under a minute")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--env", default="bike_shop")
    parser.add_argument("--catalog", default="starter")
    parser.add_argument("--database-url", default=os.environ.get("AWM_DATABASE_URL"))
    ns = parser.parse_args()
    t = time.perf_counter()
    out = asyncio.run(main(ns))
    out["bench_wall_s"] = round(time.perf_counter() - t, 1)
    if ns.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key:40} {value}")
