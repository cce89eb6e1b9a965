"""The benchmarks' virtualenvs: one per suite, pinned by ``pins/<suite>.txt``, cached outside
the repo (``trainer/venvs.py``). Standard library only, so ``.ci/run`` prepares them before the
project's environment exists:

    python3 -m awm.trainer.suites.envs            # all suites: install if missing, print the pythons
    python3 -m awm.trainer.suites.envs tau2       # one
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from awm.trainer.venvs import CachedVenv

PINS = Path(__file__).with_name("pins")

# The import that proves an install usable: each harness's entry point.
VENVS: dict[str, CachedVenv] = {
    "bfcl": CachedVenv("ood-bfcl", PINS / "bfcl.txt",
                       check="import bfcl_eval.__main__, bfcl_eval.model_handler.api_inference.openai_completion"),
    "tau2": CachedVenv("ood-tau2", PINS / "tau2.txt", check="import tau2.run, tau2.cli"),
    "mcp-universe": CachedVenv("ood-mcpuniverse", PINS / "mcpuniverse.txt",
                               check="import mcpuniverse.benchmark.runner"),
}


def python_for(suite: str, override: str | None = None, install: bool = True) -> Path:
    """The interpreter that runs ``suite``'s harness: ``override`` (any Python with the benchmark
    installed, e.g. a checkout of the benchmark's repository) or the suite's cached virtualenv,
    installed on first use unless ``install`` is false (then RuntimeError if it is missing)."""
    if override:
        return Path(override)
    venv = VENVS[suite]
    if venv.installed():
        return venv.python()
    if not install:
        raise RuntimeError(f"the {suite} harness is not installed in {venv.env_dir()} "
                           f"(python3 -m awm.trainer.suites.envs {suite})")
    return venv.install()


if __name__ == "__main__":
    failed = False
    for name in sys.argv[1:] or list(VENVS):
        try:
            print(f"{name}: {VENVS[name].install()}")
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{name}: FAILED {exc}", file=sys.stderr)
            failed = True
    sys.exit(1 if failed else 0)
