"""``awm eval``: a policy over environments and tasks, k samples each, pass@1 and pass@k.

Every task runs k episodes on instances reset to its snapshot (a GRPO group, without training).
pass@k uses the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)`` for n
scored samples of which c are complete; masked episodes (our failures) are not samples. A task
left with fewer than k scored samples has no pass@k (the estimator needs n >= k; pass@n in its
place would understate it): averages skip it and the report counts it as ``short``. The
report is a table, a JSON document and a PNG bar chart, and every episode is in the
trajectory JSONL.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from awm.bundle import EnvBundle
from awm.gates import gate_status
from awm.trainer.agent import AgentConfig
from awm.trainer.policy import Policy, PolicyUnavailable
from awm.episode.reward import RewardConfig
from awm.trainer.rollout import InstanceSource, RolloutConfig, RolloutService, TaskRef
from awm.trainer.trajectory import Trajectory, TrajectoryLog


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from the n (c correct) is correct."""
    if n < k or k < 1:
        raise ValueError(f"pass@{k} needs at least {k} samples, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class TaskScore:
    env: str
    task_id: str
    samples: int
    complete: int
    masked: int
    mean_reward: float | None
    pass_at_1: float
    pass_at_k: float | None  # None: fewer than k scored samples


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(sum(present) / len(present), 4) if present else None


@dataclass
class EnvScore:
    env: str
    tasks: list[TaskScore] = field(default_factory=list)

    def summary(self, k: int) -> dict[str, Any]:
        scored = [t for t in self.tasks if t.samples]
        return {"env": self.env, "tasks": len(self.tasks), "episodes": sum(t.samples + t.masked for t in self.tasks),
                "masked": sum(t.masked for t in self.tasks),
                "short": sum(t.pass_at_k is None for t in self.tasks),
                "pass@1": _mean([t.pass_at_1 for t in scored]),
                f"pass@{k}": _mean([t.pass_at_k for t in scored]),
                "mean_reward": _mean([t.mean_reward for t in scored])}


def score_task(env: str, task_id: str, trajectories: list[Trajectory], k: int) -> TaskScore:
    scored = [t for t in trajectories if not t.masked]
    complete = sum(t.verdict.get("verdict") == "complete" for t in scored)
    mean = sum(t.reward for t in scored) / len(scored) if scored else None
    return TaskScore(env, task_id, len(scored), complete, len(trajectories) - len(scored),
                     None if mean is None else round(mean, 4),
                     round(pass_at_k(len(scored), complete, 1), 4) if scored else 0.0,
                     round(pass_at_k(len(scored), complete, k), 4) if len(scored) >= k else None)


async def evaluate(source: InstanceSource, policy: Policy, tasks: list[TaskRef], k: int, agent: AgentConfig,
                   reward: RewardConfig, log: TrajectoryLog | None = None,
                   on_task: Callable[[TaskScore], None] | None = None) -> list[EnvScore]:
    """k episodes of every task, all tasks concurrently (instances bound the concurrency).
    When the policy endpoint fails for good, no new episode starts, the running ones finish (and
    are reported through ``on_task``), then the failure is raised."""
    service = RolloutService(source, policy, tasks, agent, reward, RolloutConfig(group_size=k), log)

    async def one(task: TaskRef) -> TaskScore:
        group = await service.run_group(task)
        result = score_task(task.env, task.task_id, group.trajectories, k)
        if on_task:
            on_task(result)
        return result

    results = await asyncio.gather(*(one(t) for t in tasks), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, PolicyUnavailable):
            raise r  # e.g. InstancesUnavailable: the fleet, not the policy, failed
    if service.policy_failure is not None:
        raise service.policy_failure
    return by_environment([r for r in results if isinstance(r, TaskScore)])


def by_environment(results: list[TaskScore]) -> list[EnvScore]:
    """Task scores grouped per environment, in the order the environments first appear."""
    by_env: dict[str, EnvScore] = {}
    for result in results:
        by_env.setdefault(result.env, EnvScore(result.env)).tasks.append(result)
    return list(by_env.values())


def running_summary(done: list[TaskScore]) -> dict[str, Any]:
    """Progress of an evaluation so far, for a campaign's status: tasks finished, mean reward
    and pass@1 and pass@k per environment over the finished tasks."""
    by_env: dict[str, list[TaskScore]] = {}
    for t in done:
        if t.samples:
            by_env.setdefault(t.env, []).append(t)
    rewards = [t.mean_reward for t in done if t.mean_reward is not None]
    return {"step": len(done), "reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
            "pass_rates": {env: _mean([t.pass_at_1 for t in ts]) for env, ts in by_env.items()},
            "pass_at_k": {env: v for env, ts in by_env.items() if (v := _mean([t.pass_at_k for t in ts])) is not None}}


BOOTSTRAP_RESAMPLES = 2000


def interval95(values: list[float | None], seed: int = 0) -> list[float] | None:
    """A 95 % confidence interval of the mean of per-task values (pass@1, pass@k): the 2.5th and
    97.5th percentiles of the mean over tasks resampled with replacement (a percentile bootstrap,
    seeded, so a report is reproducible). Tasks are the unit: a task's k samples are not
    independent draws of the benchmark. None below two tasks."""
    present = [v for v in values if v is not None]
    if len(present) < 2:
        return None
    rng = random.Random(seed)
    n = len(present)
    means = sorted(sum(rng.choice(present) for _ in range(n)) / n for _ in range(BOOTSTRAP_RESAMPLES))
    return [round(means[int(0.025 * (len(means) - 1))], 4), round(means[int(0.975 * (len(means) - 1))], 4)]


def checkpoint_of(path: Path) -> dict[str, Any]:
    """Where an evaluated checkpoint comes from: its path, and for a training run's checkpoint
    (``RUN/checkpoints/step-NNNNNN``) the run's directory and the step, so that the run's page can
    draw pass@1 over the checkpoints it was evaluated at."""
    out: dict[str, Any] = {"path": str(path.resolve())}
    match = re.fullmatch(r"step-(\d+)", path.name)
    if match and path.parent.name == "checkpoints":
        out.update(run_dir=str(path.parent.parent.resolve()), step=int(match.group(1)))
    return out


def report(scores: list[EnvScore], k: int, model: str, settings: dict[str, Any] | None = None,
           checkpoint: dict[str, Any] | None = None) -> dict[str, Any]:
    """The evaluation's report (``eval.json``): per environment and overall pass@1 and pass@k with
    95 % intervals over tasks, and what produced them (``settings``: decoding, turns, tool format,
    date; ``checkpoint``: :func:`checkpoint_of`)."""
    envs = [s.summary(k) for s in scores]
    for env, score in zip(envs, scores):
        scored = [t for t in score.tasks if t.samples]
        env["pass@1_ci95"] = interval95([t.pass_at_1 for t in scored])
        env[f"pass@{k}_ci95"] = interval95([t.pass_at_k for t in scored])
    tasks = [t for s in scores for t in s.tasks if t.samples]
    overall = {"tasks": sum(e["tasks"] for e in envs), "episodes": sum(e["episodes"] for e in envs),
               "masked": sum(e["masked"] for e in envs), "short": sum(e["short"] for e in envs),
               "pass@1": _mean([t.pass_at_1 for t in tasks]), f"pass@{k}": _mean([t.pass_at_k for t in tasks]),
               "pass@1_ci95": interval95([t.pass_at_1 for t in tasks]),
               f"pass@{k}_ci95": interval95([t.pass_at_k for t in tasks])}
    return {"model": model, "k": k, "environments": envs, "overall": overall,
            **({"settings": settings} if settings else {}), **({"checkpoint": checkpoint} if checkpoint else {}),
            "tasks": [asdict(t) for s in scores for t in s.tasks]}


def plot(data: dict[str, Any], path: Path | str) -> Path:
    """Grouped bars: pass@1 and pass@k per environment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = data["k"]
    envs = data["environments"]
    names = [e["env"] for e in envs]
    x = range(len(names))
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(4.5, 1.4 * len(names) + 2), 4), dpi=110)
    ax.bar([i - width / 2 for i in x], [e["pass@1"] or 0 for e in envs], width, label="pass@1")
    ax.bar([i + width / 2 for i in x], [e[f"pass@{k}"] or 0 for e in envs], width, label=f"pass@{k}")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("fraction of tasks")
    ax.set_title(f"awm eval: {data['model']} (k={k})")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def select_tasks(bundles: list[EnvBundle], task_ids: list[str] | None = None, allow_ungated: bool = False,
                 verifier_kind: str | None = None) -> list[TaskRef]:
    """The tasks to run: the chosen ones that passed both gates (awm.gates), or all chosen ones
    with ``allow_ungated`` (the env servers then mark their episodes ungated)."""
    return [TaskRef(b.name, t.id) for b in bundles for t in b.tasks
            if (not task_ids or t.id in task_ids) and (allow_ungated or gate_status(b, t, verifier_kind)[0])]
