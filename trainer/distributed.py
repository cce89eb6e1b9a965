"""The learner over several processes: FSDP2 (``torch.distributed.fsdp.fully_shard``) under ``torchrun``.

    torchrun --nproc-per-node 8 --no-python awm train --config run.yaml     # learner.distributed: true

Every process builds the same model from the same weights and shards it with ``fully_shard``
(each decoder layer - the classes a transformers model names in ``_no_split_modules`` - then the
root), so parameters, gradients and AdamW state are split across the processes and FSDP gathers a
layer's weights for its forward and backward and reduce-scatters its gradients. Nothing here
moves tensors between processes by hand: the engine does that.

Rank 0 is the run: rollouts, rewards, metrics, checkpoints, weight sync to the vLLM server. The
other ranks only take part in what is collective, in the same order as rank 0:
:meth:`Coordinator.serve` waits for rank 0's next command (one ``broadcast_object_list``: the
batch's sequences, or "export the weights", "save", "stop") and runs the same learner method.
A step splits the batch's sequences round-robin over the ranks, each rank accumulating its share;
the loss of each sequence is divided by the *whole* batch's token (or episode) count as before,
and FSDP is told to sum gradients rather than average them (``set_gradient_divide_factor(1)``),
so the step equals the single-process step on the same batch up to float rounding
(tests/test_distributed_learner.py). Ranks run the same number of micro-batches (FSDP's
collectives must match): a rank short of sequences runs an empty one, whose loss mask is zero.
Logged statistics (loss, clip fraction, the sampler-learner gap) are summed over ranks with one
``all_reduce``.

Weights leave the shards through ``torch.distributed.checkpoint.state_dict`` (full state dict,
gathered on rank 0 on the CPU): the weight sync after each step and checkpoints. Generation must
then be a server's (``policy.kind: vllm``): a sharded model cannot sample on rank 0 alone.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
import torch.distributed as dist

log = logging.getLogger("awm.trainer.distributed")

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class Rank:
    """Where this process stands in the torchrun job (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``)."""

    rank: int
    world: int
    local: int

    @classmethod
    def from_env(cls) -> Rank:
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                   int(os.environ.get("LOCAL_RANK", 0)))

    @property
    def main(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def init(backend: str = "auto") -> Rank:
    """Join the process group torchrun set up (``MASTER_ADDR``/``MASTER_PORT`` from its
    environment); ``auto`` is NCCL when this process has a GPU, else gloo (CPU)."""
    if backend not in BACKENDS:
        raise ValueError(f"learner.backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if not launched_by_torchrun():
        raise ValueError("learner.distributed needs a torchrun launch: torchrun --nproc-per-node N "
                         "--no-python awm train --config ...")
    where = Rank.from_env()
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(where.local)
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return where


def device_for(where: Rank, requested: str) -> str:
    """This process's GPU under torchrun (``cuda`` means the local rank's), else the requested one."""
    if requested in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{where.local}"
    return requested


def shard(model: Any) -> Any:
    """FSDP2 over the whole model: every decoder layer is its own unit, then the root holds the
    rest (embeddings, norm, output layer). Gradients are summed over ranks, not averaged: the
    loss is already normalised by the whole batch's count."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    names = set(getattr(_unwrap(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for unit in [*layers, model]:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no pre-scaled sum)
    log.info("FSDP2 over %d processes: %d layer units and the root", dist.get_world_size(), len(layers))
    return model


def _unwrap(model: Any) -> Any:
    """The transformers model inside a peft wrapper (which does not forward ``_no_split_modules``)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def full_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Every rank calls this together; rank 0 gets the trainable weights whole, on the CPU (the
    others an empty dict): all of a fully trained model, only the adapter of a LoRA one - its
    frozen base is never gathered, since neither the sync nor a checkpoint writes it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                ignore_frozen_params=True))


def full_optimizer_state(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimiser's state, gathered like :func:`full_state_dict` (rank 0 gets it all)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Every rank loads the full optimiser state of a checkpoint and keeps its own shard."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def sum_over_ranks(values: list[float]) -> list[float]:
    """Per-rank statistics summed over the ranks (one all_reduce of a small vector)."""
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor)
    return tensor.cpu().tolist()


class Coordinator:
    """Rank 0 announces each collective learner call; the other ranks follow (:meth:`serve`)."""

    def __init__(self, where: Rank) -> None:
        self.where = where

    @property
    def world(self) -> int:
        return self.where.world

    @property
    def rank(self) -> int:
        return self.where.rank

    def announce(self, command: str, payload: Any = None) -> None:
        """Rank 0: tell the others what comes next (they block in :meth:`serve` until then)."""
        if self.where.main:
            dist.broadcast_object_list([(command, payload)], src=0)

    def serve(self, learner: Any) -> None:
        """Ranks > 0: run rank 0's learner calls until it says stop (or its process group ends)."""
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            command, payload = box[0]
            if command == "stop":
                return
            if command == "step":
                learner.step(payload)
            elif command == "export":
                learner.export_state()
            elif command == "save":
                learner.save(*payload)
            else:
                raise RuntimeError(f"unknown learner command {command!r} from rank 0")

    def stop(self) -> None:
        self.announce("stop")

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def leave(code: int = 0) -> NoReturn:
    """End a torchrun process that took part in collectives, skipping the interpreter's finalisation.

    Why: gloo's worker threads let go of a finished collective's tensors a moment *after* the
    caller has seen it complete, and letting go of a tensor that Python has seen takes the GIL.
    When that moment falls after the interpreter began finalising - a rank > 0 returns at once
    after the last broadcast ("stop") - the thread is unwound inside a C++ destructor and the
    process aborts ("terminate called without an active exception", SIGABRT; about one launch
    in six on two busy cores). torchrun then reports a clean run as a failed rank. The threads
    cannot be joined first: the process group outlives ``destroy_process_group`` (DTensor's
    sharding caches keep its device mesh). So the exit handlers run and the standard streams
    are flushed here, and the process ends without finalisation (its threads end with it).
    """
    atexit._run_exitfuncs()  # what a normal exit runs before finalising (logging.shutdown among them)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
