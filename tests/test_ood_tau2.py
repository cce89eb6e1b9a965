"""``awm eval --suite tau2`` on a handful of τ²-bench tasks against the scripted endpoint, which
plays both the agent and tau2's user simulator. The agent replays a task's gold actions (read
from tau2's own task file) on some tasks and does nothing on others: tau2's evaluator, comparing
the final database with the one its gold actions produce, must score the first 1 and the second 0."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import Reply, ScriptedLLM
from tests.ood_helpers import package_dir, suite_python, tool_call

pytestmark = pytest.mark.slow

# Replayed: the gold actions change the database (a cancellation, a return).
CORRECT = {"airline": ["9"], "retail": ["73"]}
# Left alone, so the database stays as it was: a cancellation not made, a phone left in airplane mode.
IDLE = {"airline": ["19"], "telecom": ["[service_issue]airplane_mode_on|unseat_sim_card[PERSONA:None]"]}


def _tasks(python: Path) -> dict[str, dict[str, Any]]:
    data = package_dir(python, "tau2") / "data" / "tau2" / "domains"
    wanted = {d: CORRECT.get(d, []) + IDLE.get(d, []) for d in ("airline", "retail", "telecom")}
    found = {}
    for domain, ids in wanted.items():
        for task in json.loads((data / domain / "tasks.json").read_text()):
            if task["id"] in ids:
                found[task["id"]] = task
    assert len(found) == sum(map(len, wanted.values())), "a task of the test is missing from tau2's data"
    return found


def _script(tasks: dict[str, dict[str, Any]]):
    correct = {t for ids in CORRECT.values() for t in ids}

    def answer(_stage: str, body: dict[str, Any], _index: int) -> Reply:
        msgs = body["messages"]
        system = msgs[0]["content"] or ""
        if "playing the role of a customer" in system:  # tau2's user simulator
            flat = " ".join(system.split())
            task_id = next(t for t, task in tasks.items()
                           if " ".join(task["user_scenario"]["instructions"]["reason_for_call"].split()) in flat)
            spoke = any(m["role"] == "assistant" for m in msgs)
            return Reply("###STOP###" if spoke else f"Hello, I need help with something. [task {task_id}]")
        said = " ".join(m.get("content") or "" for m in msgs if m["role"] == "user")
        task_id = re.search(r"\[task (.+?)\]", said).group(1)
        gold = [a for a in tasks[task_id]["evaluation_criteria"]["actions"]] if task_id in correct else []
        done = sum(1 for m in msgs if m["role"] == "assistant" and m.get("tool_calls"))
        if done < len(gold):
            return Reply("", tool_calls=[tool_call(done, gold[done]["name"], gold[done]["arguments"])])
        return Reply("That is all done for you.")

    return answer


def test_tau2_suite_scores_with_tau2s_evaluator(tmp_path: Path) -> None:
    from rich.console import Console

    from awm.trainer.suites.table import Endpoint, render
    from awm.trainer.suites.tau2 import run_tau2

    python = suite_python("tau2")
    tasks = _tasks(python)
    ids = {d: CORRECT.get(d, []) + IDLE.get(d, []) for d in ("airline", "retail", "telecom")}
    with ScriptedLLM(_script(tasks)) as llm:
        agent = Endpoint(llm.base_url, "scripted-agent")
        user = Endpoint(llm.base_url, "scripted-user")
        report = run_tau2(agent, user, python, tmp_path, trials=1, task_ids=ids, max_steps=30, concurrency=1)
    assert [r.category for r in report.rows] == ["airline", "retail", "telecom"]
    rewards = report.details["rewards"]
    for domain, correct in CORRECT.items():
        for task_id in correct:
            assert rewards[domain][task_id] == [1.0], (domain, task_id, rewards)
    for domain, idle in IDLE.items():
        for task_id in idle:
            assert rewards[domain][task_id] == [0.0], (domain, task_id, rewards)
    by = {r.category: r.metrics for r in report.rows}
    assert by["airline"]["pass^1"] == 0.5 and by["retail"]["pass^1"] == 1.0 and by["telecom"]["pass^1"] == 0.0
    assert report.summary[0].category == "Average" and report.summary[0].metrics["pass^1"] == 0.5
    assert report.metrics == ["pass^1", "pass@1"]  # one trial: pass^1 is pass^k, named once
    console = Console(record=True, width=160)
    render(report, console)
    text = console.export_text()
    assert "airline" in text and "telecom" in text and "pass@1" in text
    assert json.loads(report.write(tmp_path).read_text())["rows"][0]["category"] == "airline"
