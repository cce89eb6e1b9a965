"""Building a run's policy: the trainable model, its frozen reference and tokenizer (from a
checkpoint when resuming), the vLLM policy and server of ``policy.kind: vllm``, and the device
and compute precision they run in. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, NamedTuple

import torch

from awm.trainer.config import TrainConfig
from awm.trainer.local_policy import SamplingSpec
from awm.trainer.precision import cast_weights

log = logging.getLogger("awm.trainer.models")


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


async def vllm_policy(cfg: TrainConfig, tokenizer: Any, version: int, run_dir: Path) -> tuple[Any, Any]:
    """The vLLM policy of a run, and the server it started (``policy.server``) or None."""
    from awm.trainer.chatformat import chat_format
    from awm.trainer.vllm_policy import VllmPolicy
    from awm.trainer.vllm_server import VllmServer

    pc = cfg.policy
    server = None
    base_url = pc.base_url
    api_key = ""  # a server of our own with --api-key: the policy sends that key
    if pc.server:
        spec = dict(pc.server)
        server = VllmServer(python=str(spec.pop("python")), model=str(Path(pc.path or "").resolve()),
                            scratch=run_dir / "vllm", served_name=pc.served_model,
                            lora_rank=pc.lora.rank if pc.weight_sync == "lora" else 0,
                            extra_args=list(spec.pop("args", [])), **spec)
        await asyncio.to_thread(server.start)
        base_url = server.base_url
        api_key = server.api_key or ""
    policy = VllmPolicy(str(base_url), pc.served_model, api_key=api_key, temperature=pc.temperature,
                        max_tokens=pc.max_new_tokens, timeout_s=pc.request_timeout_s, version=version,
                        sync_dir=pc.sync_dir or str(run_dir / "weights"), weight_sync=pc.weight_sync,
                        thinking=pc.thinking, format=chat_format(tokenizer, pc.thinking), extra_body=dict(pc.extra_body))
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
