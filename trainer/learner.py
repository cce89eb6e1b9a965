"""The GRPO learner and the ``awm train`` loop (in the spirit of nanoGPT/TRL: one readable file).

One training step:

1. take ``groups_per_step`` finished groups from the rollout service (async: produced while the
   previous step trained, at most ``max_staleness`` versions old; sync: collected now);
2. group-normalised advantages, sequences with the loss mask over generated tokens only
   (:mod:`awm.trainer.samples`);
3. micro-batches: forward, token log-probs under the *sampling* distribution (same temperature
   and allowed tokens as generation), clipped GRPO loss (+ KL to the frozen initial policy),
   backward - gradients accumulate over the whole batch;
4. clip, optimiser step, version + 1, push the weights to the rollout policy;
5. metrics (JSONL, Prometheus), checkpoint every ``checkpoint_every`` steps.

A run directory holds ``config.json``, ``trajectories.jsonl``, ``metrics.jsonl``,
``reward_curve.png`` and ``checkpoints/step-NNNNNN/`` (model, tokenizer, optimiser and RNG
state). Running again with the same ``run_dir`` resumes from the latest checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

import torch

from awm.trainer.config import GRPOConfig, TrainConfig
from awm.trainer.distributed import Coordinator, sum_over_ranks
from awm.trainer.grpo import grpo_loss, token_logprobs
from awm.trainer.local_policy import SamplingSpec
from awm.trainer.precision import autocast, cast_weights
from awm.trainer.samples import Sequence

log = logging.getLogger("awm.trainer.learner")


class Learner:
    def __init__(self, model: Any, cfg: GRPOConfig, sampling: SamplingSpec, ref_model: Any = None,
                 pad_id: int = 0, compute_dtype: torch.dtype = torch.float32,
                 coordinator: Coordinator | None = None) -> None:
        if any(p.dtype != torch.float32 for p in model.parameters() if p.requires_grad):
            raise ValueError("the learner's model must hold float32 (master) weights; "
                             "policy.dtype sets the compute precision, not the weights'")
        self.model = model.train()
        self.device = next(model.parameters()).device
        self.compute_dtype = compute_dtype
        self.cfg = cfg
        self.sampling = sampling
        self.ref_model = ref_model.eval() if ref_model is not None else None
        self.pad_id = pad_id
        # only what trains (all weights, or a LoRA's): frozen base weights take no optimiser state
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.version = 0
        self.step_count = 0
        # several processes (trainer/distributed.py): the model is FSDP-sharded, rank 0 leads
        self.coordinator = coordinator

    def sequence_logprobs(self, model: Any, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """Log-prob of token t given tokens < t, for t = 1..T-1 (shape ``[B, T-1]``)."""
        with autocast(self.device, self.compute_dtype):
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        return token_logprobs(self.sampling.logits_to_logprobs(logits), ids[:, 1:])

    def _pad(self, seqs: list[Sequence], episode_tokens: Counter[Any]) -> tuple[torch.Tensor, ...]:
        width = max(len(s.input_ids) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.float32)
        old = torch.zeros((len(seqs), width), dtype=torch.float32)
        for i, s in enumerate(seqs):
            n = len(s.input_ids)
            ids[i, :n] = torch.tensor(s.input_ids)
            attention[i, :n] = 1
            mask[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
            old[i, :n] = torch.tensor(s.old_logprobs, dtype=torch.float32)
        advantages = torch.tensor([s.advantage for s in seqs], dtype=torch.float32)
        seq_tokens = torch.tensor([episode_tokens[s.episode_id or id(s)] for s in seqs], dtype=torch.float32)
        # Position 0 is never predicted; shift everything to align with the log-probs of tokens 1..T-1.
        batch = (ids, attention, mask[:, 1:], old[:, 1:], advantages, seq_tokens)
        return tuple(t.to(self.device, non_blocking=True) for t in batch)

    def step(self, seqs: list[Sequence]) -> dict[str, Any]:
        """One optimiser step over all sequences (gradient accumulation over micro-batches).

        Sharded over several processes, every rank is given the whole batch (rank 0 announces
        it), takes every ``world``-th sequence and runs as many micro-batches as the busiest
        rank; the normaliser is the whole batch's, and FSDP sums the gradients."""
        start = time.perf_counter()
        shards = self.coordinator
        if shards is not None:
            shards.announce("step", seqs)
        if not seqs:  # every group had one reward for all (no advantage): the same keys, no values
            return {"learner_s": 0.0, "sequences": 0, "trained_tokens": 0, "loss": None, "kl": None,
                    "clip_fraction": None, "ratio_mean": None, "grad_norm": None,
                    **_gap_stats({"tokens": 0}, self.cfg.tis_cap)}
        cfg = self.cfg
        # seq_mean weighs episodes, not rows: an episode the history window split is one episode
        episode_tokens: Counter[Any] = Counter()
        for s in seqs:
            episode_tokens[s.episode_id or id(s)] += s.generated
        normalizer = float(sum(s.generated for s in seqs)) if cfg.loss_agg == "token_mean" else float(len(episode_tokens))
        self.optimizer.zero_grad(set_to_none=True)
        totals = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "tokens": 0}
        gap = {"abs": 0.0, "diff": 0.0, "tokens": 0, "truncated": 0}
        for micro in _micro_batches(seqs, cfg.micro_batch_size, shards):
            ids, attention, mask, old, advantages, seq_tokens = self._pad(micro, episode_tokens)
            logp = self.sequence_logprobs(self.model, ids, attention)
            # Unknown sampling log-probs (an endpoint that returns none): on-policy, ratio 1.
            known = ~torch.isnan(old) & mask.bool()
            old = torch.where(torch.isnan(old), logp.detach(), old)
            weights = None
            with torch.no_grad():  # the sampler-learner gap, logged whatever corrects it
                delta = torch.where(known, logp - old, 0.0)
                gap["abs"] += float(delta.abs().sum())
                gap["diff"] += float(delta.sum())
                gap["tokens"] += int(known.sum())
                if cfg.tis_cap is not None:
                    raw = torch.exp(delta)
                    gap["truncated"] += int((known & (raw > cfg.tis_cap)).sum())
                    weights = raw.clamp(max=cfg.tis_cap)
            if cfg.tis_cap is not None:  # the ratio is the learner's own; the IS weight covers the gap
                old = logp.detach()
            ref = None
            if self.ref_model is not None and cfg.kl_coef:
                with torch.no_grad():
                    ref = self.sequence_logprobs(self.ref_model, ids, attention)
            loss, stats = grpo_loss(logp, old, advantages, mask, cfg.clip_eps, cfg.clip_eps_high, ref,
                                    cfg.kl_coef, cfg.loss_agg, normalizer, seq_tokens, weights)
            loss.backward()
            totals["loss"] += stats.loss
            for key in ("kl", "clip_fraction", "ratio_mean"):
                totals[key] += getattr(stats, key) * stats.tokens
            totals["tokens"] += stats.tokens
        if shards is not None:
            keys = ("loss", "kl", "clip_fraction", "ratio_mean", "tokens")
            summed = sum_over_ranks([totals[k] for k in keys] + [gap[k] for k in gap])
            totals.update(zip(keys, summed[:len(keys)]))
            gap.update(zip(list(gap), summed[len(keys):]))
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                                   cfg.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP: the global norm
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.version += 1
        self.step_count += 1
        n = max(totals["tokens"], 1)
        return {"learner_s": round(time.perf_counter() - start, 4), "sequences": len(seqs),
                "trained_tokens": int(totals["tokens"]), "loss": round(totals["loss"], 6),
                "kl": round(totals["kl"] / n, 6), "clip_fraction": round(totals["clip_fraction"] / n, 4),
                "ratio_mean": round(totals["ratio_mean"] / n, 6), "grad_norm": round(float(grad_norm), 6),
                **_gap_stats(gap, cfg.tis_cap)}

    def export_state(self) -> dict[str, torch.Tensor] | None:
        """The trainable weights for a weight sync when they are sharded (all of a fully trained
        model, a LoRA's adapter; gathered on rank 0, every rank taking part), or None: then the
        model's own ``save_pretrained`` has them."""
        if self.coordinator is None:
            return None
        from awm.trainer.distributed import full_state_dict

        self.coordinator.announce("export")
        return full_state_dict(self.model)

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights for the rollout policy (weight sync): views, not copies; the receiver
        copies them into its own parameters, so the model's memory is not held a third time."""
        return self.model.state_dict()

    # -- checkpoints ---------------------------------------------------------------------------

    def save(self, directory: Path, tokenizer: Any, step: int, extra: dict[str, Any] | None = None) -> Path:
        """Model, tokenizer, optimiser and every random state a resumed run continues from
        (``extra``: the rollout side's, e.g. the task order and the sampler's generator)."""
        path = directory / f"step-{step:06d}"
        model_state = optimizer_state = None
        if self.coordinator is not None:  # gathered from the shards; only rank 0 writes
            from awm.trainer.distributed import full_optimizer_state, full_state_dict

            self.coordinator.announce("save", (directory, None, step, None))
            model_state = full_state_dict(self.model)
            optimizer_state = full_optimizer_state(self.model, self.optimizer)
            if self.coordinator.rank != 0:
                return path
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, **({"state_dict": model_state} if model_state is not None else {}))
        tokenizer.save_pretrained(path)
        if optimizer_state is None:
            optimizer_state = self.optimizer.state_dict()
        torch.save({"optimizer": optimizer_state, "step": step, "version": self.version,
                    "torch_rng": torch.get_rng_state(), "python_rng": random.getstate(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "extra": extra or {}}, path / "trainer_state.pt")
        (directory / "latest").write_text(path.name)
        return path

    def load_state(self, path: Path) -> tuple[int, dict[str, Any]]:
        """Restore what :meth:`save` wrote; returns the step and the ``extra`` states."""
        state = torch.load(path / "trainer_state.pt", weights_only=False)
        if self.coordinator is not None:  # every rank reads the full state and keeps its shard
            from awm.trainer.distributed import load_optimizer_state

            load_optimizer_state(self.model, self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.version = state["version"]
        self.step_count = state["step"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            try:
                torch.cuda.set_rng_state_all(state["cuda_rng"])
            except (RuntimeError, ValueError) as exc:  # another GPU count or kind than the checkpoint's
                log.warning("not restoring the CUDA random state (%s): resumed on different hardware", exc)
        return int(state["step"]), dict(state.get("extra") or {})


def _micro_batches(seqs: list[Sequence], size: int, shards: Coordinator | None) -> Iterator[list[Sequence]]:
    """This process's micro-batches: all of them alone; sharded, every ``world``-th sequence,
    padded with empty micro-batches (one sequence, loss mask zero) up to the busiest rank's
    count, because every rank must run the same number of FSDP forwards and backwards."""
    if shards is None:
        for i in range(0, len(seqs), size):
            yield seqs[i:i + size]
        return
    mine = seqs[shards.rank::shards.world]
    busiest = math.ceil(math.ceil(len(seqs) / shards.world) / size)
    for i in range(busiest):
        micro = mine[i * size:(i + 1) * size]
        yield micro or [Sequence(seqs[0].input_ids[:2], [0, 0], [0.0, 0.0], episode_id="(padding)")]


def _gap_stats(gap: dict[str, Any], cap: float | None) -> dict[str, Any]:
    """How far the sampler's log-probs were from the learner's (before this step's update):
    mean |logp_learner - logp_sampler| and its signed mean over tokens whose sampling log-prob is
    known, and the share of tokens whose importance weight the cap truncated."""
    n = gap["tokens"]
    if not n:
        return {"logprob_gap": None, "logprob_gap_signed": None, "tis_truncated_fraction": None}
    return {"logprob_gap": round(gap["abs"] / n, 6), "logprob_gap_signed": round(gap["diff"] / n, 6),
            "tis_truncated_fraction": round(gap["truncated"] / n, 6) if cap is not None else None}


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.exists():
        return None
    path = run_dir / "checkpoints" / pointer.read_text().strip()
    return path if (path / "trainer_state.pt").exists() else None


# -- the policy model -------------------------------------------------------------------------

class PolicyParts(NamedTuple):
    model: Any  # trainable, float32 master weights
    reference: Any  # frozen initial policy for the KL term (in the compute dtype), or None
    tokenizer: Any
    sampling: SamplingSpec
    compute_dtype: torch.dtype


def build_policy(cfg: TrainConfig, corpus: list[str], resume_from: Path | None,
                 device: str | None = None) -> PolicyParts:
    """The policy of a run; nothing is downloaded. The trainable model is float32 whatever
    ``policy.dtype`` says (that is the autocast precision); the frozen reference, which never
    takes an update, is stored in the compute dtype to halve its memory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from awm.trainer import tiny

    pc = cfg.policy
    device = resolve_device(device or pc.device)  # device: this process's GPU under torchrun
    dtype = resolve_dtype(pc.dtype, device)
    if pc.kind == "tiny":
        if resume_from is not None:
            tokenizer = AutoTokenizer.from_pretrained(resume_from, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(resume_from, local_files_only=True)
        else:
            tokenizer = tiny.build_tokenizer(corpus, pc.tiny.actions, pc.tiny.max_vocab_words)
            model = tiny.build_model(len(tokenizer), pc.tiny, cfg.seed)
        allowed = tiny.allowed_ids(tokenizer, pc.tiny.actions)
        reference = None
        if cfg.grpo.kl_coef:
            reference = tiny.build_model(len(tokenizer), pc.tiny, cfg.seed)  # the same initial weights
    elif pc.kind == "hf":
        if not pc.path:
            raise ValueError("policy.kind hf needs policy.path (a local model directory)")
        source = resume_from or pc.path
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(source, local_files_only=True, torch_dtype=torch.float32)
        allowed = None
        reference = AutoModelForCausalLM.from_pretrained(pc.path, local_files_only=True, torch_dtype=dtype) \
            if cfg.grpo.kl_coef else None
    elif pc.kind == "vllm":  # the learner's copy of the model the server serves (path)
        tokenizer = AutoTokenizer.from_pretrained(resume_from or pc.path, local_files_only=True)
        lora = pc.weight_sync == "lora"
        model = AutoModelForCausalLM.from_pretrained(pc.path if lora else (resume_from or pc.path),
                                                     local_files_only=True, torch_dtype=torch.float32)
        if lora and resume_from is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, resume_from, is_trainable=True)
        elif lora:
            torch.manual_seed(cfg.seed)  # the adapter's initial A: the same in every process of a sharded learner
            model = pc.lora.apply(model)
        allowed = None
        reference = AutoModelForCausalLM.from_pretrained(pc.path, local_files_only=True, torch_dtype=dtype) \
            if cfg.grpo.kl_coef else None
    else:
        raise ValueError(f"unknown policy kind {pc.kind!r} (tiny | hf | vllm)")
    model = model.to(device=device, dtype=torch.float32)
    if reference is not None:
        reference = cast_weights(reference.to(device=device), dtype)
        for p in reference.parameters():
            p.requires_grad_(False)
    log.info("policy %s on %s: float32 weights, %s compute", pc.kind, device, str(dtype).removeprefix("torch."))
    return PolicyParts(model, reference, tokenizer, SamplingSpec(pc.temperature, pc.max_new_tokens, allowed), dtype)


async def _vllm_policy(cfg: TrainConfig, tokenizer: Any, version: int, run_dir: Path) -> tuple[Any, Any]:
    """The vLLM policy of a run, and the server it started (``policy.server``) or None."""
    from awm.trainer.chatformat import chat_format
    from awm.trainer.vllm_policy import VllmPolicy
    from awm.trainer.vllm_server import VllmServer

    pc = cfg.policy
    server = None
    base_url = pc.base_url
    if pc.server:
        spec = dict(pc.server)
        server = VllmServer(python=str(spec.pop("python")), model=str(Path(pc.path or "").resolve()),
                            scratch=run_dir / "vllm", served_name=pc.served_model,
                            lora_rank=pc.lora.rank if pc.weight_sync == "lora" else 0,
                            extra_args=list(spec.pop("args", [])), **spec)
        await asyncio.to_thread(server.start)
        base_url = server.base_url
    policy = VllmPolicy(str(base_url), pc.served_model, temperature=pc.temperature, max_tokens=pc.max_new_tokens,
                        timeout_s=pc.request_timeout_s, version=version,
                        sync_dir=pc.sync_dir or str(run_dir / "weights"), weight_sync=pc.weight_sync,
                        thinking=pc.thinking, format=chat_format(tokenizer, pc.thinking))
    return policy, server


def resolve_device(name: str) -> torch.device:
    """``auto`` is the first CUDA GPU when there is one (a training Job's), else the CPU; a GPU
    asked for by name that is not there is an error, not a silent crawl on the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"policy.device {name!r}: no CUDA GPU is visible to this process")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"policy.device {name!r}: MPS is not available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute (autocast) precision: ``auto`` is bfloat16 on a GPU that supports it (about
    twice the matmul throughput, no loss scaling), else float32. The loss and the log-probs are
    float32 either way. float16 is refused at config load: without loss scaling its gradients
    underflow."""
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


# -- the loop ---------------------------------------------------------------------------------

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
    from awm.trainer import distributed

    coordinator = distributed.Coordinator(distributed.init(cfg.learner.backend))
    try:
        if coordinator.rank != 0:
            await asyncio.to_thread(distributed.follow, cfg, coordinator)
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
        from awm.trainer.distributed import device_for, shard

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
                        **cfg.serving())
    server = None
    if cfg.policy.kind == "vllm":
        policy, server = await _vllm_policy(cfg, tokenizer, learner.version, run_dir)
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
                                            "groups": record.pop("group_ids")})
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
            **reward_summary(trajectories),
            "zero_advantage_groups": batch.zero_advantage_groups,
            "tool_calls": sum(t.tool_calls for t in trajectories), "generated_tokens": tokens,
            "rollouts_per_s": round(len(trajectories) / step_s, 3), "tokens_per_s": round(tokens / step_s, 3),
            "staleness": staleness, "dropped_stale": service.dropped_stale, "step_s": round(step_s, 4),
            "wait_s": round(wait_s, 4), "weight_sync_s": round(sync_s, 4), "env_wait_fraction": round(wait_s / step_s, 4) if step_s else 0.0,
            "elapsed_s": round(time.perf_counter() - began, 3), **stats}
