"""Two learner steps on a fixed batch, the same in one process and sharded under torchrun.

    torchrun --nproc-per-node 2 -m tests.distributed_step OUT.pt     # from the repository's root

Under torchrun every rank builds the tiny Qwen3 test model (tests/fixtures/tiny-qwen), shards it
with FSDP2 (trainer/distributed.py, gloo on CPU) and runs the learner - the full model, then a
LoRA one, in one launch (process start-up is most of the time); rank 0 announces the steps as
``awm train`` does and writes the gathered weights and each step's statistics to OUT.pt.
tests/test_distributed_learner.py runs :func:`run` in its own process for the reference and
compares. The batch has an odd number of sequences of different lengths, so the ranks' shares
and micro-batch counts differ (the padding path runs).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch

from awm.trainer.config import GRPOConfig
from awm.trainer.learner import Learner
from awm.trainer.local_policy import SamplingSpec
from awm.trainer.samples import Sequence
from tests.tiny_qwen import MODEL_DIR

GRPO = GRPOConfig(lr=1e-3, micro_batch_size=2, tis_cap=2.0, max_grad_norm=1.0)


def batch(vocab: int, seed: int) -> list[Sequence]:
    """Five sequences: a prompt (mask 0), generated tokens (mask 1) with sampling log-probs
    near the model's, a tool result, more generated tokens; advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(5):
        prompt, reply, result, more = (int(x) for x in torch.randint(3, 12, (4,), generator=g))
        n = prompt + reply + result + more
        ids = torch.randint(0, vocab, (n,), generator=g).tolist()
        mask = [0] * prompt + [1] * reply + [0] * result + [1] * more
        old = [(-math.log(vocab) + float(torch.randn((), generator=g)) * 0.3) if m else 0.0 for m in mask]
        out.append(Sequence(ids, mask, old, advantage=(1.0 if i % 2 else -0.8) * (1 + i / 10), episode_id=f"e{i}"))
    return out


def model(lora: bool) -> Any:
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True, dtype=torch.float32)
    if not lora:
        return base
    from awm.trainer.vllm_policy import LoraSpec

    torch.manual_seed(0)  # the adapter's A matrices: the same on every rank and in the reference
    return LoraSpec(rank=4, alpha=8).apply(base)


def run(lora: bool, coordinator: Any = None) -> dict[str, Any]:
    """Two steps; returns the trained weights (rank 0) and the steps' statistics."""
    torch.manual_seed(0)
    m = model(lora)
    if coordinator is not None:
        from awm.trainer.distributed import shard

        m = shard(m)
    learner = Learner(m, GRPO, SamplingSpec(temperature=1.0), coordinator=coordinator)
    if coordinator is not None and coordinator.rank != 0:
        coordinator.serve(learner)
        return {}
    vocab = m.config.vocab_size if hasattr(m, "config") else m.get_base_model().config.vocab_size
    stats = [learner.step(batch(vocab, seed)) for seed in (1, 2)]
    state = learner.export_state()  # sharded: the trainable weights, gathered
    if state is None:
        state = {k: v.detach().clone() for k, v in m.named_parameters() if v.requires_grad}
    if coordinator is not None:
        coordinator.stop()
    return {"weights": state, "stats": stats}


def main() -> None:
    from awm.trainer.distributed import Coordinator, init, leave

    torch.set_num_threads(1)
    out = Path(sys.argv[1])
    coordinator = Coordinator(init("gloo"))
    try:
        results = {kind: run(kind == "lora", coordinator) for kind in ("full", "lora")}
        if coordinator.rank == 0:
            torch.save({**results, "world": coordinator.world}, out)
    finally:
        coordinator.close()
    leave(0)  # as `awm train` does: see leave() for the abort a normal exit risks here


if __name__ == "__main__":
    main()
