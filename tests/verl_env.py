"""A virtualenv with verl for tests/test_verl.py, kept out of the project's own environment:
verl 0.9.1 requires ``transformers>=5.5.3,<5.11`` (and Ray), the project's test extra resolves a
newer transformers. Cached by the content of its pins and of pyproject.toml:

    ${AWM_VERL_CACHE:-~/.cache/awm}/verl-<sha256, 12 hex>/

It holds verl and the dependencies of awm's ``trainer`` extra; awm's own code is taken from the
checkout (``PYTHONPATH``), so the environment never goes stale with it. The installer and the
half-install guard are tests/vllm_env.py's. Standard library only:

    python3 tests/verl_env.py      # install if missing (a few minutes the first time), print the python path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.vllm_env import _run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PINS = Path(__file__).with_name("verl") / "requirements.txt"
_MARKER = ".awm-installed"


def _digest() -> str:
    h = hashlib.sha256(PINS.read_bytes())
    h.update((ROOT / "pyproject.toml").read_bytes())
    return h.hexdigest()[:12]


def env_dir() -> Path:
    root = os.environ.get("AWM_VERL_CACHE") or Path.home() / ".cache" / "awm"
    return Path(root) / f"verl-{_digest()}"


def python() -> Path:
    return env_dir() / "bin" / "python"


def installed() -> bool:
    return (env_dir() / _MARKER).is_file() and python().is_file()


def install() -> Path:
    """Create the environment if it is missing; returns its python (RuntimeError: the installer's output)."""
    target = env_dir()
    if installed():
        return python()
    if target.exists():  # an interrupted install
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        _run([base, "-m", "venv", str(target)], 120)
        _run([str(python()), "-m", "pip", "install", "--quiet", "-r", str(PINS), f"{ROOT}[trainer]"], 2400)
        _run([str(python()), "-c", "import verl.experimental.agent_loop.agent_loop"], 600)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / _MARKER).write_text(_digest() + "\n")
    return python()


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"verl_env: {exc}")
