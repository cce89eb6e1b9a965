"""Running a harness in its own interpreter: output to a log file (the harnesses print progress
bars and per-case lines by the thousand), a clear error with the log's tail when it fails."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class HarnessError(RuntimeError):
    """The benchmark's harness exited non-zero or wrote no results."""


def run(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float | None = None,
        cwd: Path | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {})}
    # litellm (tau2's client) fetches a price table from the internet at import unless told not to.
    full_env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    full_env.pop("PYTHONPATH", None)  # the harness's interpreter has its own packages, never awm's
    # Harnesses start helpers as "python3 -m ..." (MCP-Universe's stdio MCP servers): their venv's.
    full_env["PATH"] = f"{Path(cmd[0]).parent}{os.pathsep}{full_env.get('PATH', '')}"
    with log.open("a") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env, timeout=timeout,
                              cwd=cwd).returncode
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise HarnessError(f"{Path(cmd[1]).name if len(cmd) > 1 else cmd[0]} exited {code}; log {log}:\n{tail}")
