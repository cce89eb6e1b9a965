"""The text adapters' episodes (verl, SkyRL) in awm's trajectory log, so that ``awm ui`` shows
them like awm's own runs: every reply, its tool calls with their results and error classes, the
verdict and the reward's parts.

The frameworks own the policy and the turns; an adapter hands each reply to
:meth:`awm.episode.session.EpisodeSession.act` and tells the :class:`EpisodeRecorder` what came
of it. The log is the JSONL of :class:`awm.trainer.trajectory.TrajectoryLog` (``start``, one
``turn`` per reply, ``end``), its policy named ``<framework>-policy``, which is how the UI
recognises the framework (awm.ui.runs). Enabled by a path in the adapter's settings
(``trajectories``): its directory is the run the UI lists.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from awm.episode.session import EpisodeSession, Outcome, TextStep
from awm.trainer.trajectory import Trajectory, TrajectoryLog, Turn

_logs: dict[Path, TrajectoryLog] = {}  # one open log per path in a process (SkyRL makes an env per sample)
_lock = threading.Lock()


def shared_log(path: str | Path) -> TrajectoryLog:
    """The process's log at ``path`` (appended to; its writes are thread-safe)."""
    key = Path(path).resolve()
    with _lock:
        if key not in _logs:
            _logs[key] = TrajectoryLog(key)
        return _logs[key]


class EpisodeRecorder:
    """One episode of a text adapter, written to ``log`` as it goes."""

    def __init__(self, log: TrajectoryLog, framework: str, session: EpisodeSession, policy_version: int = 0) -> None:
        self.log, self.session, self.policy_version = log, session, policy_version
        self.traj = Trajectory(episode_id=session.episode_id or uuid.uuid4().hex, env=session.env,
                               task_id=session.task_id or "", instruction=session.instruction,
                               policy=f"{framework}-policy", instance=session.instance, started_at=time.time())
        self.traj.timings["reset_ms"] = session.timings.get("reset_ms", 0.0)
        self._since = time.perf_counter()  # the policy's time of the next reply starts now
        log.start(self.traj)

    def reply(self, text: str, step: TextStep, tools_ms: float) -> None:
        """A reply of the policy and what the episode made of it (``tools_ms``: the time
        :meth:`EpisodeSession.act` took)."""
        now = time.perf_counter()
        turn = Turn(index=len(self.traj.turns), assistant={"role": "assistant", "content": text},
                    tool_calls=step.calls, results=step.results, source="text" if step.calls else "none",
                    policy_ms=round(max(0.0, (now - self._since) * 1000 - tools_ms), 3), tools_ms=round(tools_ms, 3),
                    policy_version=self.policy_version)
        self.traj.turns.append(turn)
        self.log.turn(self.traj, turn)
        self._since = now
        if step.done and not step.calls:
            self.traj.final_answer = text

    def end(self, outcome: Outcome) -> None:
        t = self.traj
        t.stop_reason, t.infra_error, t.pristine = outcome.ended_by, outcome.infra_error, self.session.pristine
        t.verdict, t.reward, t.masked = outcome.verdict, outcome.reward or 0.0, outcome.masked
        t.mask_reason, t.reward_components = outcome.mask_reason, dict(outcome.components)
        t.timings["verify_ms"] = self.session.timings.get("verify_ms", 0.0)
        self.log.end(t)


async def act(session: EpisodeSession, recorder: EpisodeRecorder | None, text: str) -> TextStep:
    """:meth:`EpisodeSession.act`, recorded when there is a recorder."""
    t0 = time.perf_counter()
    step = await session.act(text)
    if recorder is not None:
        recorder.reply(text, step, (time.perf_counter() - t0) * 1000)
    return step


def settings_log(settings: Any) -> TrajectoryLog | None:
    """The log an adapter's settings name (``trajectories``: a JSONL path), or None."""
    path = settings.get("trajectories") if settings is not None and hasattr(settings, "get") else None
    return shared_log(path) if path else None
