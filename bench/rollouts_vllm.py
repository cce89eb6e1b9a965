"""``bench/rollouts.py --policy vllm``: asynchronous against synchronous GRPO steps with a real
policy - a vLLM server generating (the tiny Qwen3 test model on this machine's CPU unless
``--base-url`` names another server), a real learner (the same model with a LoRA, GRPO steps on
the episodes' tokens) and the adapter pushed to the server after every step - on real
environment instances (the ``lamps`` fixture: a tool call, its result, an answer, verification).

Per mode, over the same number of steps of the same batch size in the same run:

* ``episodes_per_s`` / ``tokens_per_s``  episodes and generated tokens delivered to the learner
  per second of wall time;
* ``env_time_fraction``     of the episodes' own time, the share spent in the environments
  (reset, tool calls, verification) rather than waiting for the policy;
* ``learner_idle_fraction`` the share of wall time the learner waited for rollouts;
* ``learner_step_s`` / ``generate_s``  mean learner step (with its weight sync, also shown alone
  as ``weight_sync_s``) and, in sync mode, mean time to generate a step's batch: "comparable"
  when they are close;
* ``staleness_max``         policy versions between generation and training (async only).

``--learner-ms`` adds a fixed wait to each learner step, as a GPU learner of a larger model
would take without using the CPU: it makes generation and learning comparable on purpose.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAMPS = ROOT / "tests" / "fixtures" / "lamps"
MODEL = ROOT / "tests" / "fixtures" / "tiny-qwen"


async def run_mode(mode: str, service: Any, policy: Any, learner: Any, steps: int, groups_per_step: int,
                   extra_learner_s: float) -> dict[str, Any]:
    """``steps`` GRPO steps: take groups (async: produced while the learner works), train, sync."""
    from awm.trainer.samples import build_batch

    episodes = tokens = 0
    env_ms = episode_ms = 0.0
    learner_s: list[float] = []
    sync_s: list[float] = []
    generate_s: list[float] = []
    staleness: list[int] = []
    if mode == "async":
        service.start()
    wait0 = service.wait_s
    start = time.perf_counter()
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            groups = await (service.next_groups(groups_per_step) if mode == "async" else service.collect(groups_per_step))
            generate_s.append(time.perf_counter() - t0)
            staleness += [learner.version - g.policy_version for g in groups]
            trajectories = [t for g in groups for t in g.trajectories]
            for traj in trajectories:
                episodes += 1
                tokens += traj.generated_tokens
                timings = traj.timings
                env_ms += timings.get("reset_ms", 0.0) + timings.get("tools_ms", 0.0) + timings.get("verify_ms", 0.0)
                episode_ms += sum(timings.get(k, 0.0) for k in ("reset_ms", "policy_ms", "tools_ms", "verify_ms"))
            t1 = time.perf_counter()
            # every step trains (zero-advantage groups too), so each costs a learner step and a sync
            batch = build_batch([g.trajectories for g in groups], policy.format, keep_zero_advantage=True)
            await asyncio.to_thread(learner.step, batch.sequences)
            if extra_learner_s:
                await asyncio.sleep(extra_learner_s)
            t2 = time.perf_counter()
            await policy.publish(learner)
            sync_s.append(time.perf_counter() - t2)
            learner_s.append(time.perf_counter() - t1)
    finally:
        wall = time.perf_counter() - start
        await service.stop()
    idle = service.wait_s - wait0
    return {"steps": steps, "episodes": episodes, "generated_tokens": tokens, "wall_s": round(wall, 2),
            "episodes_per_s": round(episodes / wall, 2), "tokens_per_s": round(tokens / wall, 1),
            "env_time_fraction": round(env_ms / episode_ms, 3) if episode_ms else None,
            "learner_idle_fraction": round(idle / wall, 3),
            "learner_step_s": round(statistics.mean(learner_s), 3),
            "weight_sync_s": round(statistics.mean(sync_s), 3),
            "generate_s": round(statistics.mean(generate_s), 3) if mode == "sync" else None,
            "staleness_max": max(staleness, default=0), "dropped_stale": service.dropped_stale}


async def bench(args: argparse.Namespace, base_url: str, scratch: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from awm import catalog
    from awm.fleet import Database
    from awm.trainer.agent import AgentConfig
    from awm.trainer.chatformat import chat_format
    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.episode.reward import RewardConfig
    from awm.trainer.rollout import LocalFleetSource, RolloutConfig, RolloutService, TaskRef
    from awm.trainer.vllm_policy import LoraSpec, VllmPolicy

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = LoraSpec(rank=8, alpha=16).apply(
        AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True, dtype=torch.float32))
    learner = Learner(model, GRPOConfig(lr=1e-4, tis_cap=2.0, micro_batch_size=8), SamplingSpec(1.0),
                      pad_id=tokenizer.pad_token_id or 0)
    policy = VllmPolicy(base_url, args.served_model, max_tokens=48, timeout_s=300, sync_dir=str(scratch / "weights"),
                        weight_sync="lora", thinking=False, format=chat_format(tokenizer, False))
    bundles = catalog.load(str(LAMPS))
    tasks = [TaskRef(b.name, t.id) for b in bundles for t in b.tasks]
    agent = AgentConfig(max_turns=2)
    rollout = RolloutConfig(group_size=args.group_size, max_staleness=1, max_inflight_groups=args.groups_per_step)
    database = await asyncio.to_thread(Database.open, args.database_url)
    results: dict[str, Any] = {}
    try:
        async with LocalFleetSource(bundles, args.instances, database, allow_ungated=True) as source:
            await policy.publish(learner)  # the server serves the learner's weights from the start
            # warm-up: every instance and the server's first batches
            await RolloutService(source, policy, tasks, agent, RewardConfig(), rollout).collect(args.groups_per_step)
            for mode in ("sync", "async"):
                service = RolloutService(source, policy, tasks, agent, RewardConfig(), rollout)
                results[mode] = await run_mode(mode, service, policy, learner, args.steps, args.groups_per_step,
                                               args.learner_ms / 1000)
    finally:
        await policy.close()
        await asyncio.to_thread(database.close)
    return {"policy": "vllm", "model": Path(args.model).name, "weight_sync": "lora (runtime adapter loading)",
            "instances": args.instances, "group_size": args.group_size, "groups_per_step": args.groups_per_step,
            "episodes_per_step": args.group_size * args.groups_per_step, "extra_learner_ms": args.learner_ms,
            "speedup": round(results["async"]["episodes_per_s"] / results["sync"]["episodes_per_s"], 2),
            "sync": results["sync"], "async": results["async"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the CPU vLLM server (tests/vllm_env.py's environment) unless ``--base-url`` is given."""
    from awm.trainer.vllm_server import VllmServer

    with tempfile.TemporaryDirectory(prefix="awm-bench-vllm-") as tmp:
        scratch = Path(tmp)
        if args.base_url:
            return asyncio.run(bench(args, args.base_url, scratch))
        from tests import vllm_env

        if not vllm_env.installed():
            raise SystemExit(f"vLLM is not installed in {vllm_env.env_dir()}: python3 tests/vllm_env.py")
        t0 = time.perf_counter()
        with VllmServer(str(vllm_env.python()), str(Path(args.model).resolve()), scratch / "vllm",
                        served_name=args.served_model) as server:
            startup = time.perf_counter() - t0
            data = asyncio.run(bench(args, server.base_url, scratch))
        data["server_startup_s"] = round(startup, 1)
        return data
