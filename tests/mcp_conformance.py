"""The official MCP conformance suite (``@modelcontextprotocol/conformance`` on npm), pinned, with
the Node it needs (>= 22, from the npm package ``node-linux-<arch>``: the machine's own node may be
older), installed into a cache outside the repository keyed by both versions:

    ${AWM_NODE_CACHE:-~/.cache/awm/node}/node-<NODE>_conformance-<CONFORMANCE>/

Only the system's ``npm`` (any version) is needed to install. Standard library only, so ``.ci/run``
can install before the project's virtualenv exists:

    python3 tests/mcp_conformance.py     # install if missing, print the directory
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NODE_VERSION = "22.23.3"
CONFORMANCE_VERSION = "0.1.16"
_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}


def cache_dir() -> Path:
    root = os.environ.get("AWM_NODE_CACHE") or Path.home() / ".cache" / "awm" / "node"
    return Path(root) / f"node-{NODE_VERSION}_conformance-{CONFORMANCE_VERSION}"


def _node_package() -> str:
    arch = _ARCH.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or arch is None:
        raise RuntimeError(f"no node-linux-* npm package for {sys.platform}/{platform.machine()}")
    return f"node-linux-{arch}"


def node() -> Path:
    return cache_dir() / "node_modules" / _node_package() / "bin" / "node"


def cli() -> Path:
    """The suite's entry script, as its package.json names it."""
    package = cache_dir() / "node_modules" / "@modelcontextprotocol" / "conformance"
    bin_field = json.loads((package / "package.json").read_text())["bin"]
    script = bin_field if isinstance(bin_field, str) else next(iter(bin_field.values()))
    return package / script


def installed() -> bool:
    try:
        return node().is_file() and cli().is_file()
    except (OSError, ValueError, KeyError, RuntimeError):
        return False


def install() -> Path:
    """Install both packages with npm into a temporary directory, then rename it into place (a
    half-finished install is never taken for a cache hit). Raises RuntimeError with npm's output."""
    target = cache_dir()
    if installed():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (needed once, to fetch Node 22 and the MCP conformance suite)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        r = subprocess.run([npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--loglevel=error",
                            f"{_node_package()}@{NODE_VERSION}",
                            f"@modelcontextprotocol/conformance@{CONFORMANCE_VERSION}"],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"npm install failed ({r.returncode}):\n{r.stderr[-3000:]}")
        if target.exists():  # another process finished first
            shutil.rmtree(staging)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not installed():
        raise RuntimeError(f"npm install finished but {node()} or the suite's CLI is missing")
    return target


def run_scenario(url: str, scenario: str, output_dir: Path, timeout_s: float = 120) -> tuple[int, list[dict], str]:
    """Run one server scenario against ``url``: (exit code, the checks it recorded, its output)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    before = set(output_dir.iterdir())
    r = subprocess.run([str(node()), str(cli()), "server", "--url", url, "--scenario", scenario,
                        "--output-dir", str(output_dir)],
                       capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "NO_COLOR": "1"})
    checks: list[dict] = []
    for result in sorted(set(output_dir.iterdir()) - before):
        path = result / "checks.json"
        if path.is_file():
            checks += json.loads(path.read_text())
    return r.returncode, checks, r.stdout + r.stderr


if __name__ == "__main__":
    try:
        print(install())
    except RuntimeError as exc:
        sys.exit(f"mcp_conformance: {exc}")
