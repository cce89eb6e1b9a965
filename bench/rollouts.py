"""Rollout benchmark: how much of a training step the learner spends waiting on environments,
asynchronous collection (bounded staleness) against synchronous collection.

    python -m bench.rollouts [--quick] [--json] [--env bike_shop] [--instances 8] [--learner-ms 1000]
    python -m bench.rollouts --policy vllm [--quick] [--json] [--base-url URL] [--learner-ms 0]

``--policy vllm`` measures a real policy instead: a vLLM server, a real learner and weight sync
(bench/rollouts_vllm.py has what it reports). The default, ``--policy replay``:

A local fleet serves the environment; the policy is :class:`awm.trainer.policy.ReplayPolicy`, which
answers instantly with each task's reference solution, so every tool call, reset and verification
is real and nothing else costs time. The learner is simulated by a fixed wall-clock step
(``--learner-ms``, a GPU step leaves the CPU to the environments, so it sleeps). Per mode:

* ``rollouts_per_s``      episodes delivered to the learner per second of wall time;
* ``tool_calls_per_s``    MCP tool calls per second in those episodes;
* ``env_time_fraction``   the share of wall time the learner waited for rollouts;
* ``staleness``           policy versions between generation and training (async only);
* ``collect_rollouts_per_s`` (sync) episodes per second while collecting: the environments' rate.

Both modes run the same number of steps of the same batch size in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any


from awm import catalog
from awm.fleet import Database
from awm.trainer.agent import AgentConfig
from awm.trainer.policy import ReplayPolicy
from awm.episode.reward import RewardConfig
from awm.trainer.rollout import LocalFleetSource, RolloutConfig, RolloutService, TaskRef


async def run_mode(mode: str, source: LocalFleetSource, policy: ReplayPolicy, tasks: list[TaskRef], steps: int,
                   groups_per_step: int, group_size: int, learner_s: float, agent: AgentConfig) -> dict[str, Any]:
    cfg = RolloutConfig(group_size=group_size, max_staleness=1, max_inflight_groups=groups_per_step)
    service = RolloutService(source, policy, tasks, agent, RewardConfig(), cfg)
    episodes = tool_calls = complete = 0
    staleness: list[int] = []
    if mode == "async":
        service.start()
    start = time.perf_counter()
    try:
        for _ in range(steps):
            groups = await (service.next_groups(groups_per_step) if mode == "async" else service.collect(groups_per_step))
            staleness += [policy.version - g.policy_version for g in groups]
            for traj in (t for g in groups for t in g.trajectories):
                episodes += 1
                tool_calls += traj.tool_calls
                complete += traj.verdict.get("verdict") == "complete"
            await asyncio.sleep(learner_s)  # the learner's step
            policy.version += 1  # ... and its weight sync
    finally:
        wall = time.perf_counter() - start
        await service.stop()
    return {"steps": steps, "episodes": episodes, "complete": complete, "wall_s": round(wall, 3),
            "rollouts_per_s": round(episodes / wall, 2), "tool_calls_per_s": round(tool_calls / wall, 1),
            "env_time_fraction": round(service.wait_s / wall, 3),
            # sync only: the environments' own rate while the learner waits for them
            "collect_rollouts_per_s": round(episodes / service.wait_s, 2) if mode == "sync" and service.wait_s else None,
            "staleness_max": max(staleness, default=0), "dropped_stale": service.dropped_stale}


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    mem = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal"))) / 1024 ** 2
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(mem, 1), "python": platform.python_version(),
            "kernel": platform.release()}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    bundles = catalog.load(args.catalog, [args.env])
    tasks = [TaskRef(b.name, t.id) for b in bundles for t in b.tasks]
    database = await asyncio.to_thread(Database.open, args.database_url)
    try:
        async with LocalFleetSource(bundles, args.instances, database) as source:
            policy = ReplayPolicy(bundles)
            agent = AgentConfig(max_turns=40, call_diff_rows=args.call_diff_rows)
            # warm-up: every instance runs a few episodes (prepared statements, caches)
            await RolloutService(source, policy, tasks, agent, RewardConfig(),
                                 RolloutConfig(group_size=args.group_size)).collect(args.groups_per_step)
            results = {}
            for mode in ("sync", "async"):
                results[mode] = await run_mode(mode, source, policy, tasks, args.steps, args.groups_per_step,
                                               args.group_size, args.learner_ms / 1000, agent)
    finally:
        await asyncio.to_thread(database.close)
    return {
        "env": args.env, "tasks": len(tasks), "instances": args.instances, "group_size": args.group_size,
        "groups_per_step": args.groups_per_step, "episodes_per_step": args.group_size * args.groups_per_step,
        "learner_ms": args.learner_ms, "policy": "replay (instant, reference solutions)",
        "call_diff_rows": args.call_diff_rows,
        "rollouts_per_s": results["async"]["rollouts_per_s"],
        "env_time_fraction": results["async"]["env_time_fraction"],
        "tool_calls_per_s": results["async"]["tool_calls_per_s"],
        "sync_rollouts_per_s": results["sync"]["rollouts_per_s"],
        "sync_env_time_fraction": results["sync"]["env_time_fraction"],
        "sync_tool_calls_per_s": results["sync"]["tool_calls_per_s"],
        "collect_rollouts_per_s": results["sync"]["collect_rollouts_per_s"],
        "speedup": round(results["async"]["rollouts_per_s"] / results["sync"]["rollouts_per_s"], 2),
        "async": results["async"], "sync": results["sync"], "machine": machine(),
    }


def print_vllm(data: dict[str, Any]) -> None:
    for mode in ("sync", "async"):
        r = data[mode]
        print(f"{mode:>5}: {r['episodes_per_s']:6.2f} episodes/s  {r['tokens_per_s']:7.1f} tokens/s  "
              f"env time {100 * r['env_time_fraction']:.0f}% of episodes  learner idle {100 * r['learner_idle_fraction']:.0f}%  "
              f"learner step {r['learner_step_s']:.2f} s  (staleness <= {r['staleness_max']})")
    print(f"speedup {data['speedup']}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=["replay", "vllm"], default="replay",
                        help="replay: reference solutions, a sleeping learner; vllm: a vLLM server, a real learner")
    parser.add_argument("--base-url", default=None, help="vllm: a running server (default: start the CPU one)")
    parser.add_argument("--model", default=str(Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-qwen"),
                        help="vllm: the model directory the server serves (the learner loads it too)")
    parser.add_argument("--served-model", default="policy")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="fewer steps (about half a minute)")
    parser.add_argument("--env", default="bike_shop")
    parser.add_argument("--catalog", default="starter")
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=None, help="default 4 (replay), 8 (vllm)")
    parser.add_argument("--groups-per-step", type=int, default=None, help="default 4 (replay), 2 (vllm)")
    parser.add_argument("--learner-ms", type=float, default=None,
                        help="replay: the simulated step (default 1000); vllm: added to each real step (default 0)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--call-diff-rows", type=int, default=0, help=(
        "rows per table of each call's recorded database change (the agent's default is 50; 0, not recorded, "
        "keeps the numbers comparable with docs/benchmarks.md's; its cost: bench/calldiff.py)"))
    args = parser.parse_args()
    vllm = args.policy == "vllm"
    args.group_size = args.group_size or (8 if vllm else 4)
    args.groups_per_step = args.groups_per_step or (2 if vllm else 4)
    args.learner_ms = args.learner_ms if args.learner_ms is not None else (0.0 if vllm else 1000.0)
    args.steps = args.steps or (4 if args.quick else (8 if vllm else 10))
    if vllm:
        from bench.rollouts_vllm import run

        data = run(args)
        data["machine"] = machine()
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            print_vllm(data)
        sys.exit(0)
    data = asyncio.run(main(args))
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        for mode in ("sync", "async"):
            r = data[mode]
            print(f"{mode:>5}: {r['rollouts_per_s']:7.2f} rollouts/s  {r['tool_calls_per_s']:7.1f} tool calls/s  "
                  f"learner waits {100 * r['env_time_fraction']:.0f}% of the time  (staleness <= {r['staleness_max']})")
        print(f"speedup {data['speedup']}x")
