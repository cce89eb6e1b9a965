"""A supervised warm start: fine-tune a model on the catalog's reference solutions before GRPO.

Why: GRPO learns only from groups whose rewards differ. A small model that never writes a
well-formed call (SmolLM2-135M answers in prose, or fills arguments with pieces of the schema:
docs/benchmarks.md) gives every episode the same reward, and nothing is learned. Every gated
task of a catalog carries a reference solution that passed the positive gate: a demonstration
that the environment itself has checked.

How:

1. **Demonstrations** - each task's reference solution is played as an episode by
   :class:`~awm.trainer.policy.ReplayPolicy` through the same agent loop and instance source the
   policy will meet (:func:`awm.trainer.agent.run_episode`): the same system prompt, tool list
   (full or short descriptions), tool format and tool results. Only episodes the verifier
   calls ``complete`` are kept; the rest are reported, never trained on.
2. **Tokens** - the episodes become packed sequences exactly as GRPO's are
   (:func:`awm.trainer.samples.episode_sequences`, rendered with the chat template the server
   will apply: ``chat_template`` when the server is given ``--chat-template``); the loss reads
   the assistant's tokens only (its calls and its final answer), never the prompt or results.
3. **Training** (:func:`fine_tune`, after the fleet has stopped) - cross-entropy over those
   tokens, one sequence per forward pass, AdamW, a LoRA (merged into the weights at the end) or
   all weights, wherever ``torch`` puts the model (the CPU here); the output is an ordinary model
   directory (safetensors, tokenizer, the chat template, ``warmstart.json`` with the losses) that
   vLLM serves and ``policy.path`` names.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from awm.bundle import EnvBundle
from awm.episode.reward import RewardConfig
from awm.trainer.agent import AgentConfig
from awm.trainer.eval import select_tasks
from awm.trainer.learner import first_trained, output_logits
from awm.trainer.policy import ReplayPolicy
from awm.trainer.rollout import InstanceSource, RolloutConfig, RolloutService, TaskRef
from awm.trainer.samples import Sequence, episode_sequences
from awm.trainer.trajectory import Trajectory


@dataclass
class WarmStartConfig:
    epochs: int = 3
    lr: float = 2e-4
    batch_size: int = 4  # sequences per optimiser step
    lora_rank: int = 16  # 0: train every weight
    lora_alpha: float = 32.0
    max_grad_norm: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.lora_rank < 0 or self.lr <= 0:
            raise ValueError("warm start: epochs and batch_size must be at least 1, lora_rank at least 0, lr positive")


@dataclass
class Demonstrations:
    trajectories: list[Trajectory] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # "env/task" -> why it is not a demonstration


def demonstration_tasks(bundles: list[EnvBundle], task_ids: list[str] | None = None,
                        allow_ungated: bool = False) -> tuple[list[TaskRef], dict[str, str]]:
    """The tasks with a reference solution (gated ones unless ``allow_ungated``)."""
    chosen = select_tasks(bundles, task_ids, allow_ungated)
    solutions = {(b.name, t.id): bool(t.solution) for b in bundles for t in b.tasks}
    skipped = {f"{t.env}/{t.task_id}": "no reference solution" for t in chosen if not solutions[(t.env, t.task_id)]}
    return [t for t in chosen if solutions[(t.env, t.task_id)]], skipped


async def demonstrations(source: InstanceSource, bundles: list[EnvBundle], tasks: list[TaskRef],
                         agent: AgentConfig) -> Demonstrations:
    """Every task's reference solution played through the agent loop, one episode each."""
    policy = ReplayPolicy(bundles, tool_format=agent.tool_format)  # written as the policy must write them
    service = RolloutService(source, policy, tasks, agent, RewardConfig(), RolloutConfig(group_size=1))
    groups = await asyncio.gather(*(service.run_group(t) for t in tasks))
    out = Demonstrations()
    for task, group in zip(tasks, groups):
        traj = group.trajectories[0]
        verdict = (traj.verdict or {}).get("verdict")
        if verdict == "complete" and not traj.masked:
            out.trajectories.append(traj)
        else:
            out.skipped[f"{task.env}/{task.task_id}"] = f"the replay was not complete: {verdict} {traj.stop_reason}"
    return out


def sequences(trajectories: list[Trajectory], fmt: Any) -> list[Sequence]:
    """The demonstrations as packed token sequences; the mask marks the assistant's tokens."""
    return [s for traj in trajectories for s in episode_sequences(traj, fmt) if s.generated]


def token_loss(model: Any, seq: Sequence, device: torch.device) -> torch.Tensor:
    """Mean cross-entropy of one sequence's trained tokens; the output layer runs from its first
    trained token on (the prompt needs no logits)."""
    ids = torch.tensor([seq.input_ids], device=device)
    mask = torch.tensor([seq.loss_mask[1:]], dtype=torch.float32, device=device)  # aligned with targets 1..T-1
    first = first_trained(mask)
    logits = output_logits(model, ids, torch.ones_like(ids), first)
    losses = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), ids[:, first + 1:], reduction="none")
    kept = mask[:, first:]
    return (losses * kept).sum() / kept.sum().clamp(min=1)


def train(model: Any, seqs: list[Sequence], cfg: WarmStartConfig, on_step: Any = None) -> list[float]:
    """Supervised steps over ``seqs``; returns the loss of every step."""
    if not seqs:
        raise ValueError("warm start: no demonstration sequences to train on")
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    order = list(range(len(seqs)))
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    model.train()
    for epoch in range(cfg.epochs):
        rng.shuffle(order)
        for start in range(0, len(order), cfg.batch_size):
            chosen = [seqs[i] for i in order[start:start + cfg.batch_size]]
            optimizer.zero_grad(set_to_none=True)
            # one sequence per forward: the batch's memory is its longest sequence's, not B times it
            tokens = sum(s.generated for s in chosen)
            total = 0.0
            for s in chosen:
                loss = token_loss(model, s, device) * (s.generated / tokens)
                loss.backward()
                total += float(loss.detach())
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            optimizer.step()
            losses.append(round(total, 5))
            if on_step is not None:
                on_step(epoch, len(losses), total)
    model.eval()
    return losses


def load(model_dir: Path, chat_template: Path | None, lora_rank: int, lora_alpha: float) -> tuple[Any, Any]:
    """The model (float32, trainable: a LoRA or every weight) and its tokenizer, with the chat
    template the server will use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{model_dir} is not a model directory transformers can load: {exc}") from None
    if chat_template is not None:
        tokenizer.chat_template = chat_template.read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{model_dir}: the tokenizer has no chat template; give --chat-template, the one the "
                         "server applies (demonstrations must be rendered as the policy will see them)")
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    if lora_rank:
        from awm.trainer.vllm_policy import LoraSpec

        model = LoraSpec(rank=lora_rank, alpha=lora_alpha).apply(model)
    return model, tokenizer


def save(model: Any, tokenizer: Any, out: Path, chat_template: Path | None, record: dict[str, Any]) -> Path:
    """An ordinary model directory (a LoRA merged into the weights), written beside ``out`` and
    renamed into place: a half-written directory is never taken for a model."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if chat_template is not None:
        shutil.copyfile(chat_template, tmp / chat_template.name)
    (tmp / "warmstart.json").write_text(json.dumps(record, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)  # an earlier warm start (check_output refused anything else)
    tmp.rename(out)
    return out


def check_output(out: Path, model_dir: Path) -> None:
    """``out`` may be new or an earlier warm start's directory, never anything else (a typo must
    not delete a directory of someone's), and never the model trained from."""
    if out.resolve() == model_dir.resolve():
        raise ValueError(f"--out {out} is the model being fine-tuned: write the warm start elsewhere")
    if out.exists() and not (out / "warmstart.json").is_file():
        raise ValueError(f"--out {out} exists and is not a warm start's directory (no warmstart.json): "
                         "choose a new directory")


def fine_tune(demos: Demonstrations, tasks: list[TaskRef], agent: AgentConfig, model_dir: Path, out: Path,
              cfg: WarmStartConfig, chat_template: Path | None = None, skipped: dict[str, str] | None = None,
              on_step: Any = None) -> dict[str, Any]:
    """Training on the demonstrations and the saved model; returns the record written beside it.
    No instance is needed any more (run it after the fleet that replayed them has stopped)."""
    from awm.trainer.chatformat import chat_format

    check_output(out, model_dir)
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    model, tokenizer = load(model_dir, chat_template, cfg.lora_rank, cfg.lora_alpha)
    seqs = sequences(demos.trajectories, chat_format(tokenizer))
    losses = train(model, seqs, cfg, on_step)
    record = {"base_model": model_dir.name, "config": asdict(cfg), "agent": {
                  "tool_format": agent.tool_format, "tool_descriptions": agent.tool_descriptions},
              "tasks": [f"{t.env}/{t.task_id}" for t in tasks],
              "demonstrations": [f"{t.env}/{t.task_id}" for t in demos.trajectories],
              "skipped": {**(skipped or {}), **demos.skipped}, "sequences": len(seqs),
              "trained_tokens": sum(s.generated for s in seqs), "tokens": sum(len(s.input_ids) for s in seqs),
              "losses": losses}
    save(model, tokenizer, out, chat_template, record)
    record["seconds"] = round(time.perf_counter() - start, 1)
    (out / "warmstart.json").write_text(json.dumps(record, indent=1) + "\n")
    return record
