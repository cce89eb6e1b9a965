"""``awm demo`` and ``awm catalog validate``: serve a catalog locally and run every task.

Each environment gets one instance; environments run concurrently, tasks of one environment
run one after another (one instance is one episode at a time), with a reset before each.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from awm.bundle import EnvBundle
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.gates import EpisodeReport, gate_status, record, replay, untouched
from awm.judge import JudgeSettings


@dataclass
class EnvResult:
    name: str
    tools: int
    tasks: int
    served_tools: list[str] = field(default_factory=list)
    episodes: list[EpisodeReport] = field(default_factory=list)
    negatives: list[EpisodeReport] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def passed(self) -> int:
        return sum(e.ok for e in self.episodes)

    @property
    def negatives_passed(self) -> int:
        return sum(e.ok for e in self.negatives)

    def summary(self) -> dict[str, Any]:
        resets = [e.reset_ms for e in self.episodes + self.negatives]
        calls = [ms for e in self.episodes for ms in e.tool_ms]
        return {
            "name": self.name, "tools": self.tools, "tasks": self.tasks, "passed": self.passed,
            "reset_p50_ms": _p50(resets), "tool_call_p50_ms": _p50(calls),
            "episodes_per_s": round(len(self.episodes) / self.wall_s, 2) if self.wall_s else None,
            "failures": [{"task": e.task_id, "verdict": e.verdict, "reason": e.reason}
                         for e in self.episodes if not e.ok],
        }


def _p50(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


async def run_catalog(bundles: list[EnvBundle], database_url: str | None = None, negative_gate: bool = False,
                      show_progress: bool = True, judge: JudgeSettings | None = None,
                      verifier_kind: str | None = None, allow_ungated: bool = False,
                      database: Database | None = None) -> tuple[list[EnvResult], dict[str, Any]]:
    """Run the catalog's tasks: only those that passed both gates, unless ``allow_ungated``
    (`awm catalog validate` allows them: it is what runs the gates). ``database``: an open
    server to use (kept open), instead of opening ``database_url``."""
    owned = database is None
    if database is None:
        database = await asyncio.to_thread(Database.open, database_url)
    started = time.perf_counter()
    skipped = 0
    if not allow_ungated:
        kept = []
        for bundle in bundles:
            tasks = [t for t in bundle.tasks if gate_status(bundle, t, verifier_kind)[0]]
            skipped += len(bundle.tasks) - len(tasks)
            kept.append(bundle.model_copy(update={"tasks": tasks}))
        bundles = kept
    try:
        fleet = LocalFleet(bundles, replicas=1, database=database, judge=judge, verifier_kind=verifier_kind,
                           allow_ungated=allow_ungated)
        await fleet.start()
        try:
            ready_s = time.perf_counter() - started
            with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), disable=not show_progress, transient=False) as progress:
                t0 = time.perf_counter()
                results = await asyncio.gather(*(
                    _run_env(bundle, handle.mcp_url, handle.control_url, negative_gate, progress)
                    for bundle, handle in zip(bundles, fleet.instances)))
                run_s = time.perf_counter() - t0
        finally:
            await fleet.stop()
    finally:
        if owned:
            await asyncio.to_thread(database.close)
    episodes = sum(len(r.episodes) for r in results)
    totals = {
        "environments": len(results),
        "tools": sum(r.tools for r in results),
        "tasks": sum(r.tasks for r in results),
        "passed": sum(r.passed for r in results),
        "reset_p50_ms": _p50([e.reset_ms for r in results for e in r.episodes + r.negatives]),
        "tool_call_p50_ms": _p50([ms for r in results for e in r.episodes for ms in e.tool_ms]),
        "episodes_per_s": round(episodes / run_s, 2) if run_s else None,
        "startup_s": round(ready_s, 2),
        "ungated_skipped": skipped,
        "wall_s": round(time.perf_counter() - started, 2),
    }
    return results, totals


async def _run_env(bundle: EnvBundle, mcp_url: str, control_url: str, negative_gate: bool,
                   progress: Progress) -> EnvResult:
    result = EnvResult(bundle.name, len(bundle.tools), len(bundle.tasks))
    steps = len(bundle.tasks) * (2 if negative_gate else 1)
    bar = progress.add_task(bundle.name, total=steps)
    control = ControlClient(control_url)
    start = time.perf_counter()
    try:
        async with McpSession(mcp_url) as mcp:
            result.served_tools = sorted(t["name"] for t in await mcp.list_tools())
            for task in bundle.tasks:
                if negative_gate:
                    result.negatives.append(await untouched(bundle.name, task, control))
                    progress.advance(bar)
                result.episodes.append(await replay(bundle.name, task, mcp, control))
                progress.advance(bar)
    finally:
        await control.close()
    result.wall_s = time.perf_counter() - start
    return result


def record_results(bundle: EnvBundle, result: EnvResult, verifier_kind: str | None = None) -> None:
    """Turn a validation run (``run_catalog(..., negative_gate=True)``) into the tasks' gate records."""
    negatives = {e.task_id: e for e in result.negatives}
    positives = {e.task_id: e for e in result.episodes}
    for task in bundle.tasks:
        record(bundle, task, verifier_kind, negatives.get(task.id), positives.get(task.id))
