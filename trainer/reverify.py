"""``awm verify RUN_DIR``: re-verify a saved run offline, and say where it disagrees with live.

A run directory keeps every finished episode in ``trajectories.jsonl`` (task, tool calls with
their arguments and results, final answer, live verdict). Each episode is replayed against a
fresh instance of its environment - reset to its task, the same tool calls through MCP, then
``/verify`` with the same final answer - so the verifier (code or LLM judge) sees the same final
database and the same episode log it saw live. Tools are deterministic functions of the database
and their arguments, so the replay reaches the same state; where a replayed call's outcome
differs from the recorded one (a tool that reads the clock, say), the episode is reported as
*diverged* at that step rather than silently re-scored.

The reference system re-verifies from saved ``initial.db`` / ``final.db`` files; awm keeps no
database files per episode (an episode is a transaction), and the replay is what makes a saved
run re-checkable with another verifier kind or another judge.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from awm.bundle import EnvBundle
from awm.client import ControlClient, McpSession
from awm.trainer.trajectory import Trajectory, read_trajectories


@dataclass
class Reverified:
    episode_id: str
    env: str
    task_id: str
    live: str  # the verdict recorded live
    offline: str  # the verdict now ("skipped" when not replayable)
    same: bool
    diverged_at: int | None = None  # 1-based tool call whose outcome differs from the recorded one
    reason: str = ""
    offline_verdict: dict[str, Any] | None = None


def _calls(traj: Trajectory) -> list[tuple[str, Any, bool]]:
    """The episode's executed tool calls: (name, arguments, was an error live)."""
    out = []
    for turn in traj.turns:
        results = {r.get("tool_call_id"): r for r in turn.results}
        for call in turn.tool_calls:
            if call.get("malformed"):
                continue  # never reached the environment
            result = results.get(call.get("id")) or {}
            out.append((str(call.get("name")), call.get("arguments") or {}, bool(result.get("is_error"))))
    return out


async def replay_one(traj: Trajectory, mcp: McpSession, control: ControlClient) -> Reverified:
    live = str(traj.verdict.get("verdict") or "none")
    base = Reverified(traj.episode_id, traj.env, traj.task_id, live, "skipped", False)
    if traj.infra_error or not traj.verdict:
        base.reason = f"not verified live ({traj.stop_reason or 'no verdict'})"
        return base
    await control.reset(traj.task_id)
    for index, (name, arguments, was_error) in enumerate(_calls(traj), 1):
        outcome = await mcp.call_tool(name, arguments)
        if outcome.is_error != was_error:
            base.diverged_at = index
            base.reason = (f"call {index} ({name}) was {'an error' if was_error else 'ok'} live and is "
                           f"{'an error' if outcome.is_error else 'ok'} now: {outcome.text[:300]}")
            break
    verdict = await control.verify(traj.final_answer)
    base.offline, base.offline_verdict = verdict["verdict"], verdict
    base.same = base.offline == live and base.diverged_at is None
    if not base.same and not base.reason:
        base.reason = f"live {live}: {traj.verdict.get('reason', '')[:200]} / now {verdict['verdict']}: " \
                      f"{str(verdict.get('reason', ''))[:200]}"
    return base


async def reverify(run_dir: Path, bundles: list[EnvBundle], replicas: int = 2, database: Any = None,
                   serving: dict[str, Any] | None = None,
                   on_result: Callable[[Reverified], None] | None = None) -> list[Reverified]:
    """Replay and re-verify every finished episode of ``run_dir``; writes ``verify.jsonl``."""
    from awm.fleet import LocalFleet

    trajectories = read_trajectories(run_dir / "trajectories.jsonl")
    known = {b.name for b in bundles}
    results: list[Reverified] = [Reverified(t.episode_id, t.env, t.task_id, str(t.verdict.get("verdict")),
                                            "skipped", False, reason=f"environment {t.env!r} not in the catalog")
                                 for t in trajectories if t.env not in known]
    todo = [t for t in trajectories if t.env in known]
    used = [b for b in bundles if any(t.env == b.name for t in todo)]
    if used:
        # Every episode is re-verified, gated or not: this is an audit, not a training run.
        options = {**(serving or {}), "allow_ungated": True}
        async with LocalFleet(used, replicas=replicas, database=database, **options) as fleet:
            queues: dict[str, asyncio.Queue[Trajectory]] = {b.name: asyncio.Queue() for b in used}
            for traj in todo:
                queues[traj.env].put_nowait(traj)

            async def worker(handle: Any) -> None:
                control = ControlClient(handle.control_url)
                try:
                    async with McpSession(handle.mcp_url) as mcp:
                        queue = queues[handle.env]
                        while not queue.empty():
                            result = await replay_one(queue.get_nowait(), mcp, control)
                            results.append(result)
                            if on_result:
                                on_result(result)
                finally:
                    await control.close()

            await asyncio.gather(*(worker(handle) for handle in fleet.instances))
    with (run_dir / "verify.jsonl").open("w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(asdict(r), default=str) + "\n")
    return results


def summary(results: list[Reverified]) -> dict[str, Any]:
    replayed = [r for r in results if r.offline != "skipped"]
    return {"episodes": len(results), "replayed": len(replayed), "same": sum(r.same for r in replayed),
            "different": sum(not r.same for r in replayed), "diverged": sum(r.diverged_at is not None for r in replayed),
            "skipped": len(results) - len(replayed)}
