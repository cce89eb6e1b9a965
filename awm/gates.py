"""The two gates every task must pass, run against a live instance through MCP, and their records.

1. *Negative gate*: on the untouched snapshot the verifier must not say complete (the reference
   system never checks this, so tasks that start "already done" pay reward for nothing). For a
   judge verifier the judge runs too: it must not call the untouched state complete.
2. *Positive gate*: after the reference solution is replayed through MCP, it must say complete.

`awm catalog validate` runs both and, with ``--record``, stores a :class:`GateRecord` per task in
the catalog; env servers (hence `awm serve`, `awm demo`, fleets and trainers) serve only tasks
whose record holds for the verifier they serve and the snapshot they hold
(:func:`gate_status`), unless told to allow ungated tasks.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from awm.bundle import EnvBundle, GateRecord, GateResult, Task

if TYPE_CHECKING:  # env servers import this module for gate_status: no HTTP client in them
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
    if not task.solution:  # imported tasks: `awm gen solution` synthesises one
        return EpisodeReport(env, task.id, False, "no_solution", "the task has no reference solution")
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
    ok = verdict["verdict"] in ("incomplete", "agent_error")  # anything but complete, and no error
    return EpisodeReport(env, task.id, ok, verdict["verdict"], verdict["reason"], reset["reset_ms"], [],
                         verdict["verify_ms"], (time.perf_counter() - start) * 1000)


def gate_status(bundle: EnvBundle, task: Task, prefer: str | None = None) -> tuple[bool, str]:
    """Whether ``task`` passed both gates for the verifier served (``prefer``red kind) on this
    bundle's snapshot, and if not, why (the reason a refused reset gives)."""
    verifier = task.select(prefer)  # type: ignore[arg-type]
    digest, snapshot = verifier.digest(bundle.verifier_prelude), bundle.database_hash()
    records = [r for r in task.gates if r.verifier_kind == verifier.kind]
    if not records:
        return False, f"no gate record for its {verifier.kind} verifier"
    record = records[-1]
    if record.verifier != digest:
        return False, "its verifier changed since the gates ran"
    if record.snapshot != snapshot:
        return False, "the snapshot changed since the gates ran"
    if not (record.negative and record.negative.passed):
        return False, "negative gate " + ("not run" if record.negative is None else
                                          f"failed: {record.negative.verdict} on the untouched snapshot")
    if not (record.positive and record.positive.passed):
        return False, "positive gate " + ("not run" if record.positive is None else
                                          f"failed: {record.positive.verdict} after the reference solution")
    return True, "passed"


def negative_failure(bundle: EnvBundle, task: Task, kind: str) -> str | None:
    """Why ``task``'s ``kind`` verifier cannot be believed, if its negative gate *ran and failed* on
    this snapshot with this code (it says complete on the untouched database, whatever an agent
    does): then its verdicts carry no signal. None when that is not known to be so."""
    verifier = task.select(kind)  # type: ignore[arg-type]
    if verifier.kind != kind:
        return None
    digest, snapshot = verifier.digest(bundle.verifier_prelude), bundle.database_hash()
    records = [r for r in task.gates if r.verifier_kind == kind and r.verifier == digest and r.snapshot == snapshot]
    negative = records[-1].negative if records else None
    if negative is None or negative.passed:
        return None
    return f"its {kind} verifier says {negative.verdict} on the untouched database"


def record(bundle: EnvBundle, task: Task, prefer: str | None, negative: EpisodeReport | None,
           positive: EpisodeReport | None) -> GateRecord:
    """A gate record for the verifier served, replacing the task's earlier record of that kind."""
    verifier = task.select(prefer)  # type: ignore[arg-type]
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")

    def result(report: EpisodeReport | None) -> GateResult | None:
        return None if report is None else GateResult(passed=report.ok, verdict=report.verdict,
                                                      reason=report.reason[:500], at=now)

    entry = GateRecord(verifier_kind=verifier.kind, verifier=verifier.digest(bundle.verifier_prelude),
                       snapshot=bundle.database_hash(), negative=result(negative), positive=result(positive))
    task.gates = [r for r in task.gates if r.verifier_kind != verifier.kind] + [entry]
    return entry
