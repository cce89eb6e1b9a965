"""Under CI=true (.ci/run exports it) a missing prerequisite fails the test that needs it; on a
developer's machine it skips, with the reason."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import require

ROOT = Path(__file__).resolve().parent.parent


def test_require_fails_under_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    require(True, "present")  # nothing happens
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no frobnicator.*CI=true"):
        require(None, "no frobnicator")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no frobnicator"):
        require("", "no frobnicator")


def test_no_test_skips_behind_the_helpers_back() -> None:
    """Every skip goes through require(), so CI=true cannot be bypassed by a new pytest.skip."""
    r = subprocess.run(["grep", "-rnE", r"pytest\.skip\(|importorskip|mark\.skip", "--include=*.py", "tests"],
                       cwd=ROOT, capture_output=True, text=True)
    offenders = [line for line in r.stdout.splitlines()
                 if not line.startswith(("tests/conftest.py:", "tests/test_ci.py:"))]
    assert not offenders, offenders


def test_ci_run_sets_ci_true() -> None:
    assert "\nexport CI=true\n" in (ROOT / ".ci" / "run").read_text()
