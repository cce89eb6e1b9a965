"""Trajectory records, and the JSONL log they stream to while episodes run.

Every episode writes a ``start`` line when it begins, one ``turn`` line per turn as soon as the
turn's tool calls have returned, and an ``end`` line with the whole record (messages, tool calls
and results, token ids where the policy gave them, verdict, reward, DB diff, timings). A crashed
run therefore leaves every finished turn on disk; :func:`read_trajectories` returns the finished
episodes (the ``end`` lines).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator


@dataclass
class Turn:
    index: int
    assistant: dict[str, Any]  # the message as it entered the history
    tool_calls: list[dict[str, Any]]  # parsed calls; malformed ones carry "malformed": true
    results: list[dict[str, Any]]  # {tool_call_id, name, is_error, error_kind, text, ms}
    source: str  # "native" | "text" | "none": where the calls were found
    policy_ms: float
    tools_ms: float
    policy_version: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    context_messages: int = 0  # how many messages the (windowed) prompt held


@dataclass
class Trajectory:
    episode_id: str
    env: str
    task_id: str
    instruction: str
    policy: str
    instance: str = ""
    group_id: str | None = None
    sample_index: int = 0
    policy_version: int = 0  # the oldest weights that produced any turn of this episode
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    final_answer: str | None = None
    stop_reason: str = ""  # answer | max_turns | context_exceeded | infra_error | policy_error
    infra_error: str | None = None
    pristine: bool | None = None
    verdict: dict[str, Any] = field(default_factory=dict)
    diff: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    masked: bool = False
    mask_reason: str | None = None
    reward_components: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    history_window: int | None = None
    started_at: float = 0.0
    # The tool definitions sent with every request (native format; None: text format). The
    # learner re-encodes a turn the server gave no token ids for with them, as the server did.
    tools: list[dict[str, Any]] | None = None

    @property
    def tool_calls(self) -> int:
        return sum(len(t.tool_calls) for t in self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t.completion_ids) if t.completion_ids is not None else t.completion_tokens for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        return cls(**data)


class TrajectoryLog:
    """Append-only JSONL, one line per event. Each line is one ``write(2)`` on a descriptor
    opened with ``O_APPEND``, so lines of several writers - threads, or the processes of verl's
    agent-loop workers sharing one file - never interleave on a local filesystem (NFS gives no
    such guarantee: give each process its own file there)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._lock = threading.Lock()

    def write(self, event: str, record: dict[str, Any]) -> None:
        line = (json.dumps({"event": event, **record}, ensure_ascii=False, default=str) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"trajectory log {self.path} is closed")
            written = os.write(self._fd, line)
            if written != len(line):  # a regular file writes all or fails (ENOSPC raises)
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")

    def start(self, traj: Trajectory) -> None:
        self.write("start", {"episode_id": traj.episode_id, "env": traj.env, "task_id": traj.task_id,
                             "instruction": traj.instruction, "policy": traj.policy, "instance": traj.instance,
                             "group_id": traj.group_id, "sample_index": traj.sample_index,
                             "started_at": traj.started_at})

    def turn(self, traj: Trajectory, turn: Turn) -> None:
        self.write("turn", {"episode_id": traj.episode_id, **asdict(turn)})

    def end(self, traj: Trajectory) -> None:
        self.write("end", traj.to_dict())

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __del__(self) -> None:  # a log nobody closed (an adapter's, shared for the process's life)
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)  # type: ignore[arg-type]


def read_events(path: Path | str) -> Iterator[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_trajectories(path: Path | str) -> list[Trajectory]:
    """The finished episodes of a log (its ``end`` lines)."""
    return [Trajectory.from_dict({k: v for k, v in e.items() if k != "event"})
            for e in read_events(path) if e.get("event") == "end"]
