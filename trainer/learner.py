"""The GRPO learner: one optimiser step over a batch of finished groups' sequences.

1. mini-batches of ``grpo.mini_batch_groups`` groups (one per optimiser update; the whole batch
   when unset), each in micro-batches: forward, token log-probs under the *sampling*
   distribution (same temperature and allowed tokens as generation), clipped GRPO loss (+ KL to
   the frozen initial policy), backward - gradients accumulate over the mini-batch;
2. clip, optimiser step per mini-batch; version + 1 per step (the run loop then pushes the
   weights to the rollout policy);
3. its state in a checkpoint (model, tokenizer, optimiser, RNG) and back.

Building the model is :mod:`awm.trainer.models`; the ``awm train`` loop is :mod:`awm.trainer.run`;
over several processes the same learner is sharded (:mod:`awm.trainer.distributed`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import torch

from awm.trainer.config import GRPOConfig
from awm.trainer.distributed import Coordinator, sum_over_ranks
from awm.trainer.grpo import grpo_loss, token_logprobs
from awm.trainer.local_policy import SamplingSpec
from awm.trainer.precision import autocast
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

    def sequence_logprobs(self, model: Any, ids: torch.Tensor, attention: torch.Tensor, first: int = 0) -> torch.Tensor:
        """Log-prob of token t given tokens < t, for t = 1..T-1 (shape ``[B, T-1]``), computed only
        for the targets from ``first + 1`` on; the ones before are 0 (the prompt, which no loss
        reads). The vocabulary-wide logits are the learner's largest tensors (``B x T x V`` floats,
        several copies through the softmax and its backward): over a whole prompt of tool
        descriptions they took 19 GB for 16 sequences of a 49k-token vocabulary, where the
        completions alone need a tenth of it. ``logits_to_keep`` makes the model apply its output
        layer to the kept positions only."""
        with autocast(self.device, self.compute_dtype):
            logits = output_logits(model, ids, attention, first)
        logp = token_logprobs(self.sampling.logits_to_logprobs(logits), ids[:, first + 1:])
        return torch.nn.functional.pad(logp, (first, 0))

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
        """One training step over a batch of finished groups: one optimiser update per mini-batch
        of ``grpo.mini_batch_groups`` groups (the whole batch in one update when unset), each
        accumulating gradients over its micro-batches. The version goes up once per step: it
        names the weights the rollouts are generated with, which change once, at the weight sync.

        Sharded over several processes, every rank is given the whole batch (rank 0 announces
        it), splits it into the same mini-batches, takes every ``world``-th sequence of each and
        runs as many micro-batches as the busiest rank; the normaliser is the whole mini-batch's,
        and FSDP sums the gradients."""
        start = time.perf_counter()
        shards = self.coordinator
        if shards is not None:
            shards.announce("step", seqs)
        if not seqs:  # every group had one reward for all (no advantage): the same keys, no values
            return {"learner_s": 0.0, "sequences": 0, "trained_tokens": 0, "updates": 0, "loss": None, "kl": None,
                    "clip_fraction": None, "ratio_mean": None, "grad_norm": None,
                    **_gap_stats({"tokens": 0}, self.cfg.tis_cap)}
        minis = mini_batches(seqs, self.cfg.mini_batch_groups)
        # The updates after the first score tokens under weights the earlier ones moved: their "old"
        # policy (the PPO ratio's, the importance weight's, the logged gap's) is the learner as it
        # was before the step, computed first.
        before = [None] + [self._logprobs_before(mini) for mini in minis[1:]]
        totals = {"loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "ratio_mean": 0.0, "tokens": 0}
        gap = {"abs": 0.0, "diff": 0.0, "tokens": 0, "truncated": 0}
        norms = [self._update(mini, prior, totals, gap) for mini, prior in zip(minis, before)]
        if shards is not None:
            keys = ("loss", "kl", "clip_fraction", "ratio_mean", "tokens")
            summed = sum_over_ranks([totals[k] for k in keys] + [gap[k] for k in gap])
            totals.update(zip(keys, summed[:len(keys)]))
            gap.update(zip(list(gap), summed[len(keys):]))
        self.version += 1
        self.step_count += 1
        n = max(totals["tokens"], 1)
        return {"learner_s": round(time.perf_counter() - start, 4), "sequences": len(seqs),
                "trained_tokens": int(totals["tokens"]), "updates": len(minis),
                "loss": round(totals["loss"] / len(minis), 6),
                # not computed without a reference model or with kl_coef 0: absent, never a 0 that
                # reads as "the policy did not move"
                "kl": round(totals["kl"] / n, 6) if self.ref_model is not None and self.cfg.kl_coef else None,
                "clip_fraction": round(totals["clip_fraction"] / n, 4),
                "ratio_mean": round(totals["ratio_mean"] / n, 6), "grad_norm": round(sum(norms) / len(norms), 6),
                **_gap_stats(gap, self.cfg.tis_cap)}

    def _logprobs_before(self, mini: list[Sequence]) -> list[torch.Tensor]:
        """The current model's log-probs of ``mini``, one tensor per micro-batch (no gradient):
        the pre-step policy of an update that runs after others in the same step."""
        episode_tokens = _episode_tokens(mini)
        out = []
        with torch.no_grad():
            for micro in _micro_batches(mini, self.cfg.micro_batch_size, self.coordinator):
                ids, attention, mask, *_ = self._pad(micro, episode_tokens)
                out.append(self.sequence_logprobs(self.model, ids, attention, first_trained(mask)))
        return out

    def _update(self, mini: list[Sequence], prior: list[torch.Tensor] | None, totals: dict[str, Any],
                gap: dict[str, Any]) -> float:
        """One optimiser update over ``mini`` (gradient accumulation over micro-batches); adds its
        statistics to ``totals`` and ``gap`` and returns the gradient norm before clipping.
        ``prior``: the pre-step log-probs of each micro-batch (None: the model has not moved yet
        in this step, so its own detached log-probs are the pre-step ones)."""
        cfg = self.cfg
        # seq_mean weighs episodes, not rows: an episode the history window split is one episode
        episode_tokens = _episode_tokens(mini)
        normalizer = float(sum(s.generated for s in mini)) if cfg.loss_agg == "token_mean" else float(len(episode_tokens))
        self.optimizer.zero_grad(set_to_none=True)
        for k, micro in enumerate(_micro_batches(mini, cfg.micro_batch_size, self.coordinator)):
            ids, attention, mask, old, advantages, seq_tokens = self._pad(micro, episode_tokens)
            first = first_trained(mask)
            logp = self.sequence_logprobs(self.model, ids, attention, first)
            current = logp.detach() if prior is None else prior[k]
            # Unknown sampling log-probs (an endpoint that returns none): on-policy, ratio 1 at the start.
            known = ~torch.isnan(old) & mask.bool()
            old = torch.where(torch.isnan(old), current, old)
            weights = None
            with torch.no_grad():  # the sampler-learner gap, logged whatever corrects it
                delta = torch.where(known, current - old, 0.0)
                gap["abs"] += float(delta.abs().sum())
                gap["diff"] += float(delta.sum())
                gap["tokens"] += int(known.sum())
                if cfg.tis_cap is not None:
                    raw = torch.exp(delta)
                    gap["truncated"] += int((known & (raw > cfg.tis_cap)).sum())
                    weights = raw.clamp(max=cfg.tis_cap)
            if cfg.tis_cap is not None:  # the ratio is the learner's own; the IS weight covers the gap
                old = current
            ref = None
            if self.ref_model is not None and cfg.kl_coef:
                with torch.no_grad():
                    ref = self.sequence_logprobs(self.ref_model, ids, attention, first)
            loss, stats = grpo_loss(logp, old, advantages, mask, cfg.clip_eps, cfg.clip_eps_high, ref,
                                    cfg.kl_coef, cfg.loss_agg, normalizer, seq_tokens, weights)
            loss.backward()
            totals["loss"] += stats.loss
            for key in ("kl", "clip_fraction", "ratio_mean"):
                totals[key] += getattr(stats, key) * stats.tokens
            totals["tokens"] += stats.tokens
        grad_norm = torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad],
                                                   cfg.max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP: the global norm
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        return float(grad_norm)

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


def first_trained(mask: torch.Tensor) -> int:
    """The first target column (of ``[B, T-1]``) that any row's loss reads: every column before it
    is prompt in every row."""
    columns = mask.bool().any(dim=0).nonzero()
    return int(columns[0]) if len(columns) else 0


def output_logits(model: Any, ids: torch.Tensor, attention: torch.Tensor, first: int) -> torch.Tensor:
    """The logits that predict targets ``first + 1 .. T-1`` (``[B, T-1-first, V]``): the model's
    output layer applied from position ``first`` on only (transformers' ``logits_to_keep``)."""
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=ids.shape[1] - first).logits[:, :-1]
    # A model that ignores logits_to_keep would pair every logit with the wrong target, silently.
    if logits.shape[1] != ids.shape[1] - 1 - first:
        raise RuntimeError(f"{type(model).__name__} ignored logits_to_keep ({logits.shape[1]} positions, expected "
                           f"{ids.shape[1] - 1 - first}): transformers >= 4.50 is needed")
    return logits


def mini_batches(seqs: list[Sequence], groups_per_update: int | None) -> list[list[Sequence]]:
    """The batch split into the optimiser updates of one step: ``groups_per_update`` groups
    (tasks) each, in the batch's order, a group never split (its advantages are relative to each
    other); None: one update over everything. The paper's step is 64 groups in mini-batches of 16:
    four updates."""
    if not groups_per_update:
        return [seqs]
    order = list(dict.fromkeys(s.group for s in seqs))
    chunks = [set(order[i:i + groups_per_update]) for i in range(0, len(order), groups_per_update)]
    return [[s for s in seqs if s.group in chunk] for chunk in chunks]


def _episode_tokens(seqs: list[Sequence]) -> Counter[Any]:
    """Generated tokens per episode (rows of one episode the history window split, together)."""
    counts: Counter[Any] = Counter()
    for s in seqs:
        counts[s.episode_id or id(s)] += s.generated
    return counts


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
