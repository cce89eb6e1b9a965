"""Verifications: a task's verifier code run in a confined worker, and the verdict it produces.

The verifier runs in the instance's worker pool (:mod:`awm.sandbox`), never in this process. It
reads the database through ``final.query(...)`` / ``initial.query(...)``, which the reset engine
answers read-only inside the episode (:meth:`awm.envserver.reset.EpisodeDatabase.read_query`), or, for
AWM-style verifiers (``inputs: sqlite``), from SQLite images of the snapshot and of the final
state that the worker opens in memory. A verifier that crashes, loops, runs out of memory or
breaks the protocol gets verdict ``error`` with the reason; its worker is replaced and the
instance keeps serving.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from awm.judge import JudgeResult
from awm.sandbox.pool import WeakIsolation, WorkerFailure, WorkerPool
from awm.envserver.reset import EpisodeDatabase


@dataclass
class Verdict:
    """``verdict`` is ``complete``, ``incomplete``, ``agent_error`` (judge verifiers: the agent misused
    the tools; scored, like incomplete) or ``error`` (ours, never charged to the agent: the trainer
    masks it). Error kinds: timeout | memory | crash | exception | query | infra (the verifier or
    the instance), server_error (the judge found the environment failing the agent), judge (the
    judge failed). ``evidence`` is an intermediate state: a judge verifier's output, before judging."""

    verdict: str
    reason: str
    kind: str = ""
    ms: float = 0.0
    evidence: Any = None
    judge: dict[str, Any] | None = None

    @property
    def reward(self) -> float:
        return 1.0 if self.verdict == "complete" else 0.0


def from_judgement(result: JudgeResult, evidence: Any) -> Verdict:
    """The judge's class as a verdict: server and judge errors are ours (masked), the rest scored."""
    judge = result.to_json()
    if result.classification == "judge_error":
        return Verdict("error", f"judge failed: {result.reasoning}", "judge", result.ms, evidence, judge)
    if result.classification == "server_error":
        return Verdict("error", f"judge: the environment failed the agent: {result.reasoning}", "server_error",
                       result.ms, evidence, judge)
    return Verdict(result.classification, result.reasoning, "", result.ms, evidence, judge)


def verify_in_worker(db: EpisodeDatabase, pool: WorkerPool, code: str, entrypoint: str, answer: str | None,
                     timeout_s: float, sqlite_images: dict[str, bytes] | None = None,
                     evidence: bool = False) -> Verdict:
    """Run one verifier (on the database thread). ``sqlite_images`` (``{"initial", "final"}``)
    switches to the AWM convention: the verifier gets SQLite databases instead of query views.
    ``evidence``: a judge verifier, whose return value is evidence (verdict ``evidence``)."""
    start = time.perf_counter()
    message: dict[str, Any] = {"op": "verify", "code": code, "entrypoint": entrypoint, "answer": answer,
                               "evidence": evidence}
    if sqlite_images:
        message["files"] = sqlite_images
    try:
        reply, _ = db.run_code(pool, message, timeout_s, writes=False)
        verdict = _verdict(reply)
    except WorkerFailure as exc:
        if exc.kind == "timeout":
            verdict = Verdict("error", f"verifier timed out after {timeout_s:g} s", "timeout")
        elif exc.kind == "start":
            verdict = Verdict("error", f"verifier worker unavailable: {exc}", "infra")
        else:
            verdict = Verdict("error", f"verifier {exc}", "crash")
    except WeakIsolation as exc:
        verdict = Verdict("error", str(exc), "infra")
    verdict.ms = (time.perf_counter() - start) * 1000
    return verdict


def _verdict(reply: dict[str, Any]) -> Verdict:
    op = reply.get("op")
    if op == "done" and "evidence" in reply:
        return Verdict("evidence", "", evidence=reply["evidence"])
    if op == "done":
        if not isinstance(reply.get("complete"), bool):
            return Verdict("error", "verifier reply without a verdict", "crash")
        return Verdict("complete" if reply["complete"] else "incomplete", str(reply.get("reason", ""))[:2000])
    if op == "failed":
        kind = str(reply.get("kind", "exception"))
        kind = {"memory": "memory", "query": "query"}.get(kind, "exception")
        reason = str(reply.get("reason", ""))[:2000]
        if kind == "memory":
            reason = "verifier exceeded its memory limit"
        return Verdict("error", reason, kind)
    return Verdict("error", f"verifier sent an unknown message {op!r}", "crash")
