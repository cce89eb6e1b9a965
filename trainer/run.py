"""The ``awm train`` loop (in the spirit of nanoGPT/TRL: one readable file).

One training step:

1. take ``groups_per_step`` finished groups from the rollout service (async: produced while the
   previous step trained, at most ``max_staleness`` versions old; sync: collected now);
2. group-normalised advantages, sequences with the loss mask over generated tokens only
   (:mod:`awm.trainer.samples`);
3. one :class:`awm.trainer.learner.Learner` step; version + 1, the weights pushed to the
   rollout policy (shared in process, copied, or synced to a vLLM server);
4. metrics (JSONL, Prometheus), checkpoint every ``checkpoint_every`` steps.

A run directory holds ``config.json``, ``trajectories.jsonl``, ``metrics.jsonl``,
``reward_curve.png`` and ``checkpoints/step-NNNNNN/`` (model, tokenizer, optimiser and RNG
state). Running again with the same ``run_dir`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from awm.trainer.config import TrainConfig
from awm.trainer.distributed import Coordinator, device_for, shard
from awm.trainer.learner import Learner
from awm.trainer.models import build_policy, latest_checkpoint, vllm_policy

log = logging.getLogger("awm.trainer.run")


@dataclass
class TrainResult:
    run_dir: Path
    steps: int
    first_reward: float | None
    last_reward: float | None
    records: list[dict[str, Any]]


StepHook = Callable[[dict[str, Any]], None]


async def train(cfg: TrainConfig, on_step: StepHook | None = None) -> TrainResult:
    """Run (or resume) a GRPO run on a local fleet, or - inside a campaign's Job, where
    ``AWM_OPERATOR_URL``/``AWM_FLEET`` are set - on instances claimed from the campaign's
    EnvFleet, reporting each step to the Campaign's status; returns the per-step records.

    With ``learner.distributed`` (under torchrun) rank 0 does all of that with an FSDP-sharded
    learner, and the other ranks only follow its learner calls (trainer/distributed.py); they
    return an empty result."""
    if not cfg.learner.distributed:
        return await _train(cfg, on_step, None)
    from awm.trainer.distributed import init

    coordinator = Coordinator(init(cfg.learner.backend))
    try:
        if coordinator.rank != 0:
            await asyncio.to_thread(follow, cfg, coordinator)
            return TrainResult(Path(cfg.run_dir), 0, None, None, [])
        result = await _train(cfg, on_step, coordinator)
        coordinator.stop()  # only after a clean run: a failed rank 0 exits and torchrun ends the others
        return result
    finally:
        coordinator.close()


async def _train(cfg: TrainConfig, on_step: StepHook | None, coordinator: Coordinator | None) -> TrainResult:
    from awm import catalog as catalog_mod
    from awm.episode.allocation import OperatorSettings
    from awm.episode.sources import run_source
    from awm.trainer.agent import DEFAULT_SYSTEM
    from awm.trainer.k8s_source import ProgressReporter
    from awm.trainer.local_policy import LocalPolicy
    from awm.trainer.metrics import JsonlLog, TrainMetrics, plot_reward_curve
    from awm.trainer.eval import select_tasks
    from awm.trainer.rollout import RolloutService
    from awm.trainer.trajectory import TrajectoryLog

    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, cfg.torch_threads))
    run_dir = Path(cfg.run_dir)
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    bundles = catalog_mod.load(cfg.catalog, cfg.envs or None)
    tasks = select_tasks(bundles, cfg.tasks, cfg.allow_ungated, cfg.verifier_kind)
    if not tasks:
        raise ValueError("no tasks selected (only tasks that passed both gates are trained on unless "
                         "allow_ungated: true; `awm catalog validate --record` records the gates)")
    corpus = [cfg.agent.system_prompt, *(b.scenario.description for b in bundles),
              *(t.instruction for b in bundles for t in b.tasks), *(tool.name for b in bundles for tool in b.tools)]
    corpus.append(DEFAULT_SYSTEM)
    resume_from = latest_checkpoint(run_dir) if cfg.resume else None
    if coordinator is None:
        model, reference, tokenizer, sampling, compute_dtype = build_policy(cfg, corpus, resume_from)
    else:

        model, reference, tokenizer, sampling, compute_dtype = build_policy(
            cfg, corpus, resume_from, device_for(coordinator.where, cfg.policy.device))
        model = shard(model)
    learner = Learner(model, cfg.grpo, sampling, reference, pad_id=tokenizer.pad_token_id or 0,
                      compute_dtype=compute_dtype, coordinator=coordinator)
    start_step, resumed = learner.load_state(resume_from) if resume_from is not None else (0, {})
    (run_dir / "config.json").write_text(json.dumps(cfg.to_record(), indent=2, default=str))
    metrics = TrainMetrics()
    if cfg.metrics_port:
        try:
            metrics.serve(cfg.metrics_port, cfg.metrics_host)
        except OSError as exc:  # the run matters more than its dashboard
            log.error("cannot serve metrics on %s:%d (%s); training without them", cfg.metrics_host,
                      cfg.metrics_port, exc)
    metrics_log = JsonlLog(run_dir / "metrics.jsonl")
    dropped = metrics_log.keep_through(start_step)
    if dropped:
        log.info("resuming at step %d: dropped %d metric records written after that checkpoint",
                 start_step + 1, dropped)
    traj_log = TrajectoryLog(run_dir / "trajectories.jsonl")
    k8s = OperatorSettings.from_env()
    reporter = ProgressReporter(k8s) if k8s is not None and k8s.campaign else None
    source = run_source(bundles, cfg.replicas, cfg.rollout.group_size, database_url=cfg.database_url, settings=k8s,
                        instances=cfg.instances, **cfg.serving())
    server = None
    if cfg.policy.kind == "vllm":
        policy, server = await vllm_policy(cfg, tokenizer, learner.version, run_dir)
    else:
        # Synchronous runs never generate while the learner steps: the policy shares its weights
        # (one copy of the model in memory). Asynchronous ones generate from a copy in the compute
        # dtype, synced after each step.
        policy = LocalPolicy(learner.model, tokenizer, sampling, name=f"{cfg.policy.kind}-policy",
                             seed=cfg.seed + start_step, version=learner.version, share=cfg.mode == "sync",
                             dtype=compute_dtype, thinking=cfg.policy.thinking)
    service = RolloutService(source, policy, tasks, cfg.agent, cfg.reward, cfg.rollout, traj_log,
                             metrics.observe_trajectory)
    if resumed:  # the task order and the sampler go on where the checkpoint left them
        service.set_rng_state(resumed.get("tasks"))
        policy.set_rng_state(resumed.get("sampler"))

    def rng_states() -> dict[str, Any]:
        return {"tasks": service.rng_state(), "sampler": policy.rng_state()}

    began = time.perf_counter()
    try:
        if cfg.policy.kind == "vllm":  # the server serves exactly the learner's weights from the start
            await policy.publish(learner)
        async with source:
            try:
                if cfg.mode == "async":
                    service.start()
                if start_step:  # episodes after this line are the resumed run's (a redone step's too)
                    traj_log.write("resume", {"step": start_step, "version": learner.version})
                for step in range(start_step, cfg.steps):
                    record = await _train_step(cfg, step, service, learner, policy, began)
                    # which groups this step trained on: the log's episodes joined to their step
                    traj_log.write("step", {"step": record["step"], "version": record["version"],
                                            "groups": record.pop("group_ids"),
                                            "advantages": record.pop("advantages")})
                    metrics_log.write(record)
                    metrics.observe_step(record)
                    if on_step:
                        on_step(record)
                    if reporter is not None:
                        reporter.report_step(record)
                    if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.steps:
                        extra = await asyncio.to_thread(rng_states)  # waits for the sampler's lock: not on the loop
                        await asyncio.to_thread(learner.save, run_dir / "checkpoints", tokenizer, step + 1, extra)
            finally:
                await service.stop()  # before the fleet goes away
            if cfg.steps > start_step:
                extra = await asyncio.to_thread(rng_states)
                await asyncio.to_thread(learner.save, run_dir / "checkpoints", tokenizer, cfg.steps, extra)
    finally:
        traj_log.close()
        await policy.close()
        if server is not None:
            await asyncio.to_thread(server.stop)
        if reporter is not None:
            await reporter.aclose()
        records = metrics_log.read()
        if records:  # a run that failed part way still shows its curve so far
            plot_reward_curve(records, run_dir / "reward_curve.png")
    rewards = [r["reward_mean"] for r in records if r.get("reward_mean") is not None]
    return TrainResult(run_dir, len(records), rewards[0] if rewards else None,
                       rewards[-1] if rewards else None, records)


async def _train_step(cfg: TrainConfig, step: int, service: Any, learner: Learner, policy: Any,
                      began: float) -> dict[str, Any]:
    """Rollouts in, one optimiser step, weights out; returns the step's metrics record."""
    from awm.trainer.metrics import reward_summary
    from awm.trainer.samples import build_batch

    t0 = time.perf_counter()
    wait0 = service.wait_s
    if cfg.mode == "async":
        groups = await service.next_groups(cfg.groups_per_step)
    else:
        groups = await service.collect(cfg.groups_per_step)
    wait_s = service.wait_s - wait0
    batch = build_batch([g.trajectories for g in groups], policy.format, cfg.grpo.scale_rewards,
                        keep_zero_advantage=bool(cfg.grpo.kl_coef))
    staleness = [learner.version - g.policy_version for g in groups]
    stats = await asyncio.to_thread(learner.step, batch.sequences)
    sync_s = 0.0
    if batch.sequences:
        t_sync = time.perf_counter()
        await policy.publish(learner)
        sync_s = time.perf_counter() - t_sync
    step_s = time.perf_counter() - t0
    trajectories = [t for g in groups for t in g.trajectories]
    tokens = sum(t.generated_tokens for t in trajectories)
    return {"step": step + 1, "version": learner.version, "group_ids": [g.group_id for g in groups],
            "advantages": batch.advantages,
            **reward_summary(trajectories),
            "zero_advantage_groups": batch.zero_advantage_groups,
            "tool_calls": sum(t.tool_calls for t in trajectories), "generated_tokens": tokens,
            "rollouts_per_s": round(len(trajectories) / step_s, 3), "tokens_per_s": round(tokens / step_s, 3),
            "staleness": staleness, "dropped_stale": service.dropped_stale, "step_s": round(step_s, 4),
            "wait_s": round(wait_s, 4), "weight_sync_s": round(sync_s, 4), "env_wait_fraction": round(wait_s / step_s, 4) if step_s else 0.0,
            "elapsed_s": round(time.perf_counter() - began, 3), **stats}


def follow(cfg: Any, coordinator: Coordinator) -> None:
    """A rank > 0 of ``awm train``: the same model from the same weights and seed as rank 0
    (its checkpoint when resuming: the run directory must be shared between nodes), sharded
    alike, then rank 0's learner calls until it stops."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(max(1, cfg.torch_threads))
    resume_from = latest_checkpoint(Path(cfg.run_dir)) if cfg.resume else None
    model, reference, tokenizer, sampling, dtype = build_policy(cfg, [], resume_from,
                                                                device_for(coordinator.where, cfg.policy.device))
    learner = Learner(shard(model), cfg.grpo, sampling, reference, pad_id=tokenizer.pad_token_id or 0,
                      compute_dtype=dtype, coordinator=coordinator)
    if resume_from is not None:
        learner.load_state(resume_from)
    coordinator.serve(learner)
