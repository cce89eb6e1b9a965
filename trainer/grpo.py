"""GRPO's math, and nothing else (tested against hand-computed values).

* Advantages are group-relative: the G episodes of one task are compared with each other,
  ``A_i = (r_i - mean(r)) / (std(r) + eps)`` (``std`` with Bessel's correction, as TRL does;
  ``scale=False`` gives Dr. GRPO's unscaled ``r_i - mean(r)``). Masked episodes (our failures)
  take no part: they are neither in the mean nor given an advantage.
* The policy loss is PPO's clipped surrogate per token,
  ``-min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)`` with
  ``ratio = exp(logp - logp_old)``, plus ``beta * KL`` to a reference policy with the
  non-negative ``k3`` estimator ``exp(ref - logp) - (ref - logp) - 1``.
* Truncated importance sampling (``token_weights``): where the sampler's log-probs differ from the
  learner's - tokens sampled by older weights, or by another numeric path such as a vLLM
  server's - each token's policy term is scaled by ``min(pi_learner / pi_sampler, C)``.
* Only tokens with ``mask = 1`` count (what the policy generated, never tool results or prompts).
  ``token_mean`` averages over all such tokens of the batch (DAPO), ``seq_mean`` averages per
  sequence first (the original GRPO). ``normalizer`` lets gradient accumulation divide by the
  whole batch's count instead of the micro-batch's, so accumulating equals one big batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def group_advantages(rewards: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-4,
                     scale: bool = True) -> torch.Tensor:
    """Advantages of one group's rewards (shape ``[G]``); invalid members get 0."""
    rewards = rewards.float()
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid.bool()
    out = torch.zeros_like(rewards)
    n = int(valid.sum())
    if n < 2:
        return out
    r = rewards[valid]
    centred = r - r.mean()
    out[valid] = centred / (r.std(unbiased=True) + eps) if scale else centred
    return out


@dataclass
class LossStats:
    loss: float
    policy_loss: float
    kl: float
    clip_fraction: float
    ratio_mean: float
    tokens: int


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip_eps: float = 0.2, clip_eps_high: float | None = None, ref_logp: torch.Tensor | None = None,
              kl_coef: float = 0.0, agg: str = "token_mean",
              normalizer: float | None = None, seq_tokens: torch.Tensor | None = None,
              token_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, LossStats]:
    """The clipped GRPO objective for token log-probs ``[B, T]``, advantages ``[B]``, mask ``[B, T]``.

    ``normalizer``: tokens of the whole batch (``token_mean``) or episodes (``seq_mean``);
    defaults to this call's own count. ``seq_tokens`` (``seq_mean``): the generated tokens of each
    row's whole episode - where the history window split an episode into several rows, each row
    is divided by the episode's count, so an episode weighs one however it was split.
    ``token_weights`` (``[B, T]``, no gradient): truncated importance weights that scale each
    token's policy term (off-policy correction; the KL term is not weighted).
    """
    # Masked positions (prompts, tool results, padding) may hold -inf log-probs - a token outside
    # the allowed set - and -inf - -inf is NaN, which a multiplication by the mask would keep.
    # Zeroing them first keeps the loss and its gradient finite.
    keep = mask.bool()
    logp = torch.where(keep, logp, 0.0)
    old_logp = torch.where(keep, old_logp, 0.0)
    if ref_logp is not None:
        ref_logp = torch.where(keep, ref_logp, 0.0)
    mask = mask.to(logp.dtype)
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logp - old_logp)
    adv = advantages.to(logp.dtype).unsqueeze(-1)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + high) * adv)
    per_token = -surrogate if token_weights is None else -surrogate * token_weights.detach()
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + kl_coef * kl
    if agg == "token_mean":
        total = per_token.mul(mask).sum()
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1)
    elif agg == "seq_mean":
        per_row = mask.sum(-1) if seq_tokens is None else seq_tokens.to(logp.dtype)
        total = (per_token.mul(mask).sum(-1) / per_row.clamp(min=1)).sum()
        denom = normalizer if normalizer is not None else logp.shape[0]
    else:
        raise ValueError(f"unknown loss aggregation {agg!r} (token_mean | seq_mean)")
    loss = total / denom
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        clipped = ((ratio < 1 - clip_eps) & (adv < 0)) | ((ratio > 1 + high) & (adv > 0))
        stats = LossStats(float(loss), float((-surrogate).mul(mask).sum() / n), float(kl.mul(mask).sum() / n),
                          float(clipped.to(logp.dtype).mul(mask).sum() / n), float(ratio.mul(mask).sum() / n),
                          int(mask.sum()))
    return loss, stats


def token_logprobs(logprobs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Pick each target's log-probability from ``[B, T, V]`` log-probs."""
    return logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
