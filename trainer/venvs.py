"""Cached virtualenvs for programs whose pins cannot live in the project's environment.

vLLM brings its own torch; the out-of-distribution benchmarks (``trainer/suites``) pin openai,
mcp, numpy and pydantic versions that contradict the project's (docs/integrations.md says which).
Each gets a virtualenv of its own, cached by the content of its pins, so a changed pin means a
new environment and an unchanged one is reused across runs and checkouts:

    ${<cache_var> or AWM_VENV_CACHE or ~/.cache/awm}/<name>-<sha256 of uv version + pins, 12 hex>/

uv (pinned, installed into the new environment first) does the install; its wheel cache is
shared, so two environments pinning the same torch download it once. A finished install writes
a marker file; a half-finished one is never taken for a cache hit (it is removed and redone).
Environments of older pins are removed once a new one is made: the ``KEEP`` most recently used
of a name stay (two checkouts with different pins on one machine do not rebuild in turn); a
stale verl environment alone holds ~6 GB.
Standard library only (and :mod:`awm.settings`, which is too): ``.ci/run`` builds these before the
project's own environment exists.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from awm import settings

UV_VERSION = "0.13.8"
ROOT = Path(__file__).resolve().parent.parent
_MARKER = ".awm-installed"  # written last by an install; its mtime is the environment's last use
KEEP = 2  # environments kept per name: the current pins' and the most recently used other one
IN_USE_S = 3 * 3600  # an environment used this recently is never pruned (longer than a CI run)


def _run(cmd: list[str], timeout: float) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")


@dataclass(frozen=True)
class CachedVenv:
    """One pinned environment. ``check`` is Python run by the new interpreter after the install
    (an import of the entry point), so a broken install is caught when it is made, not when used."""

    name: str
    requirements: Path
    overrides: Path | None = None
    check: str = ""
    cache_var: str = settings.names.AWM_VENV_CACHE  # the variable naming this one's cache directory
    # Also install this checkout with these extras (their dependencies resolved with the pins);
    # pyproject.toml then counts in the cache key.
    project_extras: str | None = None

    def digest(self) -> str:
        h = hashlib.sha256(UV_VERSION.encode())
        for pins in (self.requirements, self.overrides):
            if pins is not None:
                h.update(pins.read_bytes())
        if self.project_extras is not None:
            h.update(self.project_extras.encode())
            h.update((ROOT / "pyproject.toml").read_bytes())
        return h.hexdigest()[:12]

    def env_dir(self) -> Path:
        root = os.environ.get(self.cache_var) or settings.AWM_VENV_CACHE
        return Path(root) / f"{self.name}-{self.digest()}"

    def python(self) -> Path:
        return self.env_dir() / "bin" / "python"

    def installed(self) -> bool:
        return (self.env_dir() / _MARKER).is_file() and self.python().is_file()

    def install(self, timeout: float = 1800) -> Path:
        """Create the environment if it is missing; returns its python. Raises RuntimeError with
        the installer's output. The base interpreter is this one (``sys.executable``'s base)."""
        target = self.env_dir()
        if self.installed():
            (target / _MARKER).touch()
            self.prune()
            return self.python()
        if target.exists():  # an interrupted install
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        base = getattr(sys, "_base_executable", sys.executable)
        python = str(self.python())
        overrides = ["--override", str(self.overrides)] if self.overrides is not None else []
        project = [f"{ROOT}[{self.project_extras}]"] if self.project_extras is not None else []
        try:
            _run([base, "-m", "venv", str(target)], 120)
            _run([python, "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"], 300)
            _run([str(target / "bin" / "uv"), "pip", "install", "--python", python, "--compile-bytecode",
                  *overrides, "-r", str(self.requirements), *project], timeout)
            if self.check:
                _run([python, "-c", self.check], 600)
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / _MARKER).write_text(self.digest() + "\n")
        self.prune()
        return self.python()

    def prune(self, keep: int = KEEP) -> list[Path]:
        """Remove this name's environments of other pins but the ``keep`` most recently used
        (this one counts). One without a marker is left alone while it may still be being made
        (another checkout's install: under a day old), and removed after. -> what was removed."""
        here, now = self.env_dir(), time.time()
        pattern = re.compile(re.escape(self.name) + r"-[0-9a-f]{12}")
        made: list[tuple[float, Path]] = []
        stale: list[Path] = []
        for p in here.parent.iterdir():
            if p == here or not pattern.fullmatch(p.name):
                continue
            try:  # another prune may remove it meanwhile: never fail the caller's cache hit
                if (p / _MARKER).is_file():
                    made.append(((p / _MARKER).stat().st_mtime, p))
                elif p.is_dir() and now - p.stat().st_mtime > 86400:
                    stale.append(p)
            except OSError:
                continue
        made.sort(reverse=True)
        # used within the last hours (a run of another checkout may be using it): kept whatever keep says
        stale += [p for used, p in made[max(keep - 1, 0):] if now - used > IN_USE_S]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return stale
