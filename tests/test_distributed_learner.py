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

ROOT = Path(distributed_step.__file__).resolve().parents[1]  # torchrun -m runs it from here
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One torchrun launch of two processes for both cases (start-up is most of its time)."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    require(exe, "torchrun is not installed next to this interpreter (torch's console script)")
    out = tmp_path_factory.mktemp("fsdp") / "sharded.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(exe), "--standalone", "--nproc-per-node", "2", "-m", distributed_step.__name__, str(out)],
                       capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    result = torch.load(out, weights_only=False)
    assert result["world"] == 2
    return result


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_process_fsdp_step_equals_the_single_process_step(sharded: dict, lora: bool) -> None:
    mine = sharded["lora" if lora else "full"]
    single = distributed_step.run(lora)
    assert set(mine["weights"]) == set(single["weights"])  # the trainable weights (a LoRA's adapter)
    initial = distributed_step.model(lora).state_dict()
    moved = 0
    for name, expected in single["weights"].items():
        got = mine["weights"][name]
        assert got.shape == expected.shape, name
        # atol: half a step at lr 1e-3. Adam divides by sqrt(v): an element whose gradient is near
        # zero (a rare token's embedding) moves by up to lr on rounding alone (the shards sum in
        # another order); a weight the sharded step missed or doubled is off by a whole step.
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=5e-4, msg=lambda m: f"{name}: {m}")
        moved += int(not torch.equal(expected, initial[name]))
    assert moved > 0  # the steps changed the weights (a comparison of two untouched models proves nothing)
    # AdamW's update hardly depends on the gradients' scale, so averaged instead of summed
    # gradients would pass the weights above: the gradient norm and the loss catch them
    for got, expected in zip(mine["stats"], single["stats"]):
        assert got["sequences"] == expected["sequences"] == 5
        assert got["trained_tokens"] == expected["trained_tokens"] > 0
        for key in ("loss", "kl", "clip_fraction", "ratio_mean", "grad_norm", "logprob_gap", "tis_truncated_fraction"):
            if expected[key] is None:  # kl with no reference model: computed on neither side
                assert got[key] is None, key
            else:
                assert got[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6), key


def test_leave_runs_the_exit_handlers_and_flushes_before_ending_the_process(tmp_path: Path) -> None:
    """A torchrun rank ends through leave() (no interpreter finalisation, where gloo's threads
    can abort the process): what a normal exit would still do - exit handlers, unflushed output,
    the exit code - happens all the same."""
    marker = tmp_path / "atexit"
    code = ("import atexit, sys\n"
            "from awm.trainer.distributed import leave\n"
            f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
            "sys.stdout.write('no newline, still buffered')\n"
            "leave(3)\n"
            "print('not reached')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "no newline, still buffered"
    assert marker.read_text() == "ran"
