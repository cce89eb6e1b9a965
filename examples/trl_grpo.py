"""GRPO with TRL's ``GRPOTrainer`` on awm: the tiny model on this machine's CPU, a local fleet.

    pip install -e '.[envserver,trainer,trl]'        # in a checkout (a built wheel: 'awm-fleet[...]')
    python examples/trl_grpo.py                       # the settings of examples/train-tiny.yaml
    python examples/trl_grpo.py --steps 10 --json     # a shorter run; a JSON summary on stdout

It reads ``examples/train-tiny.yaml`` (awm's own CPU demo) for the environment, the task, the
tiny model and the agent and reward settings, and hands the training to TRL instead of
``awm train``; what maps to what (docs/integrations.md, TRL):

    rollout.group_size        -> GRPOConfig.num_generations (one GRPO group = one group claim)
    groups_per_step x G       -> per_device_train_batch_size (one optimiser step per batch)
    steps, grpo.lr, clip_eps  -> max_steps, learning_rate, epsilon
    grpo.kl_coef              -> beta
    grpo.loss_agg token_mean  -> loss_type "dapo" (token mean); seq_mean -> "grpo"
    reward                    -> awm's reward per episode (masked episodes: None -> advantage 0)

The model is built from the config (nothing is downloaded): its output vocabulary is a handful
of whole tool calls (trainer/tiny.py), so a random policy finds the rewarded call by chance and
GRPO makes it the habit. For a real model, pass ``model=`` a Hugging Face model id or path and
drop ``sampling``'s allowed tokens; everything else stays.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, too

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

HERE = Path(__file__).resolve().parent


def run(config: Path, steps: int | None, output_dir: Path, database_url: str | None) -> dict[str, Any]:
    """Train; returns the per-step reward (TRL's log) and what the rollouts did."""
    from trl import GRPOConfig, GRPOTrainer

    from awm import catalog as catalog_mod
    from awm.fleet import Database, LocalFleet
    from awm.episode.sources import PoolSource
    from awm.integrations.loop import shared_loop
    from awm.integrations.trl_env import AwmRollout, awm_reward, task_dataset
    from awm.trainer import tiny
    from awm.trainer.agent import DEFAULT_SYSTEM
    from awm.trainer.config import TrainConfig
    from awm.trainer.eval import select_tasks
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.trajectory import TrajectoryLog

    overrides: dict[str, Any] = {"run_dir": str(output_dir)}
    if steps is not None:
        overrides["steps"] = steps
    if database_url:
        overrides["database_url"] = database_url
    cfg = TrainConfig.load(config, overrides)
    bundles = catalog_mod.load(cfg.catalog, cfg.envs or None)
    tasks = select_tasks(bundles, cfg.tasks, cfg.allow_ungated, cfg.verifier_kind)
    corpus = [cfg.agent.system_prompt, DEFAULT_SYSTEM, *(b.scenario.description for b in bundles),
              *(t.instruction for b in bundles for t in b.tasks), *(tool.name for b in bundles for tool in b.tools)]
    tokenizer = tiny.build_tokenizer(corpus, cfg.policy.tiny.actions, cfg.policy.tiny.max_vocab_words)
    tokenizer.padding_side = "left"
    model = tiny.build_model(len(tokenizer), cfg.policy.tiny, cfg.seed)
    sampling = SamplingSpec(cfg.policy.temperature, cfg.policy.max_new_tokens,
                            tiny.allowed_ids(tokenizer, cfg.policy.tiny.actions))
    group = cfg.rollout.group_size
    args = GRPOConfig(
        output_dir=str(output_dir), max_steps=cfg.steps, seed=cfg.seed, use_cpu=True,
        num_generations=group, per_device_train_batch_size=group * cfg.groups_per_step,
        learning_rate=cfg.grpo.lr, lr_scheduler_type="constant", warmup_steps=0, beta=cfg.grpo.kl_coef,
        epsilon=cfg.grpo.clip_eps, temperature=cfg.policy.temperature,
        loss_type="dapo" if cfg.grpo.loss_agg == "token_mean" else "grpo",
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True)

    loop = shared_loop()
    database = Database.open(cfg.database_url)
    fleet = LocalFleet(bundles, cfg.replicas, database, **cfg.serving())
    try:
        loop.run(fleet.start())
        rollout = AwmRollout(PoolSource.from_fleet(fleet), loop=loop, agent=cfg.agent, reward=cfg.reward,
                             sampling=sampling, scenarios={b.name: b.scenario.description for b in bundles},
                             log=TrajectoryLog(output_dir / "trajectories.jsonl"), seed=cfg.seed)
        trainer = GRPOTrainer(model=model, reward_funcs=awm_reward, args=args, processing_class=tokenizer,
                              train_dataset=task_dataset(bundles, tasks, repeat=cfg.groups_per_step * cfg.steps),
                              rollout_func=rollout)
        trainer.train()
    finally:
        loop.run(fleet.stop())
        database.close()
    records = [h for h in trainer.state.log_history if "reward" in h]
    return {"steps": len(records), "reward": [r["reward"] for r in records],
            "episodes": rollout.stats.episodes, "masked": rollout.stats.masked, "complete": rollout.stats.complete,
            "groups": rollout.stats.groups, "group_claims": sorted(set(rollout.stats.group_claims)),
            "group_size": group}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=HERE / "train-tiny.yaml", help="an awm train config")
    parser.add_argument("--steps", type=int, default=None, help="optimiser steps (default: the config's)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/trl-tiny"))
    parser.add_argument("--database-url", default=os.environ.get("AWM_DATABASE_URL"),
                        help="an admin DSN (default: awm's embedded PostgreSQL)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args()
    if args.json:  # stdout is the JSON line alone: what TRL and transformers print goes to stderr
        with contextlib.redirect_stdout(sys.stderr):
            summary = run(args.config, args.steps, args.output_dir, args.database_url)
        print(json.dumps(summary))
        return
    summary = run(args.config, args.steps, args.output_dir, args.database_url)
    for step, reward in enumerate(summary["reward"], 1):
        print(f"step {step:4d}  reward {reward:+.3f}")
    print(f"{summary['episodes']} episodes in {summary['groups']} groups (claims of {summary['group_claims']} "
          f"instances for {summary['group_size']} samples), {summary['complete']} complete, "
          f"{summary['masked']} masked")


if __name__ == "__main__":
    main()
