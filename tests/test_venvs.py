"""trainer/venvs.py: environments of older pins are removed, the most recently used stay.

A pin change leaves the old environment behind (the stale verl one held ~6 GB on this machine's
disk, which CI runs share). Installing for real is what tests/test_vllm.py and the suites' tests
do through .ci/run; here the cache is laid out by hand and only the bookkeeping runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from awm.trainer import venvs
from awm.trainer.venvs import CachedVenv


def _made(root: Path, name: str, last_use: float, marker: bool = True) -> Path:
    env = root / name
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    if marker:
        (env / venvs._MARKER).write_text("x\n")
        os.utime(env / venvs._MARKER, (last_use, last_use))
    os.utime(env, (last_use, last_use))
    return env


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CachedVenv:
    monkeypatch.setenv("AWM_VENV_CACHE", str(tmp_path))
    pins = tmp_path / "pins.txt"
    pins.write_text("example==1.0\n")
    return CachedVenv("tool", pins)


def test_a_cache_hit_keeps_the_most_recently_used_other_pins_and_removes_the_rest(venv: CachedVenv) -> None:
    root, now = venv.env_dir().parent, time.time()
    current = _made(root, venv.env_dir().name, now - 7200)
    recent = _made(root, "tool-aaaaaaaaaaaa", now - 60)
    old = _made(root, "tool-bbbbbbbbbbbb", now - 4 * 3600)
    older = _made(root, "tool-cccccccccccc", now - 86400 * 3)
    making = _made(root, "tool-dddddddddddd", now - 600, marker=False)      # another checkout's install
    abandoned = _made(root, "tool-eeeeeeeeeeee", now - 86400 * 2, marker=False)
    others = [_made(root, n, now - 86400 * 9) for n in ("toolbox-ffffffffffff", "tool-gggg", "vllm-aaaaaaaaaaaa")]
    assert venv.install() == venv.python()   # a hit: nothing installed, its last use recorded
    assert (current / venvs._MARKER).stat().st_mtime > now - 60
    assert current.is_dir() and recent.is_dir() and making.is_dir()
    assert not old.exists() and not older.exists() and not abandoned.exists()
    assert all(p.is_dir() for p in others), "another name's environment, or not an environment, was removed"


def test_keep_counts_the_current_environment(venv: CachedVenv) -> None:
    root, now = venv.env_dir().parent, time.time()
    _made(root, venv.env_dir().name, now)
    a, b = _made(root, "tool-aaaaaaaaaaaa", now - 5 * 3600), _made(root, "tool-bbbbbbbbbbbb", now - 6 * 3600)
    in_use = _made(root, "tool-cccccccccccc", now - 600)  # another checkout's run may be using it
    assert venv.prune(keep=4) == []
    assert venv.prune(keep=1) == [a, b] and not a.exists() and not b.exists() and in_use.is_dir()
