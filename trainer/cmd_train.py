"""``awm train``: GRPO on a local fleet, from a training YAML (trainer/run.py runs it).

Exit codes: 0 the run finished, 2 a bad config or a fleet that cannot start, 3 the policy or the
environment instances are unavailable.
"""

from __future__ import annotations

import asyncio
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from awm.trainer.cmd_options import DatabaseUrlOpt, console, err


class VerifierKind(str, Enum):
    code = "code"
    judge = "judge"


def train(
    config: Annotated[Path, typer.Option("--config", "-c", exists=True, dir_okay=False, help="Training YAML.")],
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Override the number of steps.")] = None,
    run_dir: Annotated[Optional[str], typer.Option("--run-dir", help="Override the run directory.")] = None,
    mode: Annotated[Optional[str], typer.Option("--mode", help="async | sync")] = None,
    metrics_port: Annotated[Optional[int], typer.Option("--metrics-port", help="Serve Prometheus metrics here.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed")] = None,
    database_url: DatabaseUrlOpt = None,
    verifier_kind: Annotated[Optional[VerifierKind], typer.Option(
        "--verifier-kind", help="Override the config's verifier_kind (where a task has both): code is the "
                                "paper kit's code-only ablation of its judge reward.")] = None,
) -> None:
    """GRPO on a local fleet: rollouts, learner, checkpoints, metrics JSONL and a reward curve.
    ``--verifier-kind code`` overrides the config's verifier_kind (the paper kit's code-only
    ablation of its judge reward: docs/reproduce.md)."""
    from awm.trainer.config import TrainConfig

    try:
        cfg = TrainConfig.load(config, {"steps": steps, "run_dir": run_dir, "mode": mode,
                                        "metrics_port": metrics_port, "seed": seed, "database_url": database_url,
                                        "verifier_kind": verifier_kind.value if verifier_kind else None})
    except (ValueError, TypeError) as exc:
        err.print(f"[red]error in {config}:[/red] {exc}")
        raise typer.Exit(2) from exc
    from awm.trainer.run import train as run_training
    from awm.trainer.policy import PolicyUnavailable
    from awm.trainer.rollout import InstancesUnavailable

    console.print(f"awm train: {cfg.catalog} · {cfg.steps} steps × {cfg.groups_per_step} groups × "
                  f"{cfg.rollout.group_size} episodes · {cfg.mode} · run dir {cfg.run_dir}")

    from awm.fleet import FleetError

    try:
        result = asyncio.run(run_training(cfg, on_step=_show_step))
    except PolicyUnavailable as exc:
        err.print(f"[red]error: the policy is unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except InstancesUnavailable as exc:
        err.print(f"[red]error: the environment instances are unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except (ValueError, FleetError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console.print(f"reward: first step {result.first_reward} → last step {result.last_reward} "
                  f"({result.steps} steps)")
    console.print(f"wrote {result.run_dir / 'metrics.jsonl'}, {result.run_dir / 'reward_curve.png'}, "
                  f"{result.run_dir / 'trajectories.jsonl'}, {result.run_dir / 'checkpoints'}")
    if cfg.learner.distributed:  # a torchrun rank: a normal exit may abort in gloo's threads
        from awm.trainer.distributed import leave

        leave(0)


def _show_step(r: dict[str, Any]) -> None:
    """One line per training step, as it ends: the numbers to watch while a run goes."""
    console.print(f"step {r['step']:>4}  reward {r['reward_mean'] if r['reward_mean'] is not None else '-':>7}  "
                  f"success {r['success_rate'] if r['success_rate'] is not None else '-':>6}  "
                  f"masked {r['masked']}  rollouts/s {r['rollouts_per_s']:.2f}  "
                  f"env wait {r['env_wait_fraction']:.2f}  staleness {max(r['staleness'], default=0)}  "
                  f"loss {r['loss'] if r['loss'] is not None else '-'}")
