"""``awm gen solution --catalog DIR``: reference solutions for a catalog's tasks (AWM imports
ship none), each kept only once it passes the positive gate through MCP.

Per environment, one served instance (ungated tasks allowed: this is where their gates run).
Per task without a solution: the LLM plans the tool calls from the tools' schemas, a seed
excerpt and the task; the plan is replayed through MCP on a fresh episode and verified - by the
served verifier, an LLM judge for judge verifiers - and the failure (a tool error, or the
verdict and its reason) goes back to the LLM for the next attempt. A solution that makes the
verifier say complete is written into the bundle with both gate results: the negative gate is
run too (or kept when it already holds), so a solved task is a served task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from awm import catalog as catalog_mod
from awm.bundle import EnvBundle, Task, ToolCall
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.gates import record, replay, untouched
from awm.judge import JudgeSettings
from awm.llm import LLMBadOutput, LLMClient
from awm.synth import prompts


class _Plan(BaseModel):
    steps: list[ToolCall] = Field(min_length=1)
    final_answer: str | None = None


@dataclass
class SolveReport:
    env: str
    solved: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # task id -> last reason
    skipped: list[str] = field(default_factory=list)  # had a solution already


async def solve_bundle(bundle: EnvBundle, llm: LLMClient, database: Database, attempts: int = 3,
                       judge: JudgeSettings | None = None, verifier_kind: str | None = None,
                       redo: bool = False) -> SolveReport:
    """Solve ``bundle``'s tasks in place (``redo``: also those that have a solution)."""
    report = SolveReport(bundle.name)
    todo = [t for t in bundle.tasks if redo or not t.solution]
    report.skipped = [t.id for t in bundle.tasks if t not in todo]
    if not todo:
        return report
    tools = [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in bundle.tools]
    excerpt = "\n".join(f"{t.table}: {json.dumps(t.rows[:8], default=str)}"[:4000] for t in bundle.database.seed)
    async with LocalFleet([bundle], database=database, judge=judge, verifier_kind=verifier_kind,
                          allow_ungated=True) as fleet:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        try:
            async with McpSession(handle.mcp_url) as mcp:
                for task in todo:
                    await _solve(bundle, task, tools, excerpt, llm, mcp, control, attempts, verifier_kind, report)
        finally:
            await control.close()
    return report


async def _solve(bundle: EnvBundle, task: Task, tools: list[dict[str, Any]], excerpt: str, llm: LLMClient,
                 mcp: McpSession, control: ControlClient, attempts: int, verifier_kind: str | None,
                 report: SolveReport) -> None:
    errors: list[str] = []
    for _ in range(attempts):
        user = prompts.solution_user(bundle.name, tools, excerpt, task.instruction)
        try:
            plan = await llm.structured("solution", prompts.SOLUTION,
                                        user + (prompts.feedback(errors) if errors else ""), _Plan)
        except LLMBadOutput as exc:
            errors = [str(exc)]
            continue
        unknown = sorted({s.tool for s in plan.steps} - {t["name"] for t in tools})
        if unknown:
            errors = [f"unknown tools {unknown}"]
            continue
        candidate = task.model_copy(update={"solution": plan.steps, "final_answer": plan.final_answer})
        positive = await replay(bundle.name, candidate, mcp, control)
        if not positive.ok:
            errors = [f"after this solution the verdict is {positive.verdict}: {positive.reason}"]
            continue
        negative = await untouched(bundle.name, candidate, control)
        task.solution, task.final_answer = plan.steps, plan.final_answer
        record(bundle, task, verifier_kind, negative, positive)
        if negative.ok:
            report.solved.append(task.id)
        else:  # solvable, but "already done" on the untouched snapshot: the task itself is flawed
            report.failed[task.id] = f"negative gate: {negative.verdict} on the untouched snapshot"
        return
    report.failed[task.id] = errors[-1] if errors else "no attempt"


async def solve_catalog(catalog: str | Path, llm: LLMClient, database: Database, attempts: int = 3,
                        envs: list[str] | None = None, judge: JudgeSettings | None = None,
                        verifier_kind: str | None = None, redo: bool = False) -> list[SolveReport]:
    """Solve every chosen environment of a JSON-bundle catalog and write the bundles back."""
    reports = []
    for entry in catalog_mod.entries(catalog):
        if entry.bundle is None or (envs and entry.name not in envs):
            continue
        if entry.source.suffix != ".json":
            raise ValueError(f"{entry.source}: only JSON bundles are written back (source directories "
                             "hold their solutions in env.yaml)")
        result = await solve_bundle(entry.bundle, llm, database, attempts, judge, verifier_kind, redo)
        entry.source.write_text(entry.bundle.model_dump_json(indent=1))
        reports.append(result)
    return reports
