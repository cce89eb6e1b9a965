"""An SQLite index of a run's ``trajectories.jsonl``, so a page of 100,000 episodes opens at once.

The log is append-only JSONL (trainer/trajectory.py): ``start``/``turn`` lines while an episode
runs, an ``end`` line with the whole record, ``step`` lines naming the GRPO groups a training
step used. Parsing all of it for every page takes seconds on a large run; the index keeps, per
finished episode, the fields the episode list filters and sorts on plus the byte offset and length
of its ``end`` line, so a page is one SQL query and an episode one ``seek`` + one ``json.loads``.

The index lives outside the run directory (which may be read-only or shared), under
``$AWM_HOME/ui-index/``, named by the log's path. It is refreshed on open: a log that only grew
(same inode, larger size) is scanned from where the last scan stopped; one that shrank or was
replaced is indexed again from the start.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from awm.postgres.server import awm_home

SCHEMA_VERSION = 5  # bump when the tables change: older index files are rebuilt

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS episodes (
  n INTEGER PRIMARY KEY,          -- order in the log
  episode_id TEXT, env TEXT, task_id TEXT, group_id TEXT,
  verdict TEXT, reward REAL, masked INTEGER, mask_reason TEXT, stop_reason TEXT,
  error_kinds TEXT,               -- ',kind,kind,' of the tool errors (agent's and ours)
  turns INTEGER, tool_calls INTEGER, policy_version INTEGER, started_at REAL,
  offset INTEGER, length INTEGER
);
CREATE TABLE IF NOT EXISTS group_steps (group_id TEXT PRIMARY KEY, step INTEGER);
CREATE TABLE IF NOT EXISTS advantages (episode_id TEXT PRIMARY KEY, advantage REAL);  -- from step lines
CREATE INDEX IF NOT EXISTS episodes_env_task ON episodes (env, task_id);
CREATE INDEX IF NOT EXISTS episodes_group ON episodes (group_id);
CREATE INDEX IF NOT EXISTS episodes_verdict ON episodes (verdict);
CREATE INDEX IF NOT EXISTS episodes_id ON episodes (episode_id);
CREATE INDEX IF NOT EXISTS group_steps_step ON group_steps (step);
CREATE INDEX IF NOT EXISTS episodes_version ON episodes (policy_version);
"""

_END = b'{"event": "end"'
_STEP = b'{"event": "step"'


@dataclass(frozen=True)
class EpisodeFilter:
    """What the episode list can be narrowed to (all optional; combined with AND)."""

    env: str | None = None
    task_id: str | None = None
    verdict: str | None = None
    error_kind: str | None = None
    step: int | None = None
    masked: bool | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    search: str | None = None  # part of an episode id or task id
    version: int | None = None  # the policy version (a TRL run's step: it logs no step lines)

    def where(self) -> tuple[str, list[Any]]:
        clauses, params = [], []  # type: ignore[var-annotated]
        for column in ("env", "task_id", "verdict"):
            value = getattr(self, column)
            if value:
                clauses.append(f"e.{column} = ?")
                params.append(value)
        if self.error_kind:
            clauses.append("e.error_kinds LIKE ?")
            params.append(f"%,{self.error_kind},%")
        if self.step is not None:
            clauses.append("g.step = ?")
            params.append(self.step)
        if self.version is not None:
            clauses.append("e.policy_version = ?")
            params.append(self.version)
        if self.masked is not None:
            clauses.append("e.masked = ?")
            params.append(int(self.masked))
        if self.min_reward is not None:
            clauses.append("e.reward >= ?")
            params.append(self.min_reward)
        if self.max_reward is not None:
            clauses.append("e.reward <= ?")
            params.append(self.max_reward)
        if self.search:
            clauses.append("(e.episode_id LIKE ? OR e.task_id LIKE ?)")
            params += [f"%{self.search}%"] * 2
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def summary_row(record: dict[str, Any]) -> dict[str, Any]:
    """The indexed fields of one ``end`` record."""
    turns = record.get("turns") or []
    kinds = sorted({r.get("error_kind") for t in turns for r in t.get("results", [])
                    if r.get("is_error") and r.get("error_kind")})
    return {"episode_id": record.get("episode_id"), "env": record.get("env"), "task_id": record.get("task_id"),
            "group_id": record.get("group_id"), "verdict": (record.get("verdict") or {}).get("verdict"),
            "reward": record.get("reward"), "masked": int(bool(record.get("masked"))),
            "mask_reason": record.get("mask_reason"), "stop_reason": record.get("stop_reason"),
            "error_kinds": "," + ",".join(kinds) + "," if kinds else "",
            "turns": len(turns), "tool_calls": sum(len(t.get("tool_calls") or []) for t in turns),
            "policy_version": record.get("policy_version"), "started_at": record.get("started_at")}


def index_path(log: Path) -> Path:
    digest = hashlib.sha256(str(log.resolve()).encode()).hexdigest()[:20]
    return awm_home() / "ui-index" / f"{digest}.sqlite"


class EpisodeIndex:
    """The index of one log; :meth:`refresh` brings it up to date (cheap when nothing changed)."""

    def __init__(self, log: Path, path: Path | None = None) -> None:
        self.log = log
        self.path = path or index_path(log)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the SQLite connection, shared by the server's threads
        self._refreshing = threading.Lock()  # one refresh at a time
        self._progress = (0, 0)  # bytes scanned and the log's size, while a refresh runs
        self._closing = False
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        self._memo: dict[str, Any] = {}
        if self._meta("schema") != str(SCHEMA_VERSION):
            self._reset()

    def _meta(self, key: str) -> str | None:
        try:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        except sqlite3.OperationalError:
            return None
        return row[0] if row else None

    def _memoised(self, key: str, compute: Any) -> Any:
        """Aggregates over the whole log (facets, per environment) change only when it grows."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _reset(self) -> None:
        self._db.executescript("DROP TABLE IF EXISTS meta; DROP TABLE IF EXISTS episodes; "
                               "DROP TABLE IF EXISTS group_steps; DROP TABLE IF EXISTS advantages;" + _SCHEMA)
        self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self._db.commit()

    def _state(self) -> tuple[os.stat_result | None, int]:
        """The log's stat and the offset to scan from (0: replaced or shrunk, index it again)."""
        try:
            stat = self.log.stat()
        except FileNotFoundError:
            return None, 0
        with self._lock:
            inode, scanned = self._meta("inode"), int(self._meta("scanned") or 0)
        return stat, 0 if inode != str(stat.st_ino) or stat.st_size < scanned else scanned

    def pending(self) -> int:
        """Bytes of log not indexed yet."""
        stat, scanned = self._state()
        return stat.st_size - scanned if stat else 0

    @property
    def busy(self) -> bool:
        """A refresh is running (on another thread): pages would show a partial index."""
        return self._refreshing.locked()

    def progress(self) -> dict[str, int]:
        """Bytes scanned so far and the log's size (before a refresh starts: none of it)."""
        scanned, size = self._progress
        return {"scanned": scanned, "size": size or (self.log.stat().st_size if self.log.exists() else 0)}

    def refresh(self) -> int:
        """Index what was appended since the last scan (everything after a shrink or replacement);
        returns how many episodes were added. One refresh at a time; the log is parsed outside the
        database lock, so pages of the previous state are served meanwhile."""
        with self._refreshing:
            stat, scanned = self._state()
            if stat is None or stat.st_size == scanned:
                return 0
            if scanned == 0:
                with self._lock:
                    self._reset()
                    self._memo.clear()
            self._progress = (scanned, stat.st_size)
            episodes, steps, advantages, offset = self._scan(scanned)
            with self._lock:
                if episodes:
                    columns = list(episodes[0])
                    self._db.executemany(f"INSERT INTO episodes ({', '.join(columns)}) VALUES "
                                         f"({', '.join(':' + c for c in columns)})", episodes)
                # a resumed run trains a redone step's groups again: the later step line wins
                self._db.executemany("INSERT OR REPLACE INTO group_steps VALUES (?, ?)", steps)
                self._db.executemany("INSERT OR REPLACE INTO advantages VALUES (?, ?)", advantages)
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('scanned', ?)", (str(offset),))
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('inode', ?)", (str(stat.st_ino),))
                self._db.commit()
                self._memo.clear()
            self._progress = (0, 0)
            return len(episodes)

    def _scan(self, start: int) -> tuple[list[dict[str, Any]], list[tuple[str, int]], list[tuple[str, float]], int]:
        episodes, steps, advantages = [], [], []  # type: ignore[var-annotated]
        with self._lock:
            n = self._db.execute("SELECT coalesce(max(n), -1) + 1 FROM episodes").fetchone()[0]
        offset = start
        with self.log.open("rb") as f:
            f.seek(start)
            for line in f:
                if self._closing:
                    return [], [], [], start  # the server is stopping: nothing is written
                if not line.endswith(b"\n"):
                    break  # a line still being written: the next refresh reads it whole
                if line.startswith(_END):
                    row = summary_row(json.loads(line))
                    episodes.append({**row, "n": n, "offset": offset, "length": len(line)})
                    n += 1
                    if n % 1000 == 0:
                        self._progress = (offset, self._progress[1])
                elif line.startswith(_STEP):
                    event = json.loads(line)
                    steps += [(g, event["step"]) for g in event.get("groups") or []]
                    advantages += [(e, a) for e, a in (event.get("advantages") or {}).items()
                                   if isinstance(a, (int, float))]
                offset += len(line)
        return episodes, steps, advantages, offset

    def page(self, where: EpisodeFilter, offset: int = 0, limit: int = 50) -> tuple[int, list[dict[str, Any]]]:
        """The total matching ``where`` and one page of them, in log order."""
        clause, params = where.where()
        base = f"FROM episodes e LEFT JOIN group_steps g ON g.group_id = e.group_id{clause}"
        with self._lock:
            total = self._db.execute(f"SELECT count(*) {base}", params).fetchone()[0]
            rows = self._db.execute(f"SELECT e.*, g.step AS step {base} ORDER BY e.n LIMIT ? OFFSET ?",
                                    [*params, limit, offset]).fetchall()
        return total, [_public(dict(r)) for r in rows]

    def count(self) -> int:
        def compute() -> int:
            with self._lock:
                return self._db.execute("SELECT count(*) FROM episodes").fetchone()[0]

        return self._memoised("count", compute)

    def facets(self) -> dict[str, list[Any]]:
        """Distinct values to filter by (environments, tasks, verdicts, error classes, steps)."""
        return self._memoised("facets", self._facets)

    def _facets(self) -> dict[str, list[Any]]:
        with self._lock:
            def distinct(sql: str) -> list[Any]:
                return [r[0] for r in self._db.execute(sql) if r[0] is not None]

            kinds = {k for r in distinct("SELECT DISTINCT error_kinds FROM episodes WHERE error_kinds != ''")
                     for k in r.strip(",").split(",")}
            return {"env": distinct("SELECT DISTINCT env FROM episodes ORDER BY env"),
                    "task_id": distinct("SELECT DISTINCT task_id FROM episodes ORDER BY task_id"),
                    "verdict": distinct("SELECT DISTINCT verdict FROM episodes ORDER BY verdict"),
                    "error_kind": sorted(kinds),
                    "step": distinct("SELECT DISTINCT step FROM group_steps ORDER BY step")}

    def per_env(self) -> list[dict[str, Any]]:
        """Episodes, masked and success rate per environment (for runs without an eval.json)."""
        return self._memoised("per_env", self._per_env)

    def _per_env(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT env, count(*) AS episodes, sum(masked) AS masked, "
                "avg(CASE WHEN masked = 0 THEN reward END) AS reward_mean, "
                "avg(CASE WHEN masked = 0 THEN verdict = 'complete' END) AS success_rate "
                "FROM episodes GROUP BY env ORDER BY env").fetchall()
        return [dict(r) for r in rows]

    def per_task(self) -> list[dict[str, Any]]:
        """Per task: episodes, masked, success rate, mean reward, and how the others failed
        (verdicts, stop reasons, tool error classes, mask reasons, each with its count): what an
        evaluation page needs to say which tasks a model failed and why."""
        return self._memoised("per_task", self._per_task)

    def _per_task(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT env, task_id, count(*) AS episodes, sum(masked) AS masked, "
                "avg(CASE WHEN masked = 0 THEN reward END) AS reward_mean, "
                "avg(CASE WHEN masked = 0 THEN verdict = 'complete' END) AS success_rate, "
                "(SELECT episode_id FROM episodes f WHERE f.env = e.env AND f.task_id = e.task_id AND f.masked = 0 "
                " AND coalesce(f.verdict, '') != 'complete' ORDER BY f.n LIMIT 1) AS first_failed "
                "FROM episodes e GROUP BY env, task_id ORDER BY env, task_id").fetchall()
            failed = self._db.execute(
                "SELECT env, task_id, coalesce(verdict, 'none') AS verdict, stop_reason, count(*) AS n FROM episodes "
                "WHERE masked = 0 AND coalesce(verdict, '') != 'complete' GROUP BY 1, 2, 3, 4").fetchall()
            kinds = self._db.execute("SELECT env, task_id, error_kinds, count(*) AS n FROM episodes "
                                     "WHERE error_kinds != '' GROUP BY 1, 2, 3").fetchall()
            masks = self._db.execute("SELECT env, task_id, coalesce(mask_reason, 'masked') AS reason, count(*) AS n "
                                     "FROM episodes WHERE masked = 1 GROUP BY 1, 2, 3").fetchall()
        tasks = {(r["env"], r["task_id"]): {**dict(r), "verdicts": {}, "stop_reasons": {}, "error_kinds": {},
                                             "mask_reasons": {}} for r in rows}
        for r in failed:
            task = tasks[(r["env"], r["task_id"])]
            task["verdicts"][r["verdict"]] = task["verdicts"].get(r["verdict"], 0) + r["n"]
            if r["stop_reason"]:
                task["stop_reasons"][r["stop_reason"]] = task["stop_reasons"].get(r["stop_reason"], 0) + r["n"]
        for r in kinds:
            task = tasks[(r["env"], r["task_id"])]
            for kind in r["error_kinds"].strip(",").split(","):
                task["error_kinds"][kind] = task["error_kinds"].get(kind, 0) + r["n"]
        for r in masks:
            tasks[(r["env"], r["task_id"])]["mask_reasons"][r["reason"]] = r["n"]
        return list(tasks.values())

    def by_version(self) -> list[dict[str, Any]]:
        """Per policy version (the weights that produced the episode): episodes, masked, mean
        reward, success rate, turns and tool calls. A run without metrics.jsonl (TRL: every turn
        records its policy version, the trainer's step) gets its curve from this."""
        return self._memoised("by_version", self._by_version)

    def _by_version(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT policy_version AS version, count(*) AS episodes, sum(masked) AS masked, "
                "avg(CASE WHEN masked = 0 THEN reward END) AS reward_mean, "
                "avg(CASE WHEN masked = 0 THEN verdict = 'complete' END) AS success_rate, "
                "avg(turns) AS episode_turns_mean, avg(tool_calls) AS tool_calls_mean, "
                "avg(error_kinds != '') AS tool_error_episode_fraction "
                "FROM episodes WHERE policy_version IS NOT NULL GROUP BY policy_version ORDER BY policy_version").fetchall()
        return [dict(r) for r in rows]

    def neighbours(self, episode_id: str) -> dict[str, str | None]:
        """The episodes before and after this one in the log (the episode page's previous/next)."""
        with self._lock:
            row = self._db.execute("SELECT n FROM episodes WHERE episode_id = ? ORDER BY n DESC LIMIT 1",
                                   (episode_id,)).fetchone()
            if row is None:
                return {"previous": None, "next": None}
            before = self._db.execute("SELECT episode_id FROM episodes WHERE n < ? ORDER BY n DESC LIMIT 1",
                                      (row["n"],)).fetchone()
            after = self._db.execute("SELECT episode_id FROM episodes WHERE n > ? ORDER BY n LIMIT 1",
                                     (row["n"],)).fetchone()
        return {"previous": before[0] if before else None, "next": after[0] if after else None}

    def group(self, group_id: str) -> dict[str, Any] | None:
        """A GRPO group as a unit: its step and its episodes in log order, each with its reward,
        verdict, whether it was masked and the advantage the learner gave it (None where the log
        says none: masked, or the group not trained on yet)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.episode_id, e.task_id, e.env, e.verdict, e.reward, e.masked, e.mask_reason, e.turns, "
                "e.tool_calls, a.advantage, g.step FROM episodes e LEFT JOIN advantages a ON a.episode_id = e.episode_id "
                "LEFT JOIN group_steps g ON g.group_id = e.group_id WHERE e.group_id = ? ORDER BY e.n",
                (group_id,)).fetchall()
        if not rows:
            return None
        members = [{**dict(r), "masked": bool(r["masked"])} for r in rows]
        for member in members:
            member.pop("step", None)
        valid = [m["reward"] for m in members if not m["masked"] and m["reward"] is not None]
        return {"group_id": group_id, "step": rows[0]["step"], "episodes": members, "size": len(members),
                "reward_mean": sum(valid) / len(valid) if valid else None}

    def step_groups(self, step: int) -> list[dict[str, Any]]:
        """The GRPO groups a training step trained on, each as a unit: its task, its episodes in
        log order with their rewards, verdicts and advantages, and its mean reward."""
        with self._lock:
            rows = self._db.execute(
                "SELECT e.group_id, e.episode_id, e.task_id, e.env, e.verdict, e.reward, e.masked, a.advantage "
                "FROM episodes e JOIN group_steps g ON g.group_id = e.group_id "
                "LEFT JOIN advantages a ON a.episode_id = e.episode_id WHERE g.step = ? ORDER BY e.n", (step,)).fetchall()
        groups: dict[str, dict[str, Any]] = {}
        for r in rows:
            group = groups.setdefault(r["group_id"], {"group_id": r["group_id"], "env": r["env"], "task_id": r["task_id"],
                                                      "episodes": []})
            group["episodes"].append({"episode_id": r["episode_id"], "verdict": r["verdict"], "reward": r["reward"],
                                      "masked": bool(r["masked"]), "advantage": r["advantage"]})
        for group in groups.values():
            valid = [e["reward"] for e in group["episodes"] if not e["masked"] and e["reward"] is not None]
            group["size"] = len(group["episodes"])
            group["reward_mean"] = sum(valid) / len(valid) if valid else None
        return list(groups.values())

    def episode(self, episode_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT e.offset, e.length, g.step FROM episodes e LEFT JOIN group_steps g "
                                   "ON g.group_id = e.group_id WHERE e.episode_id = ? ORDER BY e.n DESC LIMIT 1",
                                   (episode_id,)).fetchone()
        if row is None:
            return None
        with self.log.open("rb") as f:
            f.seek(row["offset"])
            record = json.loads(f.read(row["length"]))
        record.pop("event", None)
        record["step"] = row["step"]
        return record

    def close(self) -> None:
        self._closing = True  # a background refresh stops at its next line
        with self._refreshing, self._lock:
            self._db.close()


def _public(row: dict[str, Any]) -> dict[str, Any]:
    row["masked"] = bool(row["masked"])
    row["error_kinds"] = [k for k in (row.get("error_kinds") or "").split(",") if k]
    for private in ("offset", "length", "n"):
        row.pop(private, None)
    return row


def scan_page(log: Path, where: EpisodeFilter, offset: int = 0, limit: int = 50) -> tuple[int, list[dict[str, Any]]]:
    """The same page without an index: parse the whole log (the baseline bench/ui.py measures)."""
    steps: dict[str, int] = {}
    rows: list[dict[str, Any]] = []
    for event in _events(log):
        if event.get("event") == "end":
            rows.append(summary_row(event))
        elif event.get("event") == "step":
            steps.update({g: event["step"] for g in event.get("groups") or []})
    matching = [r for r in rows if _matches(r, steps.get(r["group_id"] or ""), where)]
    return len(matching), [_public({**r, "step": steps.get(r["group_id"] or "")})
                           for r in matching[offset:offset + limit]]


def _events(log: Path) -> Iterator[dict[str, Any]]:
    with log.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _matches(row: dict[str, Any], step: int | None, where: EpisodeFilter) -> bool:
    reward = row["reward"] if row["reward"] is not None else 0.0
    return ((not where.env or row["env"] == where.env) and (not where.task_id or row["task_id"] == where.task_id)
            and (not where.verdict or row["verdict"] == where.verdict)
            and (not where.error_kind or f",{where.error_kind}," in row["error_kinds"])
            and (where.step is None or step == where.step)
            and (where.version is None or row["policy_version"] == where.version)
            and (where.masked is None or bool(row["masked"]) == where.masked)
            and (where.min_reward is None or reward >= where.min_reward)
            and (where.max_reward is None or reward <= where.max_reward)
            and (not where.search or where.search in (row["episode_id"] or "") or where.search in (row["task_id"] or "")))
