"""``awm eval --suite bfcl`` on a handful of BFCL entries against the scripted endpoint. The
script answers some entries with BFCL's own ground truth (read from bfcl-eval's data files) and
the others wrongly (a function that does not exist, a call where none should be made, a silent
multi-turn agent); BFCL's own checkers (AST for single-turn, executed state for multi-turn) must
pass the first and fail the second, and the table must carry BFCL's categories."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from tests.llm_server import Reply, ScriptedLLM
from tests.ood_helpers import package_dir, suite_python, tool_call

pytestmark = pytest.mark.slow

RIGHT = ["simple_python_0", "irrelevance_0", "multi_turn_base_0"]
WRONG = ["simple_python_1", "irrelevance_1", "multi_turn_base_1"]
CATEGORIES = ["simple_python", "irrelevance", "multi_turn_base"]


def _load(python: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Entries by their first user message, and ground truths by id, from bfcl-eval's data."""
    data = package_dir(python, "bfcl_eval") / "data"
    entries, truths = {}, {}
    for cat in CATEGORIES:
        for line in (data / f"BFCL_v4_{cat}.json").read_text().splitlines():
            e = json.loads(line)
            if e["id"] in RIGHT + WRONG:
                entries[e["question"][0][0]["content"]] = e
        answers = data / "possible_answer" / f"BFCL_v4_{cat}.json"
        if answers.is_file():
            for line in answers.read_text().splitlines():
                a = json.loads(line)
                if a["id"] in RIGHT:
                    truths[a["id"]] = a["ground_truth"]
    assert len(entries) == len(RIGHT + WRONG)
    return entries, truths


def _single(truth: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first acceptable value of every parameter ('' marks an optional one: left out)."""
    calls = []
    for i, item in enumerate(truth):
        (name, params), = item.items()
        args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
        calls.append(tool_call(i, name.replace(".", "_"), args))  # BFCL's FC names use _ for .
    return calls


def _parse(call: str, tools: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    node = ast.parse(call, mode="eval").body
    name = node.func.id
    props = next(t["function"]["parameters"]["properties"] for t in tools if t["function"]["name"] == name)
    args = dict(zip(props, (ast.literal_eval(a) for a in node.args)))
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords})
    return name, args


def _script(entries: dict[str, dict[str, Any]], truths: dict[str, Any]):
    def answer(_stage: str, body: dict[str, Any], _index: int) -> Reply:
        msgs = body["messages"]
        users = [m for m in msgs if m["role"] == "user"]
        entry = entries[users[0]["content"]]
        eid, tools = entry["id"], body.get("tools") or []
        if eid.startswith("multi_turn"):
            since_user = msgs[max(i for i, m in enumerate(msgs) if m["role"] == "user") + 1:]
            if eid in WRONG or since_user:
                return Reply("I have finished this step.")
            turn = truths[eid][len(users) - 1]
            return Reply("", tool_calls=[tool_call(i, *_parse(c, tools)) for i, c in enumerate(turn)])
        if eid == "irrelevance_0":
            return Reply("None of the available functions can do that.")
        if eid == "irrelevance_1":
            name = tools[0]["function"]["name"]
            return Reply("", tool_calls=[tool_call(0, name, {})])
        if eid in WRONG:
            return Reply("", tool_calls=[tool_call(0, "no_such_function", {"x": 1})])
        return Reply("", tool_calls=_single(truths[eid]))

    return answer


def test_bfcl_suite_scores_with_bfcls_checker(tmp_path: Path) -> None:
    from rich.console import Console

    from awm.trainer.suites.bfcl import run_bfcl
    from awm.trainer.suites.table import Endpoint, render

    python = suite_python("bfcl")
    entries, truths = _load(python)
    ids = {c: [i for i in RIGHT + WRONG if i.startswith(c)] for c in CATEGORIES}
    with ScriptedLLM(_script(entries, truths)) as llm:
        report = run_bfcl(Endpoint(llm.base_url, "scripted/model_1"), python, tmp_path, ids=ids)
    assert [r.category for r in report.rows] == CATEGORIES
    assert all(r.cases == 2 and r.metrics["accuracy"] == 0.5 for r in report.rows), report.rows
    failed = report.details["failed"]
    assert sorted(i for ids in failed.values() for i in ids) == sorted(WRONG), failed
    summary = {r.category: r.metrics["accuracy"] for r in report.summary}
    assert summary == {"Hallucination": 0.5}  # no section was run whole: BFCL's section averages are left out
    console = Console(record=True, width=160)
    render(report, console)
    text = console.export_text()
    assert "simple_python" in text and "multi_turn_base" in text and "50.00" in text
    assert json.loads(report.write(tmp_path).read_text())["suite"] == "bfcl"
