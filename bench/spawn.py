"""What a fresh worker costs: one spawn (fork server → confined worker with its tools loaded) and
its kill, the price every episode pays twice (its tool worker, its verifier's worker).

    python -m bench.spawn [--env bike_shop] [--cycles 400] [--rounds 3]     # prints JSON

A fork server of the env server's kind forks workers for the environment's tools, one after
another: each is started (``Worker``: confined, tools loaded, ``ready`` read) and killed (reaped
by the fork server). Measured per cycle: wall time, and the CPU time of this process (the env
server's side), of the fork server, and of the workers (what the fork server reaped), read from
``/proc``. The baseline, in the same run and alternated with it: a process that imported what the
fork server imports forks a child that exits at once (the floor of a fork of that much Python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from awm import catalog
from awm.envserver.tools import ToolRuntime
from awm.sandbox.pool import Worker, WorkerSpec, make_zygote
from bench.runtime import machine

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")

FLOOR = """
import gc, os, sys, time
from awm.sandbox import worker  # noqa: F401  (what the fork server imports)
from awm.sandbox.forkserver import COMMON_MODULES
for name in COMMON_MODULES:
    __import__(name)
gc.freeze()
n = int(sys.argv[1]); t0 = time.perf_counter(); c0 = os.times()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
c1 = os.times()
cpu = (c1.user + c1.system + c1.children_user + c1.children_system) - (c0.user + c0.system + c0.children_user + c0.children_system)
print((time.perf_counter() - t0) * 1000 / n, cpu * 1000 / n)
"""


def cpu_ms(pid: int, reaped: bool = False) -> float:
    """CPU time of ``pid`` (or, ``reaped``, of the children it has waited for), in ms."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    ticks = int(fields[13]) + int(fields[14]) if reaped else int(fields[11]) + int(fields[12])
    return ticks * TICK_MS


def spawn_round(spec: WorkerSpec, zygote: Any, cycles: int) -> dict[str, float]:
    zygote_pid, me = zygote.env_pid() or zygote.pid(), os.getpid()
    server0, zygote0, workers0 = cpu_ms(me), cpu_ms(zygote_pid), cpu_ms(zygote_pid, reaped=True)
    walls = []
    for _ in range(cycles):
        t = time.perf_counter()
        Worker(spec, zygote).kill()
        walls.append((time.perf_counter() - t) * 1000)
    return {"wall_p50_ms": statistics.median(walls),
            "server_cpu_ms": (cpu_ms(me) - server0) / cycles,
            "fork_server_cpu_ms": (cpu_ms(zygote_pid) - zygote0) / cycles,
            "worker_cpu_ms": (cpu_ms(zygote_pid, reaped=True) - workers0) / cycles}


def floor_round(cycles: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", FLOOR, str(cycles)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    wall, cpu = map(float, out.stdout.split())
    return {"wall_ms": wall, "cpu_ms": cpu}


def main(args: argparse.Namespace) -> dict[str, Any]:
    bundle = catalog.load(args.catalog, [args.env])[0]
    runtime = ToolRuntime(bundle)
    spec = WorkerSpec(memory_mb=bundle.limits.verifier_memory_mb, load=runtime.load)
    zygote = make_zygote(runtime.load.get("app") is not None)
    try:
        Worker(spec, zygote).kill()  # the fork server up, the tools compiled there
        spawns, floors = [], []
        for _ in range(args.rounds):
            spawns.append(spawn_round(spec, zygote, args.cycles))
            floors.append(floor_round(args.cycles))
    finally:
        zygote.close()
    med = lambda rows, key: round(statistics.median(r[key] for r in rows), 3)  # noqa: E731
    result: dict[str, Any] = {key: med(spawns, key) for key in spawns[0]}
    result["cpu_ms_per_cycle"] = round(sum(result[k] for k in ("server_cpu_ms", "fork_server_cpu_ms", "worker_cpu_ms")), 3)
    result["baseline_fork_exit_cpu_ms"] = med(floors, "cpu_ms")
    result["baseline_fork_exit_wall_ms"] = med(floors, "wall_ms")
    result["vs_baseline"] = round(result["cpu_ms_per_cycle"] / max(result["baseline_fork_exit_cpu_ms"], 1e-6), 2)
    result.update({"env": bundle.name, "tools": len(runtime.load["tools"]), "cycles": args.cycles,
                   "rounds": args.rounds, "machine": machine()})
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="bike_shop")
    parser.add_argument("--catalog", default="starter")
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    print(json.dumps(main(parser.parse_args())))
