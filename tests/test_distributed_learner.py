"""The learner sharded over two real processes (torchrun, FSDP2, gloo on CPU) takes the same step
as one process on the same batch.

Why it matters: a multi-GPU learner that silently averages gradients over ranks, drops a rank's
sequences or normalises by a rank's own token count trains a different objective; only a
comparison with the single-process step catches that. The batch (tests/distributed_step.py) has
five sequences for two ranks and micro-batches of two, so the ranks hold different shares and one
runs a padding micro-batch. Two optimiser steps, so AdamW's sharded state is carried over too.
Tolerances are float32 rounding (summation order differs between the two).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import distributed_step
from tests.conftest import require

SCRIPT = Path(distributed_step.__file__)


def torchrun(out: Path, *flags: str) -> None:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    require(exe, "torchrun is not installed next to this interpreter (torch's console script)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SCRIPT.parents[1])}
    r = subprocess.run([str(exe), "--standalone", "--nproc-per-node", "2", str(SCRIPT), str(out), *flags],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_process_fsdp_step_equals_the_single_process_step(tmp_path: Path, lora: bool) -> None:
    out = tmp_path / "sharded.pt"
    torchrun(out, *(["--lora"] if lora else []))
    sharded = torch.load(out, weights_only=False)
    single = distributed_step.run(lora)
    assert sharded["world"] == 2
    assert set(sharded["weights"]) == set(single["weights"])
    initial = distributed_step.model(lora).state_dict()
    moved = 0
    for name, expected in single["weights"].items():
        got = sharded["weights"][name]
        assert got.shape == expected.shape, name
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
        moved += int(not torch.equal(expected, initial[name]))
    assert moved > 0  # the steps changed the weights (a comparison of two untouched models proves nothing)
    for mine, theirs in zip(sharded["stats"], single["stats"]):
        assert mine["sequences"] == theirs["sequences"] == 5
        assert mine["trained_tokens"] == theirs["trained_tokens"] > 0
        for key in ("loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "logprob_gap", "tis_truncated_fraction"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
