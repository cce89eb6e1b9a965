"""OpenEnv's AWM server and awm's (``awm openenv serve --awm-data``): same data, same workload, same run.

    .venv/bin/python -m bench.openenv_awm --json                     # both servers, workload A
    .venv/bin/python -m bench.openenv_awm --workload A B --scale 1024 --concurrency 64 --json
    .venv/bin/python -m bench.openenv_awm --data fixture --json      # tests/fixtures/awm1k (tiny)
    .venv/bin/python -m bench.openenv_awm --data DIR --json          # any AgentWorldModel-1K-layout dir

A by-hand tool, not part of CI: OpenEnv's AWM environment is not on a package index (the
``openenv-core`` wheels do not contain it), and CI reaches package indexes only.

**How OpenEnv's server is got and run.** Nothing of it enters this repository; it is installed and
started at run time, under ``~/.cache/awm/openenv-awm/`` (``$AWM_OPENENV_CACHE`` overrides):

1. The repository: ``--openenv PATH``, a git directory of github.com/meta-pytorch/OpenEnv (bare,
   as the ``fetch`` tool of this project's sessions leaves it; also ``$AWM_OPENENV_GIT``; no default) or a
   checkout (``git clone
   https://github.com/meta-pytorch/OpenEnv``). From a git directory ``git archive HEAD src
   envs/agent_world_model_env examples/agent_world_model`` is extracted to ``src-<commit, 12
   hex>/`` (a snapshot's largest files are absent, so the whole tree does not archive); a checkout
   is used in place. Missing: the run stops at once and says how to get it.
2. Its virtualenv, ``venv-<sha256 of envs/agent_world_model_env/uv.lock, 12 hex>/``: ``python -m
   venv`` (this interpreter's base), ``pip install uv==<awm.trainer.venvs.UV_VERSION>``, then in
   ``envs/agent_world_model_env``: ``uv export --frozen --no-dev --no-emit-project --no-hashes >
   reqs.txt`` and ``uv pip install --python VENV/bin/python -r reqs.txt psutil`` (its locked
   dependencies, from PyPI). A marker file is written last; an install without it is redone.
3. Started from the repository root: ``PYTHONPATH=src:envs AWM_DATA_DIR=<data> HF_HUB_OFFLINE=1
   GRADIO_ANALYTICS_ENABLED=False VENV/bin/python -m uvicorn
   envs.agent_world_model_env.server.app:app --host 127.0.0.1 --port P``; ready when ``GET /stats``
   answers 200. Stopped with SIGTERM (SIGKILL after 30 s), then any process of its tree still
   alive (its per-session sub-environments run in sessions of their own) by pid.

**awm's side**: ``.venv/bin/awm openenv serve --awm-data <data> --instances N --port P`` (OpenEnv's
AWM protocol at ``ws://127.0.0.1:P/ws``, ``GET /stats``), with ``AWM_HOME`` a temporary directory of
its own, so its embedded PostgreSQL cluster (started by the server, stopped when it exits) and
every backend of it belong to this run; stopped with SIGINT, then ``awm postgres stop``.

**Data** (``--data``): ``lisalims`` (default): ``outputs/`` of github.com/lisalims/agent-world-model
(8 environments, 10 tasks each; ``--lisalims PATH`` or ``$AWM_LISALIMS_GIT``, a git directory or a
checkout; no default), copied to
``data-lisalims-<commit>/`` with its ``gen_verifier.jsonl`` (code-mode verifiers) renamed
``gen_verifier.pure_code.jsonl`` and an empty ``gen_verifier.jsonl`` (OpenEnv's loader wants both
files and would otherwise try Hugging Face); ``fixture``: ``tests/fixtures/awm1k`` (2 small
environments); or a directory in the AgentWorldModel-1K layout (``gen_scenario gen_tasks gen_db
gen_sample gen_envs gen_verifier gen_verifier.pure_code``, ``.jsonl``), used as it is
(``--max-scenarios`` takes the first ones). Episodes run only tasks with a code-mode verifier.

**The driver** is this module's own asyncio WebSocket client of OpenEnv's protocol (openenv-core
0.3.0's ``{"type": "reset"|"step"|"close", "data": {...}}`` messages, replies ``{"type":
"observation"|"error", "data": {"observation", "reward", "done"}}``; the step payloads of its MCP
client: ``{"type": "list_tools"}``, ``{"type": "call_tool", "tool_name", "arguments"}``; the AWM
environment's ``reset(scenario=, task_idx=)`` and special tools ``verify`` and ``done``). Both
servers get exactly the same messages, in the same order per session, one server after the other
in one invocation (per workload, in ``--servers`` order). Per server and workload a fresh server
is started, after up to ``--cooldown`` s for the load the previous one left to fall:

* **workload A** (``--episodes 64 --sessions 8``): on one session, an untimed warm-up episode on
  each of the first ``--warmup-scenarios`` scenarios (their resets, the first of each scenario in
  the server's life, are ``first_reset_of_each_scenario_ms``: awm imports a scenario at its first
  reset), then ``--solo-episodes`` on them (reset -> ready and tool call latency of one session
  alone), then the memory phase (``--sessions`` sessions each reset, tools listed,
  one tool called, held open: PSS), then 64 episodes over 8 concurrent WebSocket sessions, each
  episode ``reset(scenario, task_idx)`` -> ``list_tools`` -> 3-10 tool calls -> ``verify``
  (``verifier_mode: code``) -> ``done``. The calls (same seed per episode on both servers): tools
  that look read-only (name ``get_``/``list_``/``search_``/...) and have no required argument,
  called with ``{}``; a scenario without one gets OpenEnv's stress test's choice, a random tool
  with ``{}`` (its error answer is timed the same). Scenario and task: episode i runs scenario
  ``i mod S``, its ``(i div S)``-th task with a code verifier.
* **workload B** (``--scale S --concurrency C``): the shape of OpenEnv's
  ``examples/agent_world_model/example_stress_test.py``: S episodes launched at once, each its own
  WebSocket; connect + reset under a semaphore of C, then unbounded: ``list_tools``,
  ``--min-turns``..``--max-turns`` calls of a random tool with ``{}`` after a think time uniform in
  ``--think-min``..``--think-max`` s, ``done``, close. ``--deadline`` bounds its wall time (what
  is still running then is cancelled and counted failed, reason ``deadline``).

Measured per server: episodes/s; reset -> ready (the ``reset`` message until its observation, the
episode's tools listed by then on both servers); tool call round trip; failed episodes with their
reasons; PSS (``/proc/<pid>/smaps_rollup``) summed over the server's process tree, and for awm also
its PostgreSQL cluster (the postmaster and all its children: backends and background processes),
idle before any session and with N sessions open: ``(peak - idle) / N`` and ``peak / N``.
Ratios are awm / OpenEnv.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

from bench.runtime import children, machine, pss_mb

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "awm1k"
# No default location: where a snapshot lives is the user's (--openenv / $AWM_OPENENV_GIT, --lisalims /
# $AWM_LISALIMS_GIT); a run without one stops at once and says how to get it.
DEFAULT_OPENENV_GIT = "OPENENV-REPOSITORY-NOT-GIVEN"
DEFAULT_LISALIMS_GIT = "LISALIMS-REPOSITORY-NOT-GIVEN"
AWM_ENV_DIR = "envs/agent_world_model_env"
DATA_FILES = ("gen_scenario.jsonl", "gen_tasks.jsonl", "gen_db.jsonl", "gen_sample.jsonl", "gen_envs.jsonl",
              "gen_verifier.jsonl", "gen_verifier.pure_code.jsonl")
READ_ONLY = re.compile(r"^(get|list|search|find|view|show|fetch|read|count|lookup|browse|query|retrieve|check)_")
CALL_OK = "tool_call_ok"
VERIFIED = {"complete", "incomplete", "others"}
MARKER = ".awm-installed"


class BenchError(RuntimeError):
    """A precondition of the run is missing; the message says how to get it."""


def cache_root() -> Path:
    return Path(os.environ.get("AWM_OPENENV_CACHE") or Path.home() / ".cache" / "awm" / "openenv-awm")


def run(cmd: list[str], cwd: Path | None = None, timeout: float = 1800, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:5])} ... failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return r.stdout


def is_git_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def git_commit(git_dir: Path) -> str:
    return run(["git", "--git-dir", str(git_dir), "rev-parse", "HEAD"]).strip()


def extract(git_dir: Path, paths: list[str], target: Path) -> None:
    """``git archive HEAD <paths>`` into ``target`` (made whole in a temporary directory, then moved)."""
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".part-"))
    try:
        archive = tmp / "archive.tar"
        with archive.open("wb") as out:
            r = subprocess.run(["git", "--git-dir", str(git_dir), "archive", "HEAD", "--", *paths],
                               stdout=out, stderr=subprocess.PIPE, text=False, timeout=600)
        if r.returncode != 0:
            raise BenchError(f"git archive of {git_dir} failed: {r.stderr.decode(errors='replace')[-2000:]}")
        tree = tmp / "tree"
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        tree.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- OpenEnv: the snapshot, its virtualenv, its server ------------------------------------------


@dataclass
class OpenEnvInstall:
    root: Path  # repository root (src/, envs/)
    commit: str
    python: Path
    venv: Path


def openenv_source(path: Path) -> tuple[Path, str]:
    how = ("get it with the `fetch` tool (github:meta-pytorch/OpenEnv) or `git clone "
           "https://github.com/meta-pytorch/OpenEnv`, then pass --openenv PATH (a git directory or a checkout)")
    if (path / AWM_ENV_DIR / "uv.lock").is_file():
        commit = "checkout"
        if (path / ".git").exists():
            commit = run(["git", "-C", str(path), "rev-parse", "HEAD"]).strip()
        return path, commit
    if not is_git_dir(path):
        raise BenchError(f"OpenEnv's repository is not at {path}: {how}")
    commit = git_commit(path)
    target = cache_root() / f"src-{commit[:12]}"
    extract(path, ["src", AWM_ENV_DIR, "examples/agent_world_model"], target)
    if not (target / AWM_ENV_DIR / "uv.lock").is_file():
        raise BenchError(f"{path} at {commit} has no {AWM_ENV_DIR}/uv.lock: not OpenEnv's repository? {how}")
    return target, commit


def install_openenv(path: Path) -> OpenEnvInstall:
    from awm.trainer.venvs import UV_VERSION

    root, commit = openenv_source(path)
    lock = root / AWM_ENV_DIR / "uv.lock"
    venv = cache_root() / f"venv-{hashlib.sha256(lock.read_bytes()).hexdigest()[:12]}"
    python = venv / "bin" / "python"
    if not (venv / MARKER).is_file():
        shutil.rmtree(venv, ignore_errors=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        base = getattr(sys, "_base_executable", sys.executable)
        print(f"installing OpenEnv's AWM environment into {venv} ...", file=sys.stderr)
        try:
            run([base, "-m", "venv", str(venv)], timeout=300)
            run([str(python), "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"], timeout=600)
            reqs = run([str(venv / "bin" / "uv"), "export", "--frozen", "--no-dev", "--no-emit-project",
                        "--no-hashes"], cwd=root / AWM_ENV_DIR, timeout=300)
            (venv / "reqs.txt").write_text(reqs)
            run([str(venv / "bin" / "uv"), "pip", "install", "--python", str(python), "-r",
                 str(venv / "reqs.txt"), "psutil"], timeout=3600)
        except BaseException:
            shutil.rmtree(venv, ignore_errors=True)
            raise
        (venv / MARKER).write_text(commit + "\n")
    return OpenEnvInstall(root, commit, python, venv)


# -- data -----------------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """OpenEnv's scenario key: lower case, runs of anything but [a-z0-9_] one underscore, trimmed."""
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9_]", "_", name.lower())).strip("_")


def prepare_data(which: str, lisalims: Path) -> tuple[Path, dict[str, Any]]:
    if which == "fixture":
        return FIXTURE, {"source": "tests/fixtures/awm1k"}
    if which != "lisalims":
        d = Path(which).expanduser().resolve()
        missing = [f for f in DATA_FILES if not (d / f).is_file()]
        if missing:
            raise BenchError(f"{d} is not in the AgentWorldModel-1K layout: missing {', '.join(missing)} "
                             "(gen_verifier.jsonl: sql mode, may be empty; gen_verifier.pure_code.jsonl: code mode)")
        return d, {"source": str(d)}
    how = ("get it with the `fetch` tool (github:lisalims/agent-world-model) or `git clone "
           "https://github.com/lisalims/agent-world-model`, then pass --lisalims PATH; or use --data fixture")
    if (lisalims / "outputs" / "gen_envs.jsonl").is_file():
        src, commit = lisalims / "outputs", "checkout"
        target = cache_root() / "data-lisalims-checkout"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(src, target)
    elif is_git_dir(lisalims):
        commit = git_commit(lisalims)
        target = cache_root() / f"data-lisalims-{commit[:12]}"
        if not target.is_dir():
            files = [f"outputs/{f}" for f in ("gen_scenario.jsonl", "gen_tasks.jsonl", "gen_db.jsonl",
                                               "gen_sample.jsonl", "gen_spec.jsonl", "gen_envs.jsonl",
                                               "gen_verifier.jsonl")]
            extract(lisalims, files, target.with_name(target.name + ".tree"))
            shutil.move(str(target.with_name(target.name + ".tree") / "outputs"), target)
            shutil.rmtree(target.with_name(target.name + ".tree"), ignore_errors=True)
    else:
        raise BenchError(f"lisalims/agent-world-model is not at {lisalims}: {how}")
    if not (target / "gen_verifier.pure_code.jsonl").is_file():
        # its verifiers are code mode: OpenEnv reads those from the .pure_code file
        (target / "gen_verifier.jsonl").rename(target / "gen_verifier.pure_code.jsonl")
        (target / "gen_verifier.jsonl").write_text("")
    return target, {"source": f"github.com/lisalims/agent-world-model outputs/ ({commit})"}


def replicate(data: Path, n: int) -> Path:
    """A copy of ``data`` with ``n`` scenarios: each one cloned under new names (``"<name> v<k>"``,
    its key normalised from that) in turn, every file's records renamed alike, so that each clone
    is a scenario of its own with its own content digest (awm imports it at its first reset). Made
    once, in the cache (``<dir>-x<n>``; a directory named by its content's digest for other data)."""
    tag = data.name if data.parent == cache_root() else hashlib.sha256(str(data).encode()).hexdigest()[:12]
    target = cache_root() / f"{tag}-x{n}"
    if (target / ".complete").is_file():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    names = [r["name"] for r in load_jsonl(data / "gen_scenario.jsonl")]
    if not names:
        raise BenchError(f"{data}: no scenario to replicate")
    clones: list[tuple[str, str]] = []  # (original name, new name)
    for i in range(n):
        name = names[i % len(names)]
        k = i // len(names)
        clones.append((name, name if k == 0 else f"{name} v{k}"))
    for f in DATA_FILES:
        rows = load_jsonl(data / f) if (data / f).is_file() else []
        out = []
        for original, new in clones:
            for row in rows:
                key = "name" if f == "gen_scenario.jsonl" else "scenario"
                value = row.get(key)
                if value == original:
                    out.append({**row, key: new})
                elif isinstance(value, str) and value == normalize(original):
                    out.append({**row, key: normalize(new)})
        (target / f).write_text("".join(json.dumps(r) + "\n" for r in out))
    (target / ".complete").write_text(str(n))
    return target


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plan_scenarios(data: Path, max_scenarios: int | None) -> list[tuple[str, list[int]]]:
    """(scenario key, task indices with a code verifier) in gen_scenario.jsonl's order."""
    with_code: dict[str, set[int]] = {}
    for row in load_jsonl(data / "gen_verifier.pure_code.jsonl"):
        if str(row.get("verification", {}).get("code") or "").strip():
            with_code.setdefault(normalize(row["scenario"]), set()).add(int(row["task_idx"]))
    tasks = {normalize(r["scenario"]): len(r.get("tasks", [])) for r in load_jsonl(data / "gen_tasks.jsonl")}
    envs = {normalize(r["scenario"]) for r in load_jsonl(data / "gen_envs.jsonl")}
    out = []
    for row in load_jsonl(data / "gen_scenario.jsonl"):
        key = normalize(row["name"])
        idx = sorted(i for i in with_code.get(key, ()) if i < tasks.get(key, 0))
        if key in envs and idx:
            out.append((key, idx))
    if max_scenarios:
        out = out[:max_scenarios]
    if not out:
        raise BenchError(f"{data}: no scenario has a task with a code-mode verifier")
    return out


# -- servers ----------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def postmaster_pid(home: Path) -> int | None:
    try:
        return int((home / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Server:
    name: str
    cmd: list[str]
    cwd: Path
    env: dict[str, str]
    port: int
    log: Path
    awm_home: Path | None = None  # awm: its private AWM_HOME (embedded Postgres)
    proc: subprocess.Popen | None = None
    start_s: float = 0.0
    seen: set[int] = field(default_factory=set)  # every pid of its tree seen (killed at the end if alive)

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self, timeout: float = 600) -> None:
        t0 = time.perf_counter()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode} before it answered /stats; "
                                 f"its log ({self.log}):\n{self.log.read_text(errors='replace')[-3000:]}")
            try:
                if http_get(f"http://127.0.0.1:{self.port}/stats", 2)[0] == 200:
                    self.start_s = time.perf_counter() - t0
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise BenchError(f"{self.name} did not answer /stats in {timeout} s; log: {self.log}")

    def stats(self) -> dict[str, Any] | None:
        try:
            code, body = http_get(f"http://127.0.0.1:{self.port}/stats", 5)
            return json.loads(body) if code == 200 else None
        except (OSError, ValueError):
            return None

    def pids(self) -> dict[str, list[int]]:
        """The server's process tree, and (awm) its Postgres cluster: postmaster and children."""
        assert self.proc is not None
        tree = [self.proc.pid, *children(self.proc.pid)]
        self.seen.update(tree)
        pg: list[int] = []
        if self.awm_home is not None and (pm := postmaster_pid(self.awm_home)) is not None:
            pg = [pm, *children(pm)]
        return {"server": tree, "postgres": [p for p in pg if p not in tree]}

    def pss(self) -> dict[str, Any]:
        pids = self.pids()
        out: dict[str, Any] = {"server_mb": round(sum(pss_mb(p) for p in pids["server"]), 1),
                               "server_processes": len(pids["server"])}
        if self.awm_home is not None:
            out["postgres_mb"] = round(sum(pss_mb(p) for p in pids["postgres"]), 1)
            out["postgres_processes"] = len(pids["postgres"])
            out["roles"] = awm_roles(pids["server"])
        out["total_mb"] = round(out["server_mb"] + out.get("postgres_mb", 0.0), 1)
        return out

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            self.pids()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT if self.awm_home is not None else signal.SIGTERM)
            try:
                self.proc.wait(60 if self.awm_home is not None else 30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        for pid in self.seen:  # sub-environments in sessions of their own, a worker left behind
            if pid != self.proc.pid and alive_child_of_run(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.awm_home is not None:
            awm = Path(sys.executable).parent / "awm"
            subprocess.run([str(awm), "postgres", "stop"], env=self.env, capture_output=True, timeout=120)
            shutil.rmtree(self.awm_home, ignore_errors=True)
        self.proc = None


def alive_child_of_run(pid: int) -> bool:
    """Still running (not a zombie) - a pid of this run's tree, not reused: checked by its start being
    after this process's."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        mine = Path(f"/proc/{os.getpid()}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] != "Z" and int(stat[19]) >= int(mine[19])


def openenv_server(inst: OpenEnvInstall, data: Path, logs: Path) -> Server:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH="src:envs", AWM_DATA_DIR=str(data), HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
               PATH=f"{inst.venv / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}")
    cmd = [str(inst.python), "-m", "uvicorn", "envs.agent_world_model_env.server.app:app", "--host", "127.0.0.1",
           "--port", str(port)]
    return Server("openenv", cmd, inst.root, env, port, logs / f"openenv-{port}.log")


def awm_command_ready() -> str | None:
    """None when `awm openenv serve` takes --awm-data, else why not."""
    awm = Path(sys.executable).parent / "awm"
    if not awm.exists():
        return f"no {awm}"
    r = subprocess.run([str(awm), "openenv", "serve", "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    if "--awm-data" not in r.stdout:
        return "`awm openenv serve` has no --awm-data option in this checkout"
    return None


def awm_server(data: Path, instances: int, logs: Path, extra: list[str]) -> Server:
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix="awm-bench-openenv-home-"))
    os.chmod(home, 0o755)  # the embedded cluster may run as another user (awm-postgres when root)
    env = {**os.environ, "AWM_HOME": str(home)}
    env.pop("AWM_DATABASE_URL", None)
    cmd = [str(Path(sys.executable).parent / "awm"), "openenv", "serve", "--awm-data", str(data), "--instances",
           str(instances), "--host", "127.0.0.1", "--port", str(port), *extra]
    return Server("awm", cmd, ROOT, env, port, logs / f"awm-{port}.log", awm_home=home)


# -- the client ------------------------------------------------------------------------------------


class ServerError(RuntimeError):
    pass


class Session:
    """One OpenEnv WebSocket session (openenv-core 0.3.0's message shapes)."""

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout, self.ws = url, timeout, None

    async def connect(self) -> None:
        self.ws = await websockets.connect(self.url, open_timeout=120, max_size=256 * 2**20, ping_interval=None,
                                          close_timeout=5)

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self.ws is not None
        await self.ws.send(json.dumps(message))
        reply = json.loads(await asyncio.wait_for(self.ws.recv(), self.timeout))
        if reply.get("type") == "error":
            data = reply.get("data", {})
            raise ServerError(f"{data.get('code', '?')}: {str(data.get('message', ''))[:300]}")
        return reply.get("data", {})

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        return await self._ask({"type": "reset", "data": kwargs})

    async def list_tools(self) -> dict[str, Any]:
        return await self._ask({"type": "step", "data": {"type": "list_tools"}})

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self._ask({"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments}})

    async def close(self) -> None:
        if self.ws is None:
            return
        try:
            await self.ws.send(json.dumps({"type": "close"}))
        except Exception:
            pass
        try:
            await self.ws.close()
        except Exception:
            pass
        self.ws = None


def tool_names(reply: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(every tool, the read-only-looking ones without required arguments), sorted."""
    tools = reply.get("observation", {}).get("tools") or []
    every, read_only = [], []
    for t in tools:
        name = t.get("name", "")
        schema = t.get("input_schema") or t.get("inputSchema") or {}
        every.append(name)
        if READ_ONLY.match(name) and not schema.get("required"):
            read_only.append(name)
    return sorted(every), sorted(read_only)


def ms_stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    s = sorted(values)
    return {"n": len(s), "p50": round(statistics.median(s), 1), "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 1),
            "max": round(s[-1], 1), "mean": round(statistics.fmean(s), 1)}


@dataclass
class Tally:
    reset_ms: list[float] = field(default_factory=list)
    list_ms: list[float] = field(default_factory=list)
    call_ms: list[float] = field(default_factory=list)
    verify_ms: list[float] = field(default_factory=list)
    done_ms: list[float] = field(default_factory=list)
    episode_ms: list[float] = field(default_factory=list)
    connect_ms: list[float] = field(default_factory=list)
    ok: int = 0
    failures: Counter = field(default_factory=Counter)
    failed_examples: list[str] = field(default_factory=list)
    call_types: Counter = field(default_factory=Counter)
    verify_types: Counter = field(default_factory=Counter)
    chosen: Counter = field(default_factory=Counter)  # read_only / empty_args_any_tool
    tools_per_scenario: dict[str, int] = field(default_factory=dict)
    tool_sets: dict[str, str] = field(default_factory=dict)  # scenario -> digest of its tool names

    def fail(self, reason: str, example: str) -> None:
        self.failures[reason] += 1
        if len(self.failed_examples) < 10:
            self.failed_examples.append(example)

    def report(self) -> dict[str, Any]:
        return {"ok": self.ok, "failed": sum(self.failures.values()), "failure_reasons": dict(self.failures),
                "failed_examples": self.failed_examples, "connect_ms": ms_stats(self.connect_ms),
                "reset_ms": ms_stats(self.reset_ms), "list_tools_ms": ms_stats(self.list_ms),
                "tool_call_ms": ms_stats(self.call_ms), "verify_ms": ms_stats(self.verify_ms),
                "done_ms": ms_stats(self.done_ms), "episode_ms": ms_stats(self.episode_ms),
                "tool_call_reward_types": dict(self.call_types), "verify_reward_types": dict(self.verify_types),
                "calls_chosen": dict(self.chosen)}


def brief(obs: dict[str, Any]) -> str:
    """An observation for a failure's example: every field but the long ones, shortened."""
    return json.dumps({k: v for k, v in obs.items() if k not in ("tools", "scenarios", "task")}, default=str)[:500]


def reason_of(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return re.sub(r"\d+", "N", f"{type(e).__name__}: {text}")[:160]


async def episode_a(s: Session, scenario: str, task_idx: int, seed: int, min_calls: int, max_calls: int,
                    t: Tally) -> None:
    """reset -> list_tools -> 3-10 calls -> verify(code) -> done, on an open session."""
    rng = random.Random(seed)
    phase, t_ep = "reset", time.perf_counter()
    try:
        t0 = time.perf_counter()
        reply = await s.reset(scenario=scenario, task_idx=task_idx)
        obs = reply.get("observation", {})
        if obs.get("reward_type") != "reset_ok":
            t.fail(f"reset: {obs.get('reward_type')}", f"{scenario}/{task_idx} [reset] {brief(obs)}")
            return
        t.reset_ms.append((time.perf_counter() - t0) * 1000)
        phase = "list_tools"
        t0 = time.perf_counter()
        reply = await s.list_tools()
        t.list_ms.append((time.perf_counter() - t0) * 1000)
        every, read_only = tool_names(reply)
        t.tools_per_scenario[scenario] = len(every)
        t.tool_sets[scenario] = hashlib.sha256("\n".join(every).encode()).hexdigest()[:12]
        if not every:
            t.fail("list_tools: no tools", f"{scenario}/{task_idx}: {reply.get('observation', {}).get('error')}")
            return
        pool, kind = (read_only, "read_only_no_required_args") if read_only else (every, "any_tool_empty_args")
        for _ in range(rng.randint(min_calls, max_calls)):
            phase = "call_tool"
            tool = rng.choice(pool)
            t0 = time.perf_counter()
            reply = await s.call(tool, {})
            t.call_ms.append((time.perf_counter() - t0) * 1000)
            t.call_types[reply.get("observation", {}).get("reward_type")] += 1
            t.chosen[kind] += 1
        phase = "verify"
        t0 = time.perf_counter()
        reply = await s.call("verify", {"verifier_mode": "code"})
        t.verify_ms.append((time.perf_counter() - t0) * 1000)
        rt = reply.get("observation", {}).get("reward_type")
        t.verify_types[rt] += 1
        if rt not in VERIFIED:
            why = dig(reply, "observation", "verify_result", "awm", "mask_reason") or ""
            t.fail(f"verify: {rt}" + (f" ({why.split(':')[0][:60]})" if why else ""), f"{scenario}/{task_idx} [verify] {brief(reply.get('observation', {}))}")
            return
        phase = "done"
        t0 = time.perf_counter()
        reply = await s.call("done", {"keep_session": False})
        t.done_ms.append((time.perf_counter() - t0) * 1000)
        if not reply.get("done") or reply.get("observation", {}).get("reward_type") != "episode_done":
            t.fail("done: not done", f"{scenario}/{task_idx}: {json.dumps(reply)[:300]}")
            return
        t.ok += 1
        t.episode_ms.append((time.perf_counter() - t_ep) * 1000)
    except Exception as e:  # a closed WebSocket, an error reply, a message timeout
        t.fail(f"{phase}: {reason_of(e)}", f"{scenario}/{task_idx} [{phase}] {type(e).__name__}: {str(e)[:300]}")
        raise


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def awm_roles(tree: list[int]) -> dict[str, dict[str, float]]:
    """awm's process tree by role, PSS summed and counted: the protocol server, env servers, the
    fork-server template, fork servers (zygotes), their environment zygotes, and workers (an
    environment zygote's children). A sandbox process (``python -I -S``) is a zygote when its
    parent is an env server or the template, an environment zygote when its parent is a zygote,
    a worker when its parent is an environment zygote."""
    kind: dict[int, str] = {}
    for pid in tree:
        cmd = _cmdline(pid)
        kind[pid] = ("env_server" if "-m awm.envserver" in cmd else "sandbox" if " -I -S " in cmd
                     else "protocol_server")
    for pid in tree:  # the sandbox processes by what they hang from
        if kind[pid] == "sandbox":
            parent = kind.get(_parent(pid), "protocol_server")
            kind[pid] = {"protocol_server": "template", "env_server": "zygote"}.get(parent, "sandbox")
    for pid in tree:
        if kind[pid] == "sandbox" and kind.get(_parent(pid)) == "template":
            kind[pid] = "zygote"
    for pid in tree:
        if kind[pid] == "sandbox" and kind.get(_parent(pid)) == "zygote":
            kind[pid] = "env_zygote"
    for pid in tree:
        if kind[pid] == "sandbox":
            kind[pid] = "worker"
    roles: dict[str, dict[str, float]] = {}
    for pid, role in kind.items():
        entry = roles.setdefault(role, {"processes": 0, "pss_mb": 0.0})
        entry["processes"] += 1
        entry["pss_mb"] = round(entry["pss_mb"] + pss_mb(pid), 1)
    return roles


class PssSampler:
    """The peak of the server's PSS, and the machine's 1-minute load average, while a phase runs."""

    def __init__(self, server: Server, every: float = 1.0):
        self.server, self.every, self.peak, self.task = server, every, None, None
        self.loads: list[float] = []

    async def _loop(self) -> None:
        while True:
            sample = await asyncio.to_thread(self.server.pss)
            if self.peak is None or sample["total_mb"] > self.peak["total_mb"]:
                self.peak = sample
            self.loads.append(os.getloadavg()[0])
            await asyncio.sleep(self.every)

    def load_avg(self) -> dict[str, float]:
        return {"mean": round(statistics.fmean(self.loads), 2), "max": round(max(self.loads), 2)} if self.loads else {}

    def __enter__(self) -> PssSampler:
        self.task = asyncio.get_running_loop().create_task(self._loop())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self.task is not None
        self.task.cancel()


def episode_list(scenarios: list[tuple[str, list[int]]], n: int, offset: int = 0) -> list[tuple[str, int]]:
    out = []
    for i in range(offset, offset + n):
        key, idx = scenarios[i % len(scenarios)]
        out.append((key, idx[(i // len(scenarios)) % len(idx)]))
    return out


async def workload_a(server: Server, scenarios: list[tuple[str, list[int]]], a: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"start_s": round(server.start_s, 2), "load_avg_at_start": os.getloadavg()}
    await asyncio.sleep(a.settle)
    out["idle_pss"] = await asyncio.to_thread(server.pss)

    # one session alone: a warm-up episode on each of the first --warmup-scenarios scenarios (its
    # resets: the first of each scenario in the server's life), then --solo-episodes on them
    solo, warm = Tally(), Tally()
    warmed = scenarios[:max(1, a.warmup_scenarios)]
    s = Session(server.url, a.timeout)
    await s.connect()
    solo_sampler = PssSampler(server).__enter__()
    try:
        for i, (key, idx) in enumerate(episode_list(warmed, len(warmed))):
            try:
                await episode_a(s, key, idx, -1 - i, a.min_calls, a.max_calls, warm)
            except Exception:
                await s.close()
                s = Session(server.url, a.timeout)
                await s.connect()
        out["first_reset_of_each_scenario_ms"] = ms_stats(warm.reset_ms)
        out["warmup_failures"] = dict(warm.failures)
        out["warmup_failed_examples"] = warm.failed_examples
        for i, (key, idx) in enumerate(episode_list(warmed, a.solo_episodes, len(warmed))):
            try:
                await episode_a(s, key, idx, 10_000 + i, a.min_calls, a.max_calls, solo)
            except Exception:
                await s.close()
                s = Session(server.url, a.timeout)
                await s.connect()
    finally:
        solo_sampler.__exit__()
        await s.close()
    out["solo"] = {**solo.report(), "load_avg_1m": solo_sampler.load_avg()}

    # memory: N sessions open, each reset, tools listed, one call, held; PSS; then done
    n = a.sessions
    mem: dict[str, Any] = {"sessions": n, "idle": await asyncio.to_thread(server.pss)}
    held = [Session(server.url, a.timeout) for _ in range(n)]
    errors: Counter = Counter()

    async def open_one(i: int, sess: Session) -> None:
        key, idx = scenarios[i % len(scenarios)]
        try:
            await sess.connect()
            reply = await sess.reset(scenario=key, task_idx=idx[0])
            if reply.get("observation", {}).get("reward_type") != "reset_ok":
                errors[f"reset: {reply.get('observation', {}).get('reward_type')}"] += 1
                return
            every, read_only = tool_names(await sess.list_tools())
            if every:
                await sess.call((read_only or every)[0], {})
        except Exception as e:
            errors[reason_of(e)] += 1

    try:
        await asyncio.gather(*(open_one(i, sess) for i, sess in enumerate(held)))
        await asyncio.sleep(a.settle)
        samples = [await asyncio.to_thread(server.pss) for _ in range(3)]
        mem["peak"] = max(samples, key=lambda x: x["total_mb"])
        mem["stats"] = server.stats()
        mem["errors"] = dict(errors)
    finally:
        async def finish(sess: Session) -> None:
            try:
                if sess.ws is not None:
                    await sess.call("done", {"keep_session": False})
            except Exception:
                pass
            await sess.close()
        await asyncio.gather(*(finish(sess) for sess in held))
    mem["added_per_session_mb"] = round((mem["peak"]["total_mb"] - mem["idle"]["total_mb"]) / n, 1)
    mem["all_in_per_session_mb"] = round(mem["peak"]["total_mb"] / n, 1)
    out["memory"] = mem

    # workload A: --episodes over --sessions concurrent sessions
    plan = episode_list(scenarios, a.episodes)
    next_i = iter(range(len(plan)))
    load = Tally()

    async def worker() -> None:
        s = Session(server.url, a.timeout)
        try:
            await s.connect()
        except Exception as e:
            load.fail(f"connect: {reason_of(e)}", str(e)[:300])
            return
        try:
            for i in next_i:
                key, idx = plan[i]
                try:
                    await episode_a(s, key, idx, i, a.min_calls, a.max_calls, load)
                except Exception:  # a broken session: a new one for the next episode
                    await s.close()
                    s = Session(server.url, a.timeout)
                    await s.connect()
        finally:
            await s.close()

    with PssSampler(server) as sampler:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(a.sessions)))
        wall = time.perf_counter() - t0
    out["load"] = {"episodes": a.episodes, "sessions": a.sessions, "wall_s": round(wall, 2),
                   "episodes_per_s": round(load.ok / wall, 3), **load.report(), "pss_peak": sampler.peak,
                   "load_avg_1m": sampler.load_avg(), "tools_per_scenario": load.tools_per_scenario,
                   "tool_sets": load.tool_sets}
    return out


async def workload_s(server: Server, scenarios: list[tuple[str, list[int]]], a: argparse.Namespace) -> dict[str, Any]:
    """Many scenarios, one session: ``__list_scenarios__`` before any reset (its count and time),
    then each of the first ``--scale-scenarios`` scenarios in turn reset (its first reset in the
    server's life), one tool called and the episode ended; PSS sampled every ``--scale-every``
    scenarios, so memory against scenarios touched is a line whose slope is the cost per scenario."""
    out: dict[str, Any] = {"start_s": round(server.start_s, 2), "load_avg_at_start": os.getloadavg()}
    await asyncio.sleep(a.settle)
    out["idle_pss"] = await asyncio.to_thread(server.pss)
    s = Session(server.url, a.timeout)
    await s.connect()
    failures: Counter[str] = Counter()
    resets: list[float] = []
    curve: list[dict[str, Any]] = []
    try:
        t0 = time.perf_counter()
        listed = (await s.call("__list_scenarios__", {})).get("observation", {})
        out["list_scenarios"] = {"ms": round((time.perf_counter() - t0) * 1000, 1), "total": listed.get("total"),
                                 "listed": len(listed.get("scenarios") or [])}
        wanted = scenarios[: a.scale_scenarios] if a.scale_scenarios else scenarios
        started = time.perf_counter()
        for i, (key, idx) in enumerate(wanted, 1):
            try:
                t0 = time.perf_counter()
                reply = await s.reset(scenario=key, task_idx=idx[0])
                kind = reply.get("observation", {}).get("reward_type")
                if kind != "reset_ok":
                    failures[f"reset: {kind}: {str(reply.get('observation', {}).get('error'))[:80]}"] += 1
                    continue
                resets.append((time.perf_counter() - t0) * 1000)
                every, read_only = tool_names(await s.list_tools())
                if every:
                    await s.call((read_only or every)[0], {})
                await s.call("done", {"keep_session": False})
            except Exception as e:  # a broken session: a new one for the next scenario
                failures[reason_of(e)] += 1
                await s.close()
                s = Session(server.url, a.timeout)
                await s.connect()
            if i % a.scale_every == 0 or i == len(wanted):
                curve.append({"scenarios_touched": i, "wall_s": round(time.perf_counter() - started, 1),
                              **(await asyncio.to_thread(server.pss))})
    finally:
        await s.close()
    first, last = curve[0] if curve else None, curve[-1] if curve else None
    out.update({"scenarios": len(wanted), "failures": dict(failures), "first_reset_ms": ms_stats(resets),
                "pss_curve": curve, "stats": server.stats()})
    if first and last and last["scenarios_touched"] > first["scenarios_touched"]:
        span = last["scenarios_touched"] - first["scenarios_touched"]
        out["pss_mb_per_scenario_touched"] = round((last["total_mb"] - first["total_mb"]) / span, 3)
    return out


async def workload_b(server: Server, scenarios: list[tuple[str, list[int]]], a: argparse.Namespace) -> dict[str, Any]:
    """OpenEnv's stress test's shape: every episode launched at once, connect + reset under a
    semaphore of --concurrency, then list_tools, random tools with {} after think time, done."""
    out: dict[str, Any] = {"start_s": round(server.start_s, 2), "load_avg_at_start": os.getloadavg()}
    await asyncio.sleep(a.settle)
    out["idle_pss"] = await asyncio.to_thread(server.pss)
    t = Tally()
    gate = asyncio.Semaphore(a.concurrency)
    live = {"now": 0, "peak": 0}
    turns_done = Counter()

    async def one(i: int) -> None:
        key, idx = scenarios[i % len(scenarios)]
        task_idx = idx[i % len(idx)]
        rng = random.Random(i)
        turns = rng.randint(a.min_turns, a.max_turns)
        s, phase, t_ep = Session(server.url, a.timeout), "connect", time.perf_counter()
        try:
            async with gate:
                t0 = time.perf_counter()
                await s.connect()
                live["now"] += 1
                live["peak"] = max(live["peak"], live["now"])
                t.connect_ms.append((time.perf_counter() - t0) * 1000)
                phase = "reset"
                t0 = time.perf_counter()
                obs = (await s.reset(scenario=key, task_idx=task_idx)).get("observation", {})
                if obs.get("reward_type") not in ("reset_ok", "reset_warning"):
                    t.fail(f"reset: {obs.get('reward_type')}", f"{key}/{task_idx} [reset] {brief(obs)}")
                    return
                t.reset_ms.append((time.perf_counter() - t0) * 1000)
            phase = "list_tools"
            t0 = time.perf_counter()
            every, _ = tool_names(await s.list_tools())
            t.list_ms.append((time.perf_counter() - t0) * 1000)
            every = every or ["unknown_tool"]
            for _ in range(turns):
                phase = "call_tool"
                await asyncio.sleep(rng.uniform(a.think_min, a.think_max))
                t0 = time.perf_counter()
                reply = await s.call(rng.choice(every), {})
                t.call_ms.append((time.perf_counter() - t0) * 1000)
                t.call_types[reply.get("observation", {}).get("reward_type")] += 1
                turns_done["turns"] += 1
            phase = "done"
            t0 = time.perf_counter()
            await s.call("done", {"keep_session": False})
            t.done_ms.append((time.perf_counter() - t0) * 1000)
            t.ok += 1
            t.episode_ms.append((time.perf_counter() - t_ep) * 1000)
        except asyncio.CancelledError:
            t.fail("deadline", f"{key}/{task_idx} [{phase}] still running at the deadline")
            raise
        except Exception as e:
            t.fail(f"{phase}: {reason_of(e)}", f"{key}/{task_idx} [{phase}] {type(e).__name__}: {str(e)[:300]}")
        finally:
            if s.ws is not None:
                live["now"] -= 1
            await s.close()

    sessions_seen: list[int] = []
    waiting_seen: list[int] = []  # awm's /stats: resets waiting for a free instance

    async def watch() -> None:
        t_start, last = time.perf_counter(), 0.0
        while True:
            st = await asyncio.to_thread(server.stats)
            if st and isinstance(st.get("total_sessions"), int):
                sessions_seen.append(st["total_sessions"])
            if st and isinstance(st.get("awm"), dict) and isinstance(st["awm"].get("resets_waiting"), int):
                waiting_seen.append(st["awm"]["resets_waiting"])
            if time.perf_counter() - last > 30:
                last = time.perf_counter()
                print(f"  [{last - t_start:.0f} s] {server.name} B: ok {t.ok}, failed {sum(t.failures.values())}, "
                      f"resets {len(t.reset_ms)}, turns {turns_done['turns']}, open {live['now']}, "
                      f"server sessions {sessions_seen[-1] if sessions_seen else '?'}, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr)
            await asyncio.sleep(2)

    with PssSampler(server, 2.0) as sampler:
        watcher = asyncio.get_running_loop().create_task(watch())
        t0 = time.perf_counter()
        tasks = [asyncio.ensure_future(one(i)) for i in range(a.scale)]
        done, pending = await asyncio.wait(tasks, timeout=a.deadline)
        for p in pending:
            p.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - t0
        watcher.cancel()
    out.update({"scale": a.scale, "concurrency": a.concurrency, "turns": [a.min_turns, a.max_turns],
                "think_s": [a.think_min, a.think_max], "deadline_s": a.deadline, "hit_deadline": bool(pending),
                "wall_s": round(wall, 1), "episodes_per_s": round(t.ok / wall, 3), "turns_done": turns_done["turns"],
                **t.report(), "open_websockets_peak": live["peak"],
                "server_sessions_peak": max(sessions_seen) if sessions_seen else None,
                "resets_waiting_for_an_instance_peak": max(waiting_seen) if waiting_seen else None,
                "pss_peak": sampler.peak,
                "load_avg_1m": sampler.load_avg()})
    return out


# -- the run -----------------------------------------------------------------------------------------


def ratio(x: Any, y: Any) -> float | None:
    if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y:
        return round(x / y, 3)
    return None


def dig(d: dict[str, Any], *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict):
            return None
        d = d.get(p)  # type: ignore[assignment]
    return d


RATIOS = {
    "A_episodes_per_s": ("A", "load", "episodes_per_s"),
    "A_reset_p50_solo": ("A", "solo", "reset_ms", "p50"),
    "A_reset_p99_solo": ("A", "solo", "reset_ms", "p99"),
    "A_reset_p50_load": ("A", "load", "reset_ms", "p50"),
    "A_reset_p99_load": ("A", "load", "reset_ms", "p99"),
    "A_tool_call_p50_solo": ("A", "solo", "tool_call_ms", "p50"),
    "A_tool_call_p99_solo": ("A", "solo", "tool_call_ms", "p99"),
    "A_tool_call_p50_load": ("A", "load", "tool_call_ms", "p50"),
    "A_tool_call_p99_load": ("A", "load", "tool_call_ms", "p99"),
    "A_pss_added_per_session": ("A", "memory", "added_per_session_mb"),
    "A_pss_all_in_per_session": ("A", "memory", "all_in_per_session_mb"),
    "B_episodes_per_s": ("B", "episodes_per_s"),
    "B_reset_p50": ("B", "reset_ms", "p50"),
    "B_reset_p99": ("B", "reset_ms", "p99"),
    "B_tool_call_p50": ("B", "tool_call_ms", "p50"),
    "B_tool_call_p99": ("B", "tool_call_ms", "p99"),
}


def cooldown(limit: float, quiet: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and os.getloadavg()[0] > quiet:
        time.sleep(5)
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", nargs="+", choices=["openenv", "awm"], default=["openenv", "awm"])
    ap.add_argument("--workload", nargs="+", choices=["A", "B", "S"], default=["A"],
                    help="A: latency, memory, episodes/s; B: the stress test's shape; S: many scenarios")
    ap.add_argument("--replicate", type=int, default=None, help="clone the data's scenarios to this many "
                    "(renamed, each its own scenario: 1,000 from 8)")
    ap.add_argument("--scale-scenarios", type=int, default=None, help="S: scenarios touched (default all)")
    ap.add_argument("--scale-every", type=int, default=50, help="S: a PSS sample every this many scenarios")
    ap.add_argument("--openenv", type=Path, default=Path(os.environ.get("AWM_OPENENV_GIT", DEFAULT_OPENENV_GIT)),
                    help="OpenEnv's repository: a git directory or a checkout")
    ap.add_argument("--data", default="lisalims", help="lisalims | fixture | an AgentWorldModel-1K-layout directory")
    ap.add_argument("--lisalims", type=Path, default=Path(os.environ.get("AWM_LISALIMS_GIT", DEFAULT_LISALIMS_GIT)),
                    help="lisalims/agent-world-model: a git directory or a checkout")
    ap.add_argument("--max-scenarios", type=int, default=None)
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--min-calls", type=int, default=3)
    ap.add_argument("--max-calls", type=int, default=10)
    ap.add_argument("--solo-episodes", type=int, default=8)
    ap.add_argument("--warmup-scenarios", type=int, default=8, help="A: scenarios given one untimed episode first")
    ap.add_argument("--scale", type=int, default=1024)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--min-turns", type=int, default=3)
    ap.add_argument("--max-turns", type=int, default=20)
    ap.add_argument("--think-min", type=float, default=0.0)
    ap.add_argument("--think-max", type=float, default=0.0)
    ap.add_argument("--deadline", type=float, default=3600.0, help="workload B: wall-time bound, s")
    ap.add_argument("--awm-instances", type=int, default=None, help="awm's --instances for A (default --sessions)")
    ap.add_argument("--awm-instances-b", type=int, default=None, help="... for B (default --concurrency)")
    ap.add_argument("--awm-arg", action="append", default=[], help="an extra argument of `awm openenv serve`")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-message timeout, s (the stress test's)")
    ap.add_argument("--settle", type=float, default=2.0, help="s before an idle or held PSS sample")
    ap.add_argument("--cooldown", type=float, default=180.0, help="before each server: wait up to this many s "
                    "for the 1-minute load average to fall under --quiet-load (the previous server's tail)")
    ap.add_argument("--quiet-load", type=float, default=2.0 * (os.cpu_count() or 1))
    ap.add_argument("--logs", type=Path, default=None, help="servers' logs (default: a temporary directory)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    try:
        data, data_facts = prepare_data(a.data, a.lisalims)
        if a.replicate:
            data = replicate(data, a.replicate)
            data_facts["replicated_to"] = a.replicate
        scenarios = plan_scenarios(data, a.max_scenarios)
        inst = install_openenv(a.openenv) if "openenv" in a.servers else None
    except BenchError as e:
        print(f"bench.openenv_awm: {e}", file=sys.stderr)
        return 2
    logs = a.logs or Path(tempfile.mkdtemp(prefix="awm-bench-openenv-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "machine": {**machine(), "load_avg_at_start": os.getloadavg(), "platform": platform.platform()},
        "data": {**data_facts, "dir": str(data), "scenarios": len(scenarios),
                 "tasks_with_code_verifier": sum(len(i) for _, i in scenarios)},
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k != "json"},
        "logs": str(logs), "servers": {},
    }
    if inst is not None:
        out["openenv"] = {"commit": inst.commit, "root": str(inst.root), "venv": str(inst.venv)}
    why_not_awm = awm_command_ready() if "awm" in a.servers else None
    for w in a.workload:
        for name in a.servers:
            res = out["servers"].setdefault(name, {})
            if name == "awm" and why_not_awm:
                res[w] = {"error": why_not_awm}
                continue
            if name == "openenv":
                assert inst is not None
                server = openenv_server(inst, data, logs)
            else:
                n = (a.awm_instances or a.sessions) if w in ("A", "S") else (a.awm_instances_b or a.concurrency)
                server = awm_server(data, n, logs, a.awm_arg)
            waited = cooldown(a.cooldown, a.quiet_load)
            print(f"{name}, workload {w} (after {waited:.0f} s of cooldown): {' '.join(server.cmd)}", file=sys.stderr)
            try:
                server.start()
                fn = {"A": workload_a, "B": workload_b, "S": workload_s}[w]
                res[w] = {"command": " ".join(server.cmd), "cooldown_s": round(waited),
                          **asyncio.run(fn(server, scenarios, a))}
            except BenchError as e:
                res[w] = {"error": str(e)}
            except Exception as e:  # recorded; the other server still runs
                res[w] = {"error": f"{type(e).__name__}: {e}"}
            finally:
                server.stop()
            print(f"{name}, workload {w}: done", file=sys.stderr)
    oe, aw = out["servers"].get("openenv", {}), out["servers"].get("awm", {})
    out["ratios_awm_over_openenv"] = {k: ratio(dig(aw, *p), dig(oe, *p)) for k, p in RATIOS.items()}
    sets = [dig(s, "A", "load", "tool_sets") or {} for s in (oe, aw)]
    if all(sets):  # the same tools (by name) per scenario on both servers: the same calls were made
        out["tool_names_differ"] = sorted(k for k in sets[0] if sets[0].get(k) != sets[1].get(k))
    print(json.dumps(out, indent=None if a.json else 1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
