"""``awm eval``: k samples per task from a scripted endpoint on a served catalog; pass@1 / pass@k."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.llm_server import Reply, ScriptedLLM
from awm.trainer.eval import TaskScore, pass_at_k, running_summary

NOTES = Path(__file__).parent / "fixtures" / "notes"


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2) / C(4,2)
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(5, 1, 2) == pytest.approx(1 - 6 / 10)  # 1 - C(4,2) / C(5,2)
    with pytest.raises(ValueError, match="needs at least 4 samples"):
        pass_at_k(3, 3, 4)


def test_a_task_short_of_k_samples_has_no_pass_at_k():
    """Two of four episodes masked (our failures): pass@4 over two samples would be pass@2 under
    another name. The task keeps its pass@1, has no pass@4, and the report counts it short."""
    from awm.trainer.eval import EnvScore, report, score_task
    from awm.trainer.trajectory import Trajectory

    def traj(verdict: str, masked: bool = False) -> Trajectory:
        t = Trajectory(episode_id="e", env="crm", task_id="t", instruction="", policy="p")
        t.verdict, t.masked, t.reward = {"verdict": verdict}, masked, float(verdict == "complete")
        return t

    short = score_task("crm", "t", [traj("complete"), traj("incomplete"), traj("error", True), traj("error", True)], 4)
    assert (short.samples, short.masked, short.pass_at_1, short.pass_at_k) == (2, 2, 0.5, None)
    full = score_task("crm", "u", [traj("incomplete")] * 3 + [traj("complete")], 4)
    assert full.pass_at_k == 1.0
    data = report([EnvScore("crm", [short, full])], 4, "m")
    (env,) = data["environments"]
    assert env["pass@1"] == pytest.approx((0.5 + 0.25) / 2) and env["pass@4"] == 1.0 and env["short"] == 1
    assert data["overall"]["short"] == 1 and data["overall"]["pass@4"] == 1.0


def awm_eval(answer, pg, *args, launcher=("-m", "awm.cli")):
    """``awm eval`` of the notes fixture (2 instances, 3 turns) against a scripted endpoint
    (``launcher``: how python starts the CLI)."""
    with ScriptedLLM(answer) as llm:
        environ = dict(os.environ, AWM_HOME=str(pg.root.parent))
        environ.pop("AWM_DATABASE_URL", None)
        return subprocess.run(
            [sys.executable, *launcher, "eval", "--base-url", llm.base_url, "--model", "scripted",
             "--catalog", str(NOTES), "--replicas", "2", "--max-turns", "3", *args],
            capture_output=True, text=True, env=environ, timeout=300)


# `awm` as the evaluation image runs it (images/trainer/Dockerfile with EXTRAS=eval): torch,
# transformers and peft are not installed, so importing any of them fails.
WITHOUT_TORCH = """
import importlib.abc, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "transformers", "peft"):
            raise ModuleNotFoundError(f"No module named {name!r} (not in the evaluation image)", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import awm.trainer.k8s_source  # what `awm eval` uses inside a campaign's Job
from awm.cli import main
sys.argv[0] = "awm"
main()
"""


def test_awm_eval_of_an_endpoint_needs_no_torch(pg, tmp_path):
    """The evaluation image has no torch: `awm eval --base-url` runs episodes, scores them and
    writes its report and plot without importing torch, transformers or peft."""
    def answer(stage, body, index):
        instruction = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if instruction.startswith("Add a note") and turn == 0:
            return Reply('<tool_call>{"name": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs"}}'
                         '</tool_call>')
        return Reply("Done.")

    out = tmp_path / "eval"
    result = awm_eval(answer, pg, "--task", "add_note", "--task", "archive_first", "-k", "2", "--out", str(out),
                      launcher=("-c", WITHOUT_TORCH))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "eval.json").read_text())
    tasks = {t["task_id"]: t["pass_at_1"] for t in report["tasks"]}
    assert tasks == {"add_note": 1.0, "archive_first": 0.0} and report["overall"]["episodes"] == 4
    assert (out / "eval.png").stat().st_size > 5_000


def test_awm_eval_reports_pass_at_k_per_environment(pg, tmp_path):
    """add_note always solved, count_notes never, archive_first in every other episode."""
    archive_attempts = itertools.count()

    def answer(stage, body, index):
        instruction = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if instruction.startswith("Add a note"):
            if turn == 0:
                return Reply('<tool_call>{"name": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs"}}'
                             '</tool_call>')
            return Reply("Added.")
        if instruction.startswith("How many"):
            return Reply("You have 7 notes.")
        if turn == 0:
            attempt = next(archive_attempts)
            return Reply('<tool_call>{"name": "archive_note", "arguments": {"note_id": %d}}</tool_call>'
                         % (1 if attempt % 2 == 0 else 2))
        return Reply("Archived.")

    out = tmp_path / "eval"
    result = awm_eval(answer, pg, "--task", "add_note", "--task", "count_notes", "--task", "archive_first",
                      "-k", "4", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pass@1" in result.stdout and "pass@4" in result.stdout and "notes" in result.stdout
    report = json.loads((out / "eval.json").read_text())
    (env,) = report["environments"]
    assert env["env"] == "notes" and env["tasks"] == 3 and env["episodes"] == 12 and env["masked"] == 0
    tasks = {t["task_id"]: t for t in report["tasks"]}
    assert (tasks["add_note"]["pass_at_1"], tasks["add_note"]["pass_at_k"]) == (1.0, 1.0)
    assert (tasks["count_notes"]["pass_at_1"], tasks["count_notes"]["pass_at_k"]) == (0.0, 0.0)
    assert (tasks["archive_first"]["complete"], tasks["archive_first"]["pass_at_1"]) == (2, 0.5)
    assert tasks["archive_first"]["pass_at_k"] == 1.0
    assert env["pass@1"] == pytest.approx(0.5) and env["pass@4"] == pytest.approx(0.6667, abs=1e-4)
    assert (out / "eval.png").stat().st_size > 5_000
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["event"] == "end" for line in lines) == 12
    once = awm_eval(answer, pg, "--task", "add_note", "-k", "1", "--out", str(tmp_path / "once"))
    assert once.returncode == 0, once.stderr[-3000:]
    header = next(line for line in once.stdout.splitlines() if "mean reward" in line)
    assert header.count("pass@1") == 1, header  # k=1: one column, not pass@1 twice


def awm_verify(pg, run_dir, *args):
    environ = dict(os.environ, AWM_HOME=str(pg.root.parent))
    environ.pop("AWM_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "awm.cli", "verify", str(run_dir), "--catalog", str(NOTES), *args],
                          capture_output=True, text=True, env=environ, timeout=300)


def test_awm_verify_replays_a_saved_run_with_the_live_verdicts(pg, tmp_path):
    """Offline re-verification of an `awm eval` run gives the live verdicts; a tampered run is
    caught: a final answer changed (different verdict), a tool call changed (diverged replay)."""
    def answer(stage, body, index):
        instruction = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if instruction.startswith("Add a note"):
            return Reply('<tool_call>{"name": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs"}}'
                         '</tool_call>' if turn == 0 else "Added.")
        if instruction.startswith("How many"):
            return Reply('<tool_call>{"name": "list_notes", "arguments": {}}</tool_call>' if turn == 0
                         else "You have 3 notes.")
        return Reply('<tool_call>{"name": "archive_note", "arguments": {"note_id": 1}}</tool_call>' if turn == 0
                     else "Archived.")

    out = tmp_path / "eval"
    result = awm_eval(answer, pg, "--task", "add_note", "--task", "count_notes", "--task", "archive_first",
                      "-k", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    verified = awm_verify(pg, out, "--json")
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-3000:]
    assert json.loads(verified.stdout.strip().splitlines()[-1]) == {
        "episodes": 6, "replayed": 6, "same": 6, "different": 0, "diverged": 0, "skipped": 0}
    rows = [json.loads(line) for line in (out / "verify.jsonl").read_text().splitlines()]
    assert sorted((r["task_id"], r["live"], r["offline"]) for r in rows) == sorted(
        [("add_note", "complete", "complete")] * 2 + [("count_notes", "complete", "complete")] * 2
        + [("archive_first", "complete", "complete")] * 2)

    # Tamper with the saved run: another final answer, and another tool argument.
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    tampered, done = [], set()
    for line in lines:
        event = json.loads(line)
        if event["event"] == "end" and event["task_id"] == "count_notes" and "count" not in done:
            event["final_answer"], _ = "You have 12 notes.", done.add("count")
        if event["event"] == "end" and event["task_id"] == "archive_first" and "archive" not in done:
            event["turns"][0]["tool_calls"][0]["arguments"] = {"note_id": 999}
            done.add("archive")
        tampered.append(json.dumps(event))
    (out / "trajectories.jsonl").write_text("\n".join(tampered) + "\n")
    caught = awm_verify(pg, out, "--json")
    assert caught.returncode == 1
    totals = json.loads(caught.stdout.strip().splitlines()[-1])
    assert (totals["same"], totals["different"], totals["diverged"]) == (4, 2, 1)
    rows = {(r["task_id"], r["same"]): r for r in map(json.loads, (out / "verify.jsonl").read_text().splitlines())}
    assert rows[("count_notes", False)]["offline"] == "incomplete"
    assert rows[("archive_first", False)]["diverged_at"] == 1


def test_awm_eval_keeps_what_finished_when_the_endpoint_goes_away(pg, tmp_path):
    """add_note's episodes finish; then the endpoint fails for good: exit 3 with a partial
    report (marked incomplete) and the finished trajectories kept. Running episodes finish; none
    starts after the failure."""
    import threading

    lock, add_started, both_started = threading.Lock(), [0], threading.Event()

    def answer(stage, body, index):
        instruction = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if not instruction.startswith("Add a note"):
            # fail for good once add_note's two episodes are under way (until then: busy, retried)
            if not both_started.is_set():
                return Reply("busy", status=503)
            return Reply("endpoint is gone", status=401)
        if sum(1 for m in body["messages"] if m["role"] == "assistant") == 0:
            with lock:
                add_started[0] += 1
                if add_started[0] == 2:
                    both_started.set()
            return Reply('<tool_call>{"name": "add_note", "arguments": {"title": "groceries", "body": "milk, eggs"}}'
                         '</tool_call>')
        return Reply("Added.")

    out = tmp_path / "eval"
    # 4 instances: both groups start together; count_notes' failure stops the run, add_note's finish
    result = awm_eval(answer, pg, "--task", "add_note", "--task", "count_notes", "-k", "2", "--replicas", "4",
                      "--out", str(out))
    assert result.returncode == 3, result.stderr[-3000:]
    assert "policy endpoint is unavailable" in result.stderr and "HTTP 401" in result.stderr
    report = json.loads((out / "eval.json").read_text())
    assert report["incomplete"].startswith("policy unavailable") and report["tasks_selected"] == 2
    assert len(report["tasks"]) == 1, result.stdout[-2000:] + result.stderr[-3000:]
    (finished,) = report["tasks"]
    assert (finished["task_id"], finished["pass_at_1"]) == ("add_note", 1.0)
    ends = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sum(e["event"] == "end" and e["task_id"] == "add_note" for e in ends) == 2


def test_running_summary_for_a_campaign_status():
    done = [TaskScore("crm", "a", 4, 2, 0, 0.5, 0.5, 1.0), TaskScore("crm", "b", 4, 0, 0, 0.0, 0.0, 0.0),
            TaskScore("hotel", "c", 0, 0, 4, None, 0.0, None)]  # all masked: not scored
    assert running_summary(done) == {"step": 3, "reward_mean": 0.25, "pass_rates": {"crm": 0.25},
                                     "pass_at_k": {"crm": 0.5}}


def test_awm_eval_takes_a_training_configs_evaluation_settings(pg, tmp_path):
    """Issue 44: `awm eval --config examples/paper/qwen3-8b.yaml` evaluates as the paper pins it -
    temperature 0.6, top-p 0.95, top-k 20, history 10, its agent's tool format and turns, thinking
    on (and a reply without its block a format error) - and a flag given on the command line wins
    (here --max-turns 3). The report records the settings and the config."""
    bodies = []

    def answer(stage, body, index):
        bodies.append(body)
        return Reply("<think>nothing to do</think>Done.")

    paper = Path(__file__).resolve().parents[1] / "examples" / "paper" / "qwen3-8b.yaml"
    out = tmp_path / "eval"
    result = awm_eval(answer, pg, "--config", str(paper), "--task", "add_note", "-k", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert bodies
    for body in bodies:
        assert body["temperature"] == 0.6 and body["top_p"] == 0.95 and body["top_k"] == 20, body
        assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["max_tokens"] == 2048
        assert "tools" not in body  # the awm format: the meta-tools in the prompt, not native tools
    settings = json.loads((out / "eval.json").read_text())["settings"]
    assert settings["config"] == str(paper) and settings["temperature"] == 0.6 and settings["history_window"] == 10
    assert (settings["top_p"], settings["top_k"], settings["tool_format"], settings["thinking"]) == (0.95, 20, "awm", True)
    assert settings["max_turns"] == 3  # given on the command line
    bad = awm_eval(answer, pg, "--config", str(tmp_path / "missing.yaml"), "--task", "add_note", "--out", str(out))
    assert bad.returncode == 2 and "--config" in bad.stderr
