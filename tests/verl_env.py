"""A virtualenv with verl for tests/test_verl.py, kept out of the project's own environment:
verl 0.9.1 requires ``transformers>=5.5.3,<5.11`` (and Ray), the project's test extra resolves a
newer transformers. Cached by the content of its pins and of pyproject.toml (trainer/venvs.py):

    ${AWM_VERL_CACHE:-~/.cache/awm}/verl-<sha256, 12 hex>/

It holds verl and the dependencies of awm's ``trainer`` extra; the tests put awm's own code from
the checkout first on ``PYTHONPATH``, so the environment never goes stale with it. Standard
library only:

    python3 tests/verl_env.py      # install if missing (a few minutes the first time), print the python path
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from awm.trainer.venvs import CachedVenv

VERL = CachedVenv("verl", Path(__file__).with_name("verl") / "requirements.txt",
                  check="import verl.experimental.agent_loop.agent_loop", cache_var="AWM_VERL_CACHE",
                  project_extras="trainer")


def env_dir() -> Path:
    return VERL.env_dir()


def python() -> Path:
    return VERL.python()


def installed() -> bool:
    return VERL.installed()


def install() -> Path:
    """Create the environment if it is missing; returns its python (RuntimeError: the installer's output)."""
    return VERL.install(timeout=2400)


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"verl_env: {exc}")
