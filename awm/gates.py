"""The two gates every task must pass, run against a live instance through MCP.

1. *Negative gate*: on the untouched snapshot the verifier must not say complete (the reference
   system never checks this, so tasks that start "already done" pay reward for nothing).
2. *Positive gate*: after the reference solution is replayed through MCP, it must say complete.

`awm catalog validate` runs both; `awm demo` runs the positive one as its episode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from awm.bundle import Task
from awm.client import ControlClient, McpSession


@dataclass
class EpisodeReport:
    env: str
    task_id: str
    ok: bool
    verdict: str
    reason: str
    reset_ms: float = 0.0
    tool_ms: list[float] = field(default_factory=list)
    verify_ms: float = 0.0
    wall_ms: float = 0.0


async def replay(env: str, task: Task, mcp: McpSession, control: ControlClient) -> EpisodeReport:
    """Positive gate: reset, replay the reference solution, verify with the reference answer."""
    start = time.perf_counter()
    reset = await control.reset(task.id)
    tool_ms = []
    for index, step in enumerate(task.solution):
        t0 = time.perf_counter()
        outcome = await mcp.call_tool(step.tool, step.arguments)
        tool_ms.append((time.perf_counter() - t0) * 1000)
        if outcome.is_error:
            return EpisodeReport(env, task.id, False, "error",
                                 f"solution step {index + 1} ({step.tool}) failed: {outcome.text}",
                                 reset["reset_ms"], tool_ms, 0.0, (time.perf_counter() - start) * 1000)
    verdict = await control.verify(task.final_answer)
    return EpisodeReport(env, task.id, verdict["verdict"] == "complete", verdict["verdict"], verdict["reason"],
                         reset["reset_ms"], tool_ms, verdict["verify_ms"], (time.perf_counter() - start) * 1000)


async def untouched(env: str, task: Task, control: ControlClient) -> EpisodeReport:
    """Negative gate: the verifier on the pristine snapshot, with the reference answer withheld."""
    start = time.perf_counter()
    reset = await control.reset(task.id)
    verdict = await control.verify(None)
    ok = verdict["verdict"] == "incomplete"
    return EpisodeReport(env, task.id, ok, verdict["verdict"], verdict["reason"], reset["reset_ms"], [],
                         verdict["verify_ms"], (time.perf_counter() - start) * 1000)
