"""What applying the output layer from the first trained token on saves the GRPO learner
(trainer/learner.py: ``output_logits``, transformers' ``logits_to_keep``).

    python -m bench.learner [--model DIR] [--prompt 420] [--completion 50] [--sequences 16]   # prints JSON

A GRPO step over ``--sequences`` sequences of ``--prompt`` context tokens and ``--completion``
trained tokens (micro-batches of 4, LoRA rank 16 as examples/train-smollm2.yaml trains it), run
twice in fresh processes: once with the logits of every position (the learner before: ``first``
forced to 0) and once from the first trained token. Each process reports its step time and its
peak resident memory; the baseline is the first variant of the same run. The default model is the
real one (tests/real_model.py: SmolLM2-135M, a 49,152-token vocabulary).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench.runtime import machine


def one(model_dir: str, prompt: int, completion: int, sequences: int, full: bool) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from awm.trainer import learner as learner_mod
    from awm.trainer.config import GRPOConfig
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.samples import Sequence
    from awm.trainer.vllm_policy import LoraSpec

    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = LoraSpec(rank=16, alpha=32).apply(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    if full:  # the learner before the change: logits for every position
        learner_mod.first_trained = lambda mask: 0
    vocab = model.config.vocab_size
    seqs = []
    for i in range(sequences):
        ids = torch.randint(0, vocab, (prompt + completion,), generator=torch.Generator().manual_seed(i)).tolist()
        seqs.append(Sequence(ids, [0] * prompt + [1] * completion, [0.0] * prompt + [-2.0] * completion,
                             advantage=1.0 if i % 2 else -1.0))
    learner = learner_mod.Learner(model, GRPOConfig(lr=1e-5, micro_batch_size=4, tis_cap=2.0), SamplingSpec())
    learner.step(seqs)  # warm-up (allocator, first-call costs)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        learner.step(seqs)
        times.append(time.perf_counter() - t0)
    return {"step_s": round(min(times), 2), "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None, help="model directory (default: tests/real_model.py's)")
    parser.add_argument("--prompt", type=int, default=420)
    parser.add_argument("--completion", type=int, default=50)
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--variant", choices=["full", "from_first"], help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.variant:
        print(json.dumps(one(a.model, a.prompt, a.completion, a.sequences, a.variant == "full")))
        return
    if a.model is None:  # run from the repository's root (python -m bench.learner)
        from tests import real_model

        a.model = str(real_model.install())
    results = {}
    for variant in ("full", "from_first"):  # fresh processes: peak memory is per process
        out = subprocess.run([sys.executable, "-m", "bench.learner", "--variant", variant, "--model", a.model,
                              "--prompt", str(a.prompt), "--completion", str(a.completion),
                              "--sequences", str(a.sequences)], capture_output=True, text=True, check=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
    base, new = results["full"], results["from_first"]
    print(json.dumps({"benchmark": "learner_logits", "machine": machine(), "model": Path(a.model).name if Path(a.model).name != "model" else Path(a.model).parent.name,
                      "sequences": a.sequences, "prompt_tokens": a.prompt, "completion_tokens": a.completion,
                      "baseline_full_logits": base, "from_first_trained_token": new,
                      "step_speedup": round(base["step_s"] / new["step_s"], 2),
                      "peak_rss_ratio": round(new["peak_rss_mb"] / base["peak_rss_mb"], 2)}, indent=1))


if __name__ == "__main__":
    main()
