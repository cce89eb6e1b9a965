"""Unit tests of the UI's browser modules that need no browser (tests/js/*.test.mjs), run by
Node's own test runner: the chart axes' ticks and labels. Node is the machine's (Debian's nodejs,
which .ci/run's npm brings), else the one tests/mcp_conformance.py installed; under CI=true a
missing Node fails instead of skipping."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import require

JS_TESTS = sorted(Path(__file__).with_name("js").glob("*.test.mjs"))


def node() -> str | None:
    found = shutil.which("node")
    if found:
        return found
    from tests import mcp_conformance

    cached = mcp_conformance.node()
    return str(cached) if cached.is_file() else None


@pytest.mark.parametrize("path", JS_TESTS, ids=[p.name for p in JS_TESTS])
def test_js_unit_tests(path: Path) -> None:
    binary = node()
    require(binary, "node is not installed (.ci/run installs npm, which brings Debian's nodejs)")
    done = subprocess.run([binary, "--test", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
