"""Mixed precision shared by the learner and the local sampler: float32 master weights, compute
in ``policy.dtype``, and bfloat16 frozen copies that keep their float32 buffers."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision: matmuls in ``dtype`` while the weights, their gradients and the optimiser
    state stay float32. Training bfloat16 weights directly would round away every update smaller
    than 1/256 of a weight (most of them at RL learning rates)."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def cast_weights(model: Any, dtype: torch.dtype) -> Any:
    """Store a frozen copy's parameters in ``dtype`` (half the memory in bfloat16). Buffers stay
    as they are: ``model.to(dtype)`` would also round the rotary-position tables (``inv_freq``),
    and positions past a few hundred would come out garbled next to the learner's."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model
