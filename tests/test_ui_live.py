"""A run's state and progress as `awm ui` infers them from its directory (awm.ui.runs.run_state):
running while its files are written, finished when its last step (or its eval.json) is there,
stopped when it went quiet short of its last step. The browser side: tests/test_ui_browser.py."""

from __future__ import annotations

import json
import os
import time

from starlette.testclient import TestClient

from awm.ui.app import UiState, build_app
from awm.ui.runs import QUIET_S, Runs, run_id, run_state


def train_dir(path, steps_logged: int, total: int, quiet_s: float = 0.0):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"steps": total, "seed": 0}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": 0.5, "step_s": 2.0}) + "\n"
                                                for s in range(1, steps_logged + 1)))
    if quiet_s:  # last written that long ago
        then = time.time() - quiet_s
        for name in ("config.json", "metrics.jsonl"):
            os.utime(path / name, (then, then))
    return path


def test_state_and_progress_from_the_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))
    root = tmp_path / "runs"
    running = train_dir(root / "running", 6, 45)
    done = train_dir(root / "done", 45, 45, quiet_s=86400)
    crashed = train_dir(root / "crashed", 6, 45, quiet_s=2 * QUIET_S)
    (root / "eval").mkdir()
    (root / "eval" / "eval.json").write_text(json.dumps({"k": 1, "environments": [], "overall": {"pass@1": 1.0}}))
    (root / "partial").mkdir()
    (root / "partial" / "eval.json").write_text(json.dumps({"k": 1, "environments": [], "overall": {},
                                                            "incomplete": "policy unavailable: refused"}))
    with TestClient(build_app(UiState(Runs([root])))) as client:
        runs = {r["name"]: r for r in client.get("/api/runs").json()}
        assert {n: r["state"] for n, r in runs.items()} == {
            "running": "running", "done": "finished", "crashed": "stopped", "eval": "finished", "partial": "stopped"}
        assert (runs["running"]["step"], runs["running"]["total_steps"]) == (6, 45)
        assert "crashed or was killed" in runs["crashed"]["state_reason"]
        assert "policy unavailable" in runs["partial"]["state_reason"]
        status = client.get(f"/api/runs/{run_id(running)}/status").json()
        assert status["state"] == "running" and status["step"] == 6 and status["sizes"]["metrics.jsonl"] > 0
        assert status["sizes"]["trajectories.jsonl"] is None
        assert client.get(f"/api/runs/{run_id(done)}").json()["status"]["state"] == "finished"
        assert client.get("/api/runs/000000000000/status").status_code == 404
        # the crashed run resumed: written again, it is running again
        with (crashed / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"step": 7, "reward_mean": 0.5}) + "\n")
        assert client.get(f"/api/runs/{run_id(crashed)}/status").json()["state"] == "running"


def test_a_slow_runs_quiet_limit_follows_its_steps():
    """A step of 20 minutes (a big model's learner step, no file written meanwhile) is not a crash
    after 5 minutes of quiet; a run of unknown length that went quiet is idle, not stopped."""
    slow = [{"step": 1, "step_s": 1200.0}]
    now = 10_000.0
    assert run_state(slow, 10, None, now - 1800, now)[0] == "running"
    assert run_state(slow, 10, None, now - 4000, now)[0] == "stopped"
    assert run_state([], None, None, now - 4000, now)[0] == "idle"
    assert run_state([], None, None, now - 10, now)[0] == "running"
