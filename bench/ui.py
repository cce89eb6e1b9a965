"""`awm ui` on a large run: first paint of a run page with 100,000 episodes, indexed against not.

    python -m bench.ui [--episodes 100000]     # prints JSON

Writes a synthetic run directory (trajectories.jsonl in the trainer's own format, written with
awm.trainer.trajectory.TrajectoryLog, 16 episodes per step, two turns each with a tool call and its
database diff; metrics.jsonl one line per step), starts `awm ui` on it as a user would, and
measures in Debian's chromium (selenium; the same setup as tests/test_ui_browser.py):

* ``first_paint_cold_ms``  navigation to the run page drawn (headline numbers, reward curve) when
  the index does not exist yet (its build starts in the background), and
  ``episode_list_cold_ms`` to its first page of episodes, after the build;
* ``first_paint_ms``       the run page with its first page of episodes, index built (median of 5);
                           its metric panels are the 12 shown by default of the 31 a step logs;
* ``all_panels_ms``        the same page with all 31 metrics chosen (median of 3);
* ``episode_paint_ms``     an episode page (median of 5);
* ``first_contentful_paint_ms`` the browser's own paint timing of the warm run page;
* API medians: the first page, the last page, a filtered page, one episode;
* the baseline: the same first page by scanning the log without an index (``scan_page``), what
  every page would cost without one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


import httpx

from bench.runtime import machine
from awm.trainer.trajectory import Trajectory, TrajectoryLog, Turn
from awm.ui.index import EpisodeFilter, scan_page
from awm.ui.runs import run_id

PER_STEP = 16


def episode(n: int) -> Trajectory:
    color = ["red", "green", "blue", "yellow"][n % 4]
    complete = color == "green"
    diff = {"lamps": {"key": ["id"], "inserted": [], "deleted": [], "truncated": False,
                      "updated": [{"before": {"id": n % 4 + 1, "color": color, "is_on": False},
                                   "after": {"id": n % 4 + 1, "color": color, "is_on": True}}]}}
    turns = [Turn(0, {"role": "assistant", "content": f'<tool_call>{{"name":"switch_on","arguments":{{"color":"{color}"}}}}</tool_call>'},
                  [{"id": "call_0_0", "name": "switch_on", "arguments": {"color": color}}],
                  [{"tool_call_id": "call_0_0", "name": "switch_on", "is_error": False, "error_kind": None,
                    "text": json.dumps({"on": color}), "ms": 2.1, "diff": diff}], "text", 12.0, 2.1, n // PER_STEP,
                  prompt_tokens=180, completion_tokens=3),
             Turn(1, {"role": "assistant", "content": "done"}, [], [], "none", 10.0, 0.0, n // PER_STEP,
                  prompt_tokens=200, completion_tokens=1)]
    return Trajectory(f"{n:016x}", "lamps", "green_on", "Switch on the green lamp and nothing else.", "tiny",
                      "awm_i_bench_lamps_0", f"g{n // 8}", n % 8, n // PER_STEP,
                      messages=[{"role": "system", "content": "You are an agent that completes tasks by calling tools. "
                                                              "Environment: a room with four lamps."},
                                {"role": "user", "content": "Switch on the green lamp and nothing else."}],
                      turns=turns, final_answer="done", stop_reason="answer",
                      verdict={"verdict": "complete" if complete else "incomplete", "reason": f"lamps on: ['{color}']"},
                      diff={"lamps": {"inserted": 0, "updated": 1, "deleted": 0}}, reward=1.0 if complete else 0.0,
                      reward_components={"outcome": 1.0 if complete else 0.0}, timings={"wall_ms": 30.0})


def metrics_record(step: int) -> dict[str, Any]:
    """A step's record with every key awm's trainer logs (trainer/learner.py: _train_step and the
    learner's stats), so the run page draws as many panels as a real run's."""
    return {"step": step, "version": step, "group_ids": [f"g{2 * step - 2}", f"g{2 * step - 1}"], "episodes": PER_STEP,
            "masked": 0, "reward_mean": 0.25, "reward_std": 0.433, "reward_distribution": {"0": 12, "1": 4},
            "success_rate": 0.25, "episode_turns_mean": 2.0, "zero_advantage_groups": 0, "tool_calls": PER_STEP,
            "generated_tokens": 4 * PER_STEP, "rollouts_per_s": 8.0, "tokens_per_s": 32.0, "staleness": [0, 1],
            "dropped_stale": 0, "step_s": 2.0, "wait_s": 0.4, "weight_sync_s": 0.01, "env_wait_fraction": 0.2,
            "elapsed_s": 2.0 * step, "learner_s": 1.5, "sequences": PER_STEP, "trained_tokens": 400,
            "loss": 0.5 / step, "kl": 0.001 * step ** 0.5, "clip_fraction": 0.02, "ratio_mean": 1.0,
            "grad_norm": 1.0 / step, "logprob_gap": 0.01, "logprob_gap_signed": -0.002, "tis_truncated_fraction": 0.0}


def write_run(run: Path, episodes: int) -> None:
    log = TrajectoryLog(run / "trajectories.jsonl")
    with (run / "metrics.jsonl").open("w") as metrics:
        for n in range(episodes):
            t = episode(n)
            log.start(t)
            for turn in t.turns:
                log.turn(t, turn)
            log.end(t)
            if n % PER_STEP == PER_STEP - 1:
                step = n // PER_STEP + 1
                log.write("step", {"step": step, "version": step, "groups": [f"g{n // 8 - 1}", f"g{n // 8}"]})
                metrics.write(json.dumps(metrics_record(step)) + "\n")
    log.close()


def median_ms(fn, n: int = 5) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 1)


def browser(profile: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")  # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=shutil.which("chromedriver")))


def paint_ms(driver, url: str, page: str, then: str | None = None) -> tuple[float, float | None]:  # type: ignore[no-untyped-def]
    """Navigation start to the page drawn (the app sets body[data-ready] after it rendered), and
    to the element ``then`` on it (the episode list, which a first open draws after indexing)."""
    driver.get("about:blank")
    t0 = time.perf_counter()
    driver.get(url)
    while driver.execute_script("return document.body && document.body.dataset.ready") != page:
        time.sleep(0.005)
    drawn = round((time.perf_counter() - t0) * 1000, 1)
    if then is None:
        return drawn, None
    while not driver.execute_script("return !!document.querySelector(arguments[0])", then):
        time.sleep(0.005)
    return drawn, round((time.perf_counter() - t0) * 1000, 1)


def main() -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=100_000)
    args = parser.parse_args()
    load = round(os.getloadavg()[0], 2)
    work = Path(tempfile.mkdtemp(prefix="awm-bench-ui-"))
    run = work / "runs" / "big"
    run.mkdir(parents=True)
    t0 = time.perf_counter()
    write_run(run, args.episodes)
    out: dict[str, Any] = {"loadavg_1m_before": load, "episodes": args.episodes, "log_mb": round((run / "trajectories.jsonl").stat().st_size / 2**20, 1),
                           "write_s": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    total, rows = scan_page(run / "trajectories.jsonl", EpisodeFilter(), 0, 50)
    out["baseline_unindexed_first_page_ms"] = round((time.perf_counter() - t0) * 1000, 1)
    assert total == args.episodes and len(rows) == 50
    env = dict(os.environ, AWM_HOME=str(work / "home"))  # a fresh index directory
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "ui", "--runs", str(work / "runs"), "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        url = None
        while url is None:
            line = proc.stderr.readline()
            if not line:
                raise SystemExit("awm ui exited")
            found = re.search(r"awm ui on (http://\S+)", line)
            url = found.group(1) if found else None
        rid = run_id(run)
        driver = browser(work / "chromium")
        try:
            # the first open builds the index: the page draws at once, the episode list when it is built
            out["first_paint_cold_ms"], out["episode_list_cold_ms"] = paint_ms(driver, f"{url}#/run/{rid}", "run",
                                                                               "#episode-count")
            out["first_paint_ms"] = statistics.median(paint_ms(driver, f"{url}#/run/{rid}", "run", "#episode-count")[1]
                                                      for _ in range(5))
            out["first_contentful_paint_ms"] = round(driver.execute_script(
                "return performance.getEntriesByName('first-contentful-paint')[0].startTime"), 1)
            keys = list(metrics_record(1))
            driver.execute_script("localStorage.setItem('awm-ui-metrics', JSON.stringify({chosen: arguments[0]}))",
                                  keys + ["staleness_mean", "staleness_max"])
            out["all_panels_ms"] = statistics.median(paint_ms(driver, f"{url}#/run/{rid}", "run", "#episode-count")[1]
                                                     for _ in range(3))
            out["panels_drawn"] = driver.execute_script("return document.querySelectorAll('figure.panel').length")
            driver.execute_script("localStorage.removeItem('awm-ui-metrics')")
            some = f"{args.episodes // 2:016x}"
            out["episode_paint_ms"] = statistics.median(paint_ms(driver, f"{url}#/episode/{rid}/{some}", "episode")[0]
                                                        for _ in range(5))
        finally:
            driver.quit()
        with httpx.Client(base_url=url, timeout=60) as api:
            base = f"/api/runs/{rid}"
            out["api_ms"] = {
                "summary": median_ms(lambda: api.get(base).raise_for_status()),
                "first_page": median_ms(lambda: api.get(base + "/episodes?limit=50").raise_for_status()),
                "last_page": median_ms(lambda: api.get(base + f"/episodes?limit=50&offset={args.episodes - 50}")
                                       .raise_for_status()),
                "filtered_page": median_ms(lambda: api.get(base + "/episodes?verdict=complete&step=100&limit=50")
                                           .raise_for_status()),
                "episode": median_ms(lambda: api.get(base + f"/episodes/{some}").raise_for_status()),
            }
        out["index_mb"] = round(sum(p.stat().st_size for p in (work / "home" / "ui-index").iterdir()) / 2**20, 1)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)
    out["machine"] = {**machine(), "loadavg_1m_after": round(os.getloadavg()[0], 2)}  # others' load skews timings
    return out


if __name__ == "__main__":
    result = main()
    print(json.dumps(result, indent=2))
