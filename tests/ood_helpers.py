"""Shared by the OOD suite tests: the suite's interpreter (installed under CI=true, where a
missing harness must fail, not skip) and OpenAI tool calls for the scripted endpoint."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import require


def suite_python(suite: str) -> Path:
    from awm.trainer.suites.envs import VENVS

    venv, error = VENVS[suite], ""
    if not venv.installed() and os.environ.get("CI") == "true":
        try:
            venv.install()
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            error = str(exc)[-2000:]
    require(venv.installed(), f"the {suite} harness is not installed in {venv.env_dir()} "
                              f"(python3 -m awm.trainer.suites.envs {suite}) {error}")
    return venv.python()


def package_dir(python: Path, package: str) -> Path:
    """Where the harness's interpreter has ``package`` (its data files live there)."""
    out = subprocess.run([str(python), "-c", f"import {package}, os; print(os.path.dirname({package}.__file__))"],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    return Path(out.stdout.strip().splitlines()[-1])


def tool_call(i: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{i}_{name}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}
