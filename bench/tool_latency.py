"""Tool-call latency, its tail, and memory per instance, on AWM-1K-imported environments and the
starter catalog, at one session and under load; against a reference-style baseline in the same run.

    python -m bench.tool_latency [--quick] [--json] [--sessions 1,8] [--episodes 40]
                                 [--catalogs awm1k,starter] [--no-baseline] [--database-url DSN]
                                 [--awm1k-catalog DIR]   # an import made before, for alternated runs

What it does, per catalog and per number of concurrent sessions:

* a real local fleet (:class:`awm.fleet.LocalFleet`, late binding as ``awm serve``, tasks served
  ungated as with ``--allow-ungated``) of as many instances as sessions, environments in turn, on
  the embedded PostgreSQL (or ``--database-url``); the AWM-1K catalog is
  ``tests/fixtures/awm1k`` imported here by :func:`awm.importers.awm1k.import_awm_dir`;
* one :class:`awm.episode.session.EpisodeSession` per instance (the real MCP client and control
  API, as every driver of an episode uses them) running episodes back to back: reset, 3-10 tool
  calls drawn from the environment's calibrated calls, verify; no think time, so that N sessions
  on this machine's cores are N sessions' worth of load. One episode per session warms it up and
  is not counted;
* latency at the client: every call (p50/p90/p99/max), the *first* call of each episode apart
  from the others (the call a fresh worker serves), reset and verify; episodes and calls per
  second; CPU per call of every process involved (env servers, fork servers, workers, the
  instances' Postgres backends, read from ``/proc``);
* memory: PSS (``/proc/<pid>/smaps_rollup``) of every process of each instance after the run:
  env server, fork server(s), workers (tool workers, the spare, the verifier's), and the
  instance's Postgres backend; per instance and per role.

Calls are calibrated first: the tool calls of the tasks' reference solutions and of each tool's
schema examples, each tried once after a reset; those the server answers as the agent's or the
environment's fault before any code runs (``invalid_arguments``, ``unavailable``) are dropped, so
that every measured call reaches a worker (a ``tool_error`` from the app does).

The baseline (AWM-1K only; ``--no-baseline`` skips it) is what OpenEnv's AWM server does per
session: one Python process per session running the environment's FastAPI app under uvicorn on a
SQLite file (the AWM release's own way: ``DATABASE_PATH``), reset by copying the snapshot's file
back, tool calls as HTTP requests straight to the app's routes, the code verifier run in that
process. No MCP layer and no isolation: a lower bound of OpenEnv's path.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from awm import catalog
from awm.bundle import EnvBundle
from awm.episode.session import EnvHandle, EpisodeSession
from awm.fleet import Database, LocalFleet
from bench.runtime import children, machine, pct, pss_mb

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "awm1k"
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
REJECTED = ("invalid_arguments", "unavailable", "unknown")  # answered without running code


def stats(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": pct(values, 0.5), "p90_ms": pct(values, 0.9), "p99_ms": pct(values, 0.99),
            "max_ms": round(max(values), 3) if values else None}


def proc_cpu_ms(pid: int, own: bool = True, reaped: bool = True) -> float:
    """CPU of ``pid`` itself (``own``) and of the children it has reaped (``reaped``: a fork server
    reaps its workers), in ms."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12) * own + (13, 14) * reaped) * TICK_MS


# -- calls ---------------------------------------------------------------------------------------


def candidate_calls(bundle: EnvBundle) -> list[tuple[str, dict[str, Any]]]:
    """Calls to draw episodes from: the reference solutions' steps and each tool's schema examples
    (the required arguments alone, and every argument that has an example)."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}

    def add(name: str, args: dict[str, Any]) -> None:
        found.setdefault(json.dumps([name, args], sort_keys=True), (name, args))

    for task in bundle.tasks:
        for step in task.solution:
            add(step.tool, dict(step.arguments))
    for tool in bundle.tools:
        props = tool.input_schema.get("properties") or {}
        examples = {k: v["examples"][0] for k, v in props.items() if isinstance(v, dict) and v.get("examples")}
        required = tool.input_schema.get("required") or []
        if all(k in examples for k in required):
            add(tool.name, {k: examples[k] for k in required})
            add(tool.name, examples)
    return list(found.values())


def code_tasks(bundle: EnvBundle) -> list[str]:
    """Tasks an instance serves without an LLM judge."""
    return [t.id for t in bundle.tasks if t.verifier.kind == "code"]


async def calibrate(handle: Any, bundle: EnvBundle) -> list[tuple[str, dict[str, Any]]]:
    env = await EnvHandle.connect(handle.mcp_url, handle.control_url)
    session = EpisodeSession(env)
    kept = []
    try:
        for name, args in candidate_calls(bundle):
            await session.reset(code_tasks(bundle)[0])
            out = await session.call_tool(name, args)
            if out.error_kind not in REJECTED:
                kept.append((name, args))
        await session.finish(None)
    finally:
        await env.close()
    if not kept:
        raise RuntimeError(f"{bundle.name}: no tool call of its solutions or examples reaches a worker")
    return kept


async def settle(warm: list[int], drivers: list[asyncio.Task[None]]) -> None:
    """Until every session has run its warm-up episode, and then what it set off in the background."""
    while len(warm) < len(drivers):
        for task in drivers:
            if task.done():
                task.result()  # a driver that failed: raise its error now
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)


# -- one run of awm --------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.first: list[float] = []
        self.other: list[float] = []
        self.reset: list[float] = []
        self.verify: list[float] = []
        self.errors: dict[str, int] = {}
        self.infra: list[str] = []  # episodes the environment failed (not measured)
        self.episodes = 0

    def call(self, index: int, ms: float, kind: str | None) -> None:
        (self.first if index == 0 else self.other).append(ms)
        if kind:
            kind = str(getattr(kind, "value", kind))
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def summary(self, wall_s: float) -> dict[str, Any]:
        calls = self.first + self.other
        return {"calls": stats(calls), "first_call": stats(self.first), "other_calls": stats(self.other),
                "reset": stats(self.reset), "verify": stats(self.verify), "episodes": self.episodes,
                "episodes_per_s": round(self.episodes / wall_s, 2), "calls_per_s": round(len(calls) / wall_s, 1),
                "call_errors": self.errors, "infra_errors": self.infra}


async def drive_awm(handle: Any, bundle: EnvBundle, calls: list[tuple[str, dict[str, Any]]], episodes: int,
                    rng: random.Random, rec: Recorder, start: asyncio.Event, warm: list[int]) -> None:
    env = await EnvHandle.connect(handle.mcp_url, handle.control_url)
    session = EpisodeSession(env)
    tasks = code_tasks(bundle)
    try:
        for e in range(episodes + 1):
            if e == 1:
                warm.append(1)
                await start.wait()
            measured = e >= 1
            await session.reset(tasks[e % len(tasks)])
            for i in range(rng.randint(3, 10)):
                name, args = rng.choice(calls)
                out = await session.call_tool(name, args)
                if measured:
                    rec.call(i, out.ms, out.error_kind)
            await session.finish("done")
            if session.outcome is not None and session.outcome.infra_error:
                # e.g. a kept-alive connection the server closed (idle over 5 s on an overloaded
                # machine): counted, and the next request connects again
                rec.infra.append(f"{handle.name}: {session.outcome.infra_error}"[:300])
                if len(rec.infra) > 20:
                    raise RuntimeError("; ".join(rec.infra[-3:]))
                continue
            if measured:
                rec.reset.append(session.timings["reset_ms"])
                rec.verify.append(session.timings["verify_ms"])
                rec.episodes += 1
    finally:
        await env.close()


def backends(admin_dsn: str, fleet: LocalFleet) -> dict[str, int]:
    """Each instance's Postgres backend (the instance role holds one connection)."""
    import psycopg

    roles = {}
    for handle in fleet.instances:
        try:
            roles[handle.db.role] = handle.name
        except Exception:  # noqa: BLE001 - an instance between databases: no backend to count
            pass
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT usename, pid FROM pg_stat_activity WHERE usename = ANY(%s)",
                            [list(roles)]).fetchall()
    return {roles[role]: pid for role, pid in rows}


def _kids(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def fleet_roles(fleet: LocalFleet, pg_backends: dict[str, int]) -> dict[str, list[int]]:
    """Every process of the fleet's instances, by role: env servers; fork servers (the env
    servers' children, or the zygotes the fleet's template forked for them, and the template
    itself: a fleet without apps has none); their workers (tool workers, the spare, verifiers'
    workers); the instances' Postgres backends."""
    servers = [h.pid for h in fleet.instances]
    template = getattr(fleet, "_template", None)
    zygotes = [z for pid in servers for z in _kids(pid)]
    tops = [template.pid] if template is not None and template.poll() is None else []
    zygotes += [z for t in tops for z in _kids(t)]
    workers = [w for z in zygotes for w in children(z)]
    return {"env_server": servers, "fork_server": tops + zygotes, "workers": workers,
            "postgres_backend": list(pg_backends.values())}


def memory(fleet: LocalFleet, pg_backends: dict[str, int]) -> dict[str, Any]:
    """PSS of the fleet's processes by role, per instance (the fleet's sum over its instances:
    what a template shares is counted once, split as the kernel splits it)."""
    roles = fleet_roles(fleet, pg_backends)
    n = len(fleet.instances)
    by_role = {role: sum(pss_mb(p) for p in pids) / n for role, pids in roles.items()}
    return {"pss_mb_per_instance": round(sum(by_role.values()), 1),
            "pss_mb_per_instance_by_role": {k: round(v, 1) for k, v in by_role.items()},
            "workers_per_instance": round(len(roles["workers"]) / n, 2)}


def fleet_cpu_ms(fleet: LocalFleet, pg_backends: dict[str, int]) -> dict[str, float]:
    """CPU so far by role, summed over the fleet: env servers, fork servers (their own), workers
    (what the fork servers reaped, and the live ones), Postgres backends."""
    roles = fleet_roles(fleet, pg_backends)
    return {"env_server": sum(proc_cpu_ms(p, reaped=False) for p in roles["env_server"]),
            "fork_server": sum(proc_cpu_ms(z, reaped=False) for z in roles["fork_server"]),
            "workers": sum(proc_cpu_ms(z, own=False) for z in roles["fork_server"])
            + sum(proc_cpu_ms(p) for p in roles["workers"]),
            "postgres_backend": sum(proc_cpu_ms(p) for p in roles["postgres_backend"])}


async def run_awm(bundles: list[EnvBundle], database: Database, sessions: int, episodes: int, seed: int,
                  label: str) -> dict[str, Any]:
    fleet = LocalFleet(bundles, instances=sessions, database=database, allow_ungated=True, fleet_id=f"tl{label}")
    await fleet.start()
    try:
        by_name = {b.name: b for b in bundles}
        calls = {}
        for handle in fleet.instances:
            if handle.env not in calls:
                calls[handle.env] = await calibrate(handle, by_name[handle.env])
        await asyncio.sleep(1.0)  # the calibration's worker replacements
        pg_backends = await asyncio.to_thread(backends, database.admin_dsn, fleet)
        rec, start, warm = Recorder(), asyncio.Event(), []
        drivers = [asyncio.create_task(drive_awm(h, by_name[h.env], calls[h.env], episodes,
                                                 random.Random(seed + i), rec, start, warm))
                   for i, h in enumerate(fleet.instances)]
        await settle(warm, drivers)
        cpu0, t0 = fleet_cpu_ms(fleet, pg_backends), time.perf_counter()
        start.set()
        await asyncio.gather(*drivers)
        wall = time.perf_counter() - t0
        cpu = {k: v - cpu0[k] for k, v in fleet_cpu_ms(fleet, pg_backends).items()}
        await asyncio.sleep(1.0)  # the last episode's worker replacements
        out = rec.summary(wall)
        total = sum(cpu.values())
        out["cpu_ms_per_call"] = round(total / max(out["calls"]["n"], 1), 2)
        out["cpu_ms_per_episode"] = round(total / max(rec.episodes, 1), 2)
        out["cpu_ms_per_episode_by_role"] = {k: round(v / max(rec.episodes, 1), 2) for k, v in cpu.items()}
        out["memory"] = memory(fleet, pg_backends)
        out["calls_used"] = {env: [c[0] for c in found] for env, found in calls.items()}
        return out
    finally:
        await fleet.stop()


# -- the reference-style baseline ------------------------------------------------------------------


def seed_tables(bundle: EnvBundle) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    tables = {}
    for seed in bundle.database.seed:
        columns = sorted({k for row in seed.rows for k in row})
        tables[seed.table] = (columns, [tuple(row.get(c) for c in columns) for row in seed.rows])
    return tables


def reference_server(bundle_path: str) -> None:
    """One session of the baseline (run as ``python -m bench.tool_latency --reference-server B``):
    the app on a SQLite file, served by uvicorn; prints its port, serves until killed."""
    import types

    import uvicorn
    from fastapi import Body, FastAPI

    from awm.postgres.sqlite_export import build_sqlite

    bundle = EnvBundle.model_validate_json(Path(bundle_path).read_text())
    assert bundle.app is not None and bundle.database.sqlite_ddl
    work = Path(tempfile.mkdtemp(prefix="awm-ref-"))
    initial, current = work / "initial.db", work / "work.db"
    initial.write_bytes(build_sqlite(bundle.database.sqlite_ddl, seed_tables(bundle)))
    shutil.copyfile(initial, current)
    os.environ["DATABASE_PATH"] = f"sqlite:///{current}"
    module = types.ModuleType("awm_reference_app")
    sys.modules[module.__name__] = module
    exec(compile(bundle.app.code, "<app>", "exec"), module.__dict__)
    app = next(v for v in module.__dict__.values() if isinstance(v, FastAPI))
    engines = [v for v in module.__dict__.values() if type(v).__name__ == "Engine"]
    verifiers = {t.id: t.verifier for t in bundle.tasks}
    prelude = bundle.verifier_prelude or ""

    @app.post("/__awm/reset")
    def reset() -> dict[str, Any]:
        for engine in engines:
            engine.dispose()
        shutil.copyfile(initial, current)
        return {}

    @app.post("/__awm/verify")
    def verify(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        verifier = verifiers[body["task_id"]]
        namespace: dict[str, Any] = {"__name__": "verifier"}
        exec(compile(prelude + "\n\n" + verifier.code, "<verifier>", "exec"), namespace)
        result = namespace[verifier.entrypoint](str(initial), str(current), body.get("final_answer"))
        return {"result": str(result)[:200]}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


async def drive_reference(port: int, bundle: EnvBundle, calls: list[tuple[str, dict[str, Any]]], episodes: int,
                          rng: random.Random, rec: Recorder, start: asyncio.Event, warm: list[int]) -> None:
    from awm.client import http_client
    from awm.envserver.tools import build_request

    routes = {t.name: t.route for t in bundle.tools}
    tasks = code_tasks(bundle)
    base = f"http://127.0.0.1:{port}"
    async with http_client() as client:
        for e in range(episodes + 1):
            if e == 1:
                warm.append(1)
                await start.wait()
            measured = e >= 1
            t0 = time.perf_counter()
            (await client.post(base + "/__awm/reset")).raise_for_status()
            reset_ms = (time.perf_counter() - t0) * 1000
            for i in range(rng.randint(3, 10)):
                name, args = rng.choice(calls)
                method, url, query, body = build_request(routes[name], args)
                t0 = time.perf_counter()
                response = await client.request(method, base + url, params=query, json=body)
                ms = (time.perf_counter() - t0) * 1000
                if measured:
                    rec.call(i, ms, None if response.status_code < 400 else f"http_{response.status_code}")
            t0 = time.perf_counter()
            (await client.post(base + "/__awm/verify", json={"task_id": tasks[e % len(tasks)],
                                                              "final_answer": "done"})).raise_for_status()
            if measured:
                rec.reset.append(reset_ms)
                rec.verify.append((time.perf_counter() - t0) * 1000)
                rec.episodes += 1


async def run_reference(bundles: list[EnvBundle], sessions: int, episodes: int, seed: int,
                        calls: dict[str, list[tuple[str, dict[str, Any]]]]) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="awm-ref-bundles-"))
    procs, ports, envs = [], [], []
    try:
        for i in range(sessions):
            bundle = bundles[i % len(bundles)]
            path = work / f"{bundle.name}.json"
            if not path.exists():
                path.write_text(bundle.model_dump_json())
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.tool_latency", "--reference-server", str(path),
                stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
            procs.append(proc)
            assert proc.stdout is not None
            ports.append(int(await asyncio.wait_for(proc.stdout.readline(), 60)))
            envs.append(bundle)
        rec, start, warm = Recorder(), asyncio.Event(), []
        drivers = [asyncio.create_task(drive_reference(port, b, calls[b.name], episodes, random.Random(seed + i),
                                                       rec, start, warm))
                   for i, (port, b) in enumerate(zip(ports, envs))]
        await settle(warm, drivers)
        cpu0, t0 = sum(proc_cpu_ms(p.pid) for p in procs), time.perf_counter()
        start.set()
        await asyncio.gather(*drivers)
        wall = time.perf_counter() - t0
        cpu = sum(proc_cpu_ms(p.pid) for p in procs) - cpu0
        out = rec.summary(wall)
        out["cpu_ms_per_call"] = round(cpu / max(out["calls"]["n"], 1), 2)
        out["memory"] = {"pss_mb_per_session": round(sum(pss_mb(p.pid) for p in procs) / sessions, 1)}
        return out
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        shutil.rmtree(work, ignore_errors=True)


# -- main ------------------------------------------------------------------------------------------


async def load_catalogs(names: list[str], database: Database, workdir: Path,
                        imported: str | None = None) -> dict[str, list[EnvBundle]]:
    out = {}
    for name in names:
        if name == "awm1k" and imported:  # an import made before (alternated runs skip the import)
            out[name] = catalog.load(imported)
        elif name == "awm1k":
            from awm.importers.awm1k import import_awm_dir

            dest = workdir / "awm1k"
            await asyncio.to_thread(import_awm_dir, FIXTURE, dest, admin_dsn=database.admin_dsn,
                                    now=dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc))
            out[name] = catalog.load(dest)
        elif name == "starter":
            out[name] = catalog.load("starter")
        else:
            raise SystemExit(f"unknown catalog {name!r} (awm1k, starter)")
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    database = await asyncio.to_thread(Database.open, args.database_url)
    workdir = Path(tempfile.mkdtemp(prefix="awm-bench-tl-"))
    sessions = [int(s) for s in args.sessions.split(",")]
    episodes = args.episodes or (15 if args.quick else 60)
    result: dict[str, Any] = {"episodes_per_session": episodes, "sessions": sessions, "runs": {}}
    try:
        catalogs = await load_catalogs(args.catalogs.split(","), database, workdir, args.awm1k_catalog)
        for name, bundles in catalogs.items():
            if name == "awm1k":
                bundles = [b for b in bundles if code_tasks(b)]
            for n in sessions:
                label = f"{name}-{n}"
                out = await run_awm(bundles, database, n, episodes, args.seed, label.replace("-", ""))
                result["runs"][label] = out
                if name == "awm1k" and not args.no_baseline:
                    calls = {env: [c for c in candidate_calls(b) if c[0] in out["calls_used"][env]]
                             for env, b in ((b.name, b) for b in bundles) if env in out["calls_used"]}
                    result["runs"][label + "-baseline"] = await run_reference(
                        [b for b in bundles if b.name in calls], n, episodes, args.seed, calls)
        import psycopg

        with psycopg.connect(database.admin_dsn) as conn:
            result["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        await asyncio.to_thread(database.close)
    result["machine"] = {**machine(), "load_average_at_end": list(os.getloadavg())}
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="15 episodes per session (else 60)")
    parser.add_argument("--episodes", type=int, default=0, help="measured episodes per session")
    parser.add_argument("--sessions", default="1,8", help="concurrent sessions, comma-separated")
    parser.add_argument("--catalogs", default="awm1k,starter")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--awm1k-catalog", help="a catalog imported from tests/fixtures/awm1k before (skips the import)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--database-url", default=os.environ.get("AWM_DATABASE_URL"))
    parser.add_argument("--reference-server", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.reference_server:
        reference_server(ns.reference_server)
        raise SystemExit(0)
    t = time.perf_counter()
    out = asyncio.run(main(ns))
    out["bench_wall_s"] = round(time.perf_counter() - t, 1)
    if ns.json:
        print(json.dumps(out))
    else:
        for label, run in out.pop("runs").items():
            print(label)
            for key, value in run.items():
                print(f"  {key:28} {value}")
        for key, value in out.items():
            print(f"{key:30} {value}")
