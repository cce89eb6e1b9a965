"""The console script end to end, as a user runs it (a subprocess, the embedded default)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).with_name("fixtures")


def awm(*args: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, AWM_HOME=str(home))
    env.pop("AWM_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-m", "awm.cli", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.fixture(scope="module")
def home(pg) -> Path:
    return pg.root.parent  # the session's embedded cluster: already initialised and running


def test_catalog_list_and_show(home):
    listing = awm("catalog", "list", home=home)
    assert listing.returncode == 0, listing.stderr
    for name in ("bike_shop", "crm", "project_tracker"):
        assert name in listing.stdout
    show = awm("catalog", "show", "bike_shop", "--json", home=home)
    assert json.loads(show.stdout)["scenario"]["name"] == "bike_shop"
    missing = awm("catalog", "show", "no_such_env", home=home)
    assert missing.returncode == 2 and "not in the catalog" in missing.stderr


@pytest.mark.slow
def test_demo_json_on_a_fixture_catalog(home, tmp_path):
    result = awm("demo", "--json", "--catalog", str(FIXTURES / "notes"), home=home)
    data = json.loads(result.stdout)
    env = data["environments"][0]
    assert set(env) >= {"name", "tools", "tasks", "passed", "reset_p50_ms", "tool_call_p50_ms"}
    assert env["name"] == "notes" and env["tasks"] == 9 and env["passed"] == 3
    assert result.returncode == 1  # the fixture's deliberately broken verifiers fail


def test_env_check_against_a_dead_url_is_a_clear_error(home):
    result = awm("env", "check", "http://127.0.0.1:9/mcp", "--timeout", "2", home=home)
    assert result.returncode == 1 and "error" in result.stderr.lower()
