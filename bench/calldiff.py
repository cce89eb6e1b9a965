"""What recording each tool call's database change costs (trainer/calldiff.py, agent.call_diff_rows).

    python -m bench.calldiff [--env bike_shop] [--episodes 200]     # prints JSON

One instance of a starter environment; every episode resets to a task and replays its reference
solution through MCP. After each call the agent's recording asks ``GET /diff?rows=50``; here each
episode runs twice, once with the recording and once without (interleaved, so the machine's load
hits both alike), and the medians of a tool call, of the diff request and of a whole episode are
compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any


from awm import catalog
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from bench.runtime import machine
from awm.episode.calldiff import DiffTracker


async def episode(mcp: McpSession, control: ControlClient, task: Any, record: bool,
                  calls: list[float], diffs: list[float]) -> float:
    t0 = time.perf_counter()
    await control.reset(task.id)
    tracker = DiffTracker(50)
    for step in task.solution:
        t = time.perf_counter()
        outcome = await mcp.call_tool(step.tool, step.arguments)
        calls.append((time.perf_counter() - t) * 1000)
        if record and not outcome.is_error:
            t = time.perf_counter()
            await tracker.after_call(control)
            diffs.append((time.perf_counter() - t) * 1000)
    await control.verify(task.final_answer)
    return (time.perf_counter() - t0) * 1000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    (bundle,) = catalog.load(args.catalog, [args.env])
    tasks = [t for t in bundle.tasks if t.solution]
    database = await asyncio.to_thread(Database.open, args.database_url)
    try:
        async with LocalFleet([bundle], 1, database) as fleet:
            inst = fleet.instances[0]
            async with McpSession(inst.mcp_url) as mcp:
                control = ControlClient(inst.control_url)
                calls: list[float] = []
                diffs: list[float] = []
                with_ms: list[float] = []
                without_ms: list[float] = []
                for n in range(args.episodes + 10):
                    task = tasks[n % len(tasks)]
                    a = await episode(mcp, control, task, True, calls, diffs)
                    b = await episode(mcp, control, task, False, [], [])
                    if n >= 10:  # warm-up
                        with_ms.append(a)
                        without_ms.append(b)
                await control.close()
    finally:
        await asyncio.to_thread(database.close)
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    return {"env": bundle.name, "tables": len(bundle.database.seed), "episodes": args.episodes,
            "tool_call_ms_p50": med(calls), "diff_rows_ms_p50": med(diffs),
            "episode_ms_p50_recorded": med(with_ms), "episode_ms_p50_unrecorded": med(without_ms),
            "episode_overhead": round(med(with_ms) / med(without_ms) - 1, 3),
            "machine": {**machine(), "loadavg_1m": round(os.getloadavg()[0], 2)}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="bike_shop")
    parser.add_argument("--catalog", default="starter")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--database-url", default=None)
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
