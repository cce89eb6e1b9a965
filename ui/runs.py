"""Run directories of ``awm train`` and ``awm eval``, found under the roots ``awm ui`` was given.

A run directory is one that holds any of ``trajectories.jsonl`` (both), ``metrics.jsonl`` (train:
one line per step), ``eval.json`` (eval: pass@1/pass@k per environment) and ``config.json``
(train's resolved configuration). What each file holds: docs/training.md.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from awm.ui.index import EpisodeIndex

MARKERS = ("trajectories.jsonl", "metrics.jsonl", "eval.json")
MAX_DEPTH = 4  # how deep under a root run directories are looked for
SYNC_BYTES = 16 * 2**20  # less log than this to index: within the request (well under a second)
# A run is "running" while its files were written lately: the trainer appends a trajectory line
# per finished turn and a metrics line per step, but a step can be minutes of learner work with no
# write (sync mode, a big model), so "lately" is this or three of its longest recent steps.
QUIET_S = 300.0
WRITTEN = ("trajectories.jsonl", "metrics.jsonl", "eval.json", "config.json")


class RunInfo(BaseModel):
    """One run as the run list shows it."""

    id: str
    name: str
    path: str
    kind: str  # train | eval | unknown
    framework: str | None = None  # awm | trl | verl | skyrl (who trained it), None: not known
    model: str | None = None  # an evaluation's policy (eval.json), a training run's policy name
    steps: int = 0
    last_reward: float | None = None
    k: int | None = None  # an evaluation's k, and its overall pass@1 and pass@k
    pass_at_1: float | None = None
    pass_at_k: float | None = None
    modified: float = 0.0
    state: str = "idle"  # running | finished | stopped | idle (see run_state)
    state_reason: str = ""
    step: int | None = None  # the last step logged, and of how many (config.json's steps)
    total_steps: int | None = None
    now: float = 0.0  # the server's clock when this was read: a page says "written 12 s ago" by it
    # its settings, flattened (``grpo.lr``): a training run's config.json, an evaluation's k and
    # settings; the runs list shows those that differ between runs as columns, searchable and sortable
    hyper: dict[str, str | int | float | bool | None] = {}


MAX_HYPER = 200  # settings per run the list carries (a config is a few dozen)


def flat_settings(value: Any, prefix: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nested settings as dotted keys with scalar values (lists as JSON text), at most MAX_HYPER."""
    out = {} if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            if len(out) >= MAX_HYPER:
                break
            flat_settings(item, f"{prefix}.{key}" if prefix else str(key), out)
    elif prefix:
        out[prefix] = value if value is None or isinstance(value, (str, int, float, bool)) else json.dumps(value)[:200]
    return out


def run_id(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _find(root: Path, depth: int = 0) -> list[Path]:
    if not root.is_dir():
        return []
    found = [root] if any((root / m).is_file() for m in MARKERS) else []
    if depth < MAX_DEPTH:
        for child in sorted(root.iterdir()):
            if child.is_dir() and not child.name.startswith(".") and child.name not in ("checkpoints", "weights"):
                found += _find(child, depth + 1)
    return found


_METRICS: dict[Path, tuple[tuple[int, int, int], list[dict[str, Any]]]] = {}  # path -> (stat key, records)


def read_metrics(run: Path) -> list[dict[str, Any]]:
    """The per-step records of ``metrics.jsonl``; a line cut by a crash is skipped. Parsed once
    per version of the file (size, mtime, inode): a long run's 6,000 lines of 30 keys take a
    large part of a second to parse, and the run list and run page ask again and again."""
    path = run / "metrics.jsonl"
    try:
        stat = path.stat()
    except OSError:
        return []
    key = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
    cached = _METRICS.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    _METRICS[path] = (key, records)
    return records


def first_start(run: Path) -> dict[str, Any]:
    """The first ``start`` record of the run's trajectories (names the policy; a few bytes in):
    how a run without metrics.jsonl tells who trained it."""
    path = run / "trajectories.jsonl"
    try:
        with path.open("rb") as f:
            for _, line in zip(range(64), f):
                if line.startswith(b'{"event": "start"') and line.endswith(b"\n"):
                    return json.loads(line)
    except (OSError, json.JSONDecodeError):
        pass
    return {}


FRAMEWORKS = ("trl", "verl", "skyrl")


def framework(run: Path, start: dict[str, Any], has_metrics: bool) -> str | None:
    """Who trained the run: awm's own trainer writes metrics.jsonl; the adapters of
    awm.integrations log trajectories whose policy (or an explicit ``framework`` field) names
    the framework (TRL's adapter samples as ``trl-policy``); a TRL output directory also holds
    its ``trainer_state.json`` once it saved."""
    named = str(start.get("framework") or "").lower()
    if named:
        return named
    policy = str(start.get("policy") or "").lower()
    for name in FRAMEWORKS:
        if policy.startswith(name):
            return name
    if (run / "trainer_state.json").is_file():
        return "trl"
    return "awm" if has_metrics or (run / "config.json").is_file() else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def quiet_limit(metrics: list[dict[str, Any]]) -> float:
    """How long a running run may go without writing a file: QUIET_S, or three times the
    longest of its last five steps when those took longer."""
    recent = [m["step_s"] for m in metrics[-5:] if isinstance(m.get("step_s"), (int, float))]
    return max([QUIET_S, *(3 * s for s in recent)])


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def run_state(metrics: list[dict[str, Any]], total: int | None, report: dict[str, Any] | None,
              last_write: float, now: float) -> tuple[str, str]:
    """What a run directory's files say about its run, with the reason shown beside it. The
    trainer writes no heartbeat and no final marker, so: an evaluation is finished when its
    eval.json is there (stopped when that report says it is partial); a training run is finished
    when its last metrics line is config.json's last step; otherwise a run that wrote a file
    within quiet_limit is running, and one that did not has stopped short (crashed or killed:
    the files cannot tell which) or, when its number of steps is not known, is idle."""
    if report is not None:
        if report.get("incomplete"):
            return "stopped", f"partial report: {report['incomplete']}"
        return "finished", "eval.json written"
    step = metrics[-1].get("step") if metrics else None
    if total and isinstance(step, int) and step >= total:
        return "finished", f"all {total} steps logged"
    quiet = now - last_write
    if quiet <= quiet_limit(metrics):
        return "running", f"last write {_ago(quiet)} ago"
    if total:
        return "stopped", (f"no write for {_ago(quiet)} at step {step or 0} of {total}: it crashed or was killed "
                           "(awm train with the same run_dir resumes it)")
    return "idle", f"no write for {_ago(quiet)}"


def status(info: RunInfo, path: Path | None = None) -> dict[str, Any]:
    out = info.model_dump(include={"id", "name", "kind", "state", "state_reason", "step", "total_steps", "modified", "now"})
    if path is not None:
        out["sizes"] = {m: (path / m).stat().st_size if (path / m).is_file() else None for m in WRITTEN}
    return out


class Runs:
    """The runs under some roots, and one episode index per run (opened when first asked for)."""

    def __init__(self, roots: list[Path]) -> None:
        self.roots = roots
        self._indexes: dict[str, EpisodeIndex] = {}
        self._lock = threading.Lock()

    def paths(self) -> dict[str, Path]:
        return {run_id(p): p for root in self.roots for p in _find(root)}

    def list(self) -> list[RunInfo]:
        out = []
        for rid, path in self.paths().items():
            out.append(self.info(rid, path))
        return sorted(out, key=lambda r: -r.modified)

    def info(self, rid: str, path: Path) -> RunInfo:
        metrics = read_metrics(path)
        rewards = [m["reward_mean"] for m in metrics if m.get("reward_mean") is not None]
        report = _read_json(path / "eval.json") if (path / "eval.json").is_file() else None
        start = first_start(path)
        made_by = framework(path, start, bool(metrics))
        kind = "eval" if report is not None else "train" if made_by else "unknown"
        name = next((str(path.relative_to(r)) for r in self.roots if path.is_relative_to(r)), path.name)
        modified = max((path / m).stat().st_mtime for m in WRITTEN if (path / m).is_file())
        overall = (report or {}).get("overall") or {}
        k = (report or {}).get("k")
        config = _read_json(path / "config.json") if kind == "train" else None
        total = (config or {}).get("steps")
        total = total if isinstance(total, int) and total > 0 else None
        now = time.time()
        state, why = run_state(metrics, total, report, modified, now)
        last_step = metrics[-1].get("step") if metrics else None
        hyper = flat_settings(config) if config else flat_settings(
            {"k": k, **((report or {}).get("settings") or {})}) if report is not None else {}
        return RunInfo(id=rid, name=name if name != "." else path.name, path=str(path), kind=kind, hyper=hyper,
                       framework=None if report is not None else made_by,
                       model=(report or {}).get("model") or start.get("policy"), steps=len(metrics),
                       last_reward=rewards[-1] if rewards else None, k=k, pass_at_1=overall.get("pass@1"),
                       pass_at_k=overall.get(f"pass@{k}") if k else None, modified=modified, state=state,
                       state_reason=why, step=last_step if isinstance(last_step, int) else None,
                       total_steps=total, now=now)

    def status(self, rid: str) -> dict[str, Any] | None:
        """What a live page polls: the run's state and progress, and the sizes of its logs (a
        page fetches the whole run again only when one of them changed)."""
        path = self.path(rid)
        return None if path is None else status(self.info(rid, path), path)

    def path(self, rid: str) -> Path | None:
        return self.paths().get(rid)

    def _get(self, rid: str) -> EpisodeIndex | None:
        path = self.path(rid)
        if path is None or not (path / "trajectories.jsonl").is_file():
            return None
        with self._lock:  # requests run in a thread pool: one index object per run
            index = self._indexes.get(rid)
            if index is None:
                index = self._indexes[rid] = EpisodeIndex(path / "trajectories.jsonl")
        return index

    def index(self, rid: str) -> EpisodeIndex | None:
        """The run's episode index, brought up to date (a run still writing grows it)."""
        index = self._get(rid)
        if index is not None:
            index.refresh()
        return index

    def index_now(self, rid: str) -> tuple[EpisodeIndex | None, dict[str, int] | None]:
        """The index if it is up to date, or after a short refresh; when more than ``SYNC_BYTES``
        are left to scan (a big run's first open) the refresh runs on its own thread and the
        answer is its progress instead, so a page can draw what needs no index meanwhile."""
        index = self._get(rid)
        if index is None:
            return None, None
        if index.pending() <= SYNC_BYTES:
            index.refresh()  # a small refresh another request runs: wait for it (the lock), not report progress
            return index, None
        if not index.busy:  # two requests may both start one: the second waits, then finds nothing left
            threading.Thread(target=index.refresh, name=f"awm-ui-index-{rid}", daemon=True).start()
        return index, index.progress()

    def summary(self, rid: str) -> dict[str, Any] | None:
        """Everything the run page draws: metrics per step, the eval report, per-environment
        rates, filter values."""
        path = self.path(rid)
        if path is None:
            return None
        index, indexing = self.index_now(rid)
        ready = index if indexing is None else None
        info = self.info(rid, path)
        report = _read_json(path / "eval.json")
        return {"id": rid, "name": path.name, "path": str(path), "kind": info.kind, "framework": info.framework,
                "evaluated_run": self._evaluated_run(report) if report else None,
                "evaluations": self.evaluations_of(path) if info.kind == "train" else [],
                "status": status(info, path),
                "model": info.model, "metrics": (metrics := read_metrics(path)),
                "eval": report, "config": _read_json(path / "config.json"),
                "indexing": indexing,
                "per_env": ready.per_env() if ready else [], "facets": ready.facets() if ready else {},
                "per_task": ready.per_task() if ready else [], "by_version": ready.by_version() if ready and not metrics and info.kind == "train" else [],
                "episodes": ready.count() if ready else (None if indexing else 0)}

    def _evaluated_run(self, report: dict[str, Any]) -> dict[str, Any] | None:
        """The training run and step an evaluation's checkpoint came from, if it is one of ours."""
        checkpoint = report.get("checkpoint") or {}
        run_dir, step = checkpoint.get("run_dir"), checkpoint.get("step")
        if not isinstance(run_dir, str) or not isinstance(step, int):
            return None
        for rid, path in self.paths().items():
            if str(path.resolve()) == run_dir:
                return {"id": rid, "name": path.name, "step": step}
        return {"id": None, "name": Path(run_dir).name, "step": step}

    def evaluations_of(self, run: Path) -> list[dict[str, Any]]:
        """The evaluations of a training run's checkpoints (their eval.json names the run's
        directory), by step: what its page draws as pass@1 over checkpoints."""
        out = []
        target = str(run.resolve())
        for rid, path in self.paths().items():
            report = _read_json(path / "eval.json") if (path / "eval.json").is_file() else None
            checkpoint = (report or {}).get("checkpoint") or {}
            if checkpoint.get("run_dir") != target or not isinstance(checkpoint.get("step"), int):
                continue
            overall, k = report.get("overall") or {}, report.get("k")  # type: ignore[union-attr]
            out.append({"id": rid, "name": path.name, "step": checkpoint["step"], "k": k,
                        "pass@1": overall.get("pass@1"), "pass@1_ci95": overall.get("pass@1_ci95"),
                        "pass@k": overall.get(f"pass@{k}"), "settings": report.get("settings") or {}})  # type: ignore[union-attr]
        return sorted(out, key=lambda e: (e["step"], e["name"]))

    def close(self) -> None:
        for index in self._indexes.values():
            index.close()
