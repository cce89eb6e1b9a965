"""`.ci/reclaim-homes`: homes of killed CI runs are removed, homes of living runs never.

A killed run (SIGKILL, a timeout) leaves its home behind: its EXIT trap never ran. Three such
homes (7-8 GB each: the embedded Postgres, the test session's files) filled this machine's disk
once, and the next run failed with "no space left on device" in the real-node tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "reclaim-homes"


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]  # field 22


def _home(tmp: Path, name: str, owner: str | None = None, age_min: float = 0) -> Path:
    home = tmp / f"awm-ci-home.{name}"
    (home / "postgres" / "data").mkdir(parents=True)
    (home / "postgres" / "data" / "base.bin").write_bytes(b"x" * 4096)
    if owner is not None:
        (home / ".ci-owner").write_text(owner + "\n")
    if age_min:
        t = time.time() - age_min * 60
        os.utime(home, (t, t))
    return home


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_abandoned_homes_go_and_living_ones_stay(tmp_path: Path) -> None:
    me = os.getpid()
    living = _home(tmp_path, "living", f"{me} {_start_time(me)}")
    dead = _home(tmp_path, "dead", f"{_dead_pid()} 12345")
    reused = _home(tmp_path, "reused", f"{me} 1")  # a pid that runs again, with another start time
    garbled = _home(tmp_path, "garbled", "not a pid", age_min=180)  # unreadable: judged by age
    half_written = _home(tmp_path, "half", "")                        # ... a run writing it now
    old_unowned = _home(tmp_path, "old", None, age_min=180)  # a home of a run before owner files
    new_unowned = _home(tmp_path, "new", None, age_min=5)    # ... that may still be running
    other = tmp_path / "something-else"
    other.mkdir()
    r = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert living.is_dir() and new_unowned.is_dir() and other.is_dir() and half_written.is_dir()
    assert not dead.exists() and not reused.exists() and not garbled.exists() and not old_unowned.exists()
    assert r.stderr.count("reclaimed an abandoned CI home") == 4, r.stderr


def test_a_postgres_left_running_by_a_killed_run_is_stopped_first(tmp_path: Path) -> None:
    """The server's postmaster.pid names a process whose working directory is its data directory
    (a stand-in process here, which the script must stop before it removes the files); a pid file
    naming an unrelated process (a reused pid) leaves that process alone."""
    home = _home(tmp_path, "killed", f"{_dead_pid()} 1")
    data = home / "postgres" / "data"
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], cwd=data)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], cwd=tmp_path)
    other_data = home / "pytest" / "postgres" / "data"
    other_data.mkdir(parents=True)
    try:
        (data / "postmaster.pid").write_text(f"{server.pid}\n{data}\n")
        (other_data / "postmaster.pid").write_text(f"{stranger.pid}\n{other_data}\n")
        r = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert server.wait(timeout=15) == -signal.SIGQUIT
        assert stranger.poll() is None, "a process outside the home's data directories was signalled"
        assert not home.exists()
    finally:
        for p in (server, stranger):
            p.kill()
            p.wait()
