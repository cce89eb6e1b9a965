"""awm as a SkyRL environment: a ``skyrl_gym`` ``BaseTextEnv`` whose episodes run on awm instances.

SkyRL's generator builds one environment object per sample (``skyrl_gym.make("awm",
env_config=..., extras=row)``), calls ``init(prompt)`` once and ``step(reply)`` after every
reply of the policy, until ``done``. Here:

* ``init`` claims an instance of the row's environment (``extras["env"]``; the fleet named by
  ``env_config``: :func:`awm.episode.sources.source_from_config`), resets it to the row's
  task (``extras["task_id"]``) and returns the prompt: a system message with the tools and the
  call format (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), then the task's
  instruction;
* ``step`` runs the reply's tool calls through MCP and answers with their results (as one user
  message of ``<tool_response>`` blocks); a reply without a call is the final answer, and the
  episode ends with awm's verdict and reward (also after ``max_turns`` replies or
  ``max_steps`` tool calls, verified without an answer);
* the instance goes back when the episode ends (or ``close``);
* with ``env_config["trajectories"]`` (a JSONL path) every episode is written to awm's trajectory
  log there (:mod:`awm.integrations.episode_log`): ``awm ui --runs <its directory>`` shows it.

SkyRL's reward is a float: an episode that failed through the environment's fault gets 0.0 with
``metadata["masked"] = True`` (and counts in :meth:`get_metrics`' ``masked``) - filter those
samples in your trainer if they matter; awm's own trainer and TRL leave them out entirely.

SkyRL calls ``step`` synchronously (from its worker threads): the episode itself runs on the
process's integration loop (:mod:`awm.integrations.loop`).
"""

from __future__ import annotations

from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from awm.episode import toolcalls
from awm.episode.reward import RewardConfig
from awm.episode.session import EpisodeSession, Outcome
from awm.episode.sources import Lease, source_from_config
from awm.integrations.episode_log import EpisodeRecorder, act, settings_log
from awm.integrations.loop import shared_loop
from awm.trainer.agent import DEFAULT_SYSTEM

ENV_ID = "awm"


def register() -> None:
    """Make ``skyrl_gym.make("awm", ...)`` build :class:`AwmTextEnv` (idempotent)."""
    from skyrl_gym.envs.registration import register as skyrl_register, registry

    if ENV_ID not in registry:
        skyrl_register(id=ENV_ID, entry_point="awm.integrations.skyrl_env:AwmTextEnv")


def _get(mapping: Any, key: str, default: Any = None) -> Any:
    return mapping.get(key, default) if mapping is not None and hasattr(mapping, "get") else default


class AwmTextEnv(BaseTextEnv):
    """One awm episode as a SkyRL text environment (see the module's docstring).

    ``env_config``: ``instances_file`` or ``operator`` (where instances are), optionally
    ``max_turns``, ``max_steps``, ``reward`` (awm's reward map, docs/training.md),
    ``trajectories`` (a JSONL path: the episodes for ``awm ui``). ``extras`` (the
    dataset row): ``env`` and ``task_id`` (top level or under ``extra_info``), optionally ``max_turns``.
    """

    def __init__(self, env_config: Any = None, extras: dict[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        info = _get(extras, "extra_info") or {}
        self.env_name = _get(extras, "env") or _get(info, "env")
        self.task_id = _get(extras, "task_id") or _get(info, "task_id")
        if not self.env_name:
            raise ValueError("an awm sample names its environment: extras['env'] (or extra_info.env)")
        self.env_config = env_config or {}
        self.max_turns = int(_get(extras, "max_turns") or _get(self.env_config, "max_turns") or 10)
        reward = _get(self.env_config, "reward")
        self.reward_cfg = RewardConfig.from_dict(dict(reward.items()) if reward is not None else None)
        self.max_steps = int(_get(self.env_config, "max_steps") or 30)
        self.loop = shared_loop()
        self.lease: Lease | None = None
        self.episode: EpisodeSession | None = None
        self.outcome: Outcome | None = None
        self.log = settings_log(self.env_config)
        self.recorder: EpisodeRecorder | None = None

    def init(self, prompt: Any = None) -> tuple[list[dict[str, str]], dict[str, Any]]:
        self.loop.run(self._start())
        assert self.episode is not None
        system = DEFAULT_SYSTEM + "\n\n" + toolcalls.text_tools_prompt(self.episode.tools)
        messages = [{"role": "system", "content": system}, {"role": "user", "content": self.episode.instruction}]
        return messages, {"env": self.env_name, "task_id": self.episode.task_id, "instance": self.episode.instance}

    async def _start(self) -> None:
        self.lease = await source_from_config(self.env_config).claim(self.env_name)
        assert self.lease.handle is not None
        self.episode = EpisodeSession(self.lease.handle, self.reward_cfg, self.max_steps)
        try:
            await self.episode.reset(self.task_id)
        except BaseException:
            await self._release()
            raise
        if self.log is not None:
            self.recorder = EpisodeRecorder(self.log, "skyrl", self.episode)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        if self.episode is None:
            raise RuntimeError("no episode: init first (or it has ended)")
        self.turns += 1
        result = self.loop.run(self._step(action))
        if result.done:
            outcome = result.outcome
            assert outcome is not None
            self.outcome = outcome
            return BaseTextEnvStepOutput(observations=[], reward=outcome.reward or 0.0, done=True, metadata={
                "masked": outcome.masked, "mask_reason": outcome.mask_reason, "verdict": outcome.verdict,
                "ended_by": outcome.ended_by, "reward_components": outcome.components})
        return BaseTextEnvStepOutput(observations=[{"role": "user", "content": result.observation}], reward=0.0,
                                     done=False, metadata={"tool_calls": self.episode.steps})

    async def _step(self, action: str) -> Any:
        assert self.episode is not None
        result = await act(self.episode, self.recorder, action)
        if not result.done and self.turns >= self.max_turns:
            result.done, result.outcome = True, await self.episode.finish(None, f"{self.max_turns} turns")
        if result.done:
            if self.recorder is not None and result.outcome is not None:
                self.recorder.end(result.outcome)
            await self._release()
        return result

    async def _release(self) -> None:
        lease, episode = self.lease, self.episode
        self.lease = self.episode = None
        if lease is not None:
            await source_from_config(self.env_config).release(lease, healthy=episode is None or episode.healthy)

    def close(self) -> None:
        if self.episode is not None:
            self.loop.run(self._release())

    def get_metrics(self) -> dict[str, Any]:
        if self.outcome is None:
            return {}
        return {"reward": self.outcome.reward or 0.0, "masked": float(self.outcome.masked),
                "complete": float(self.outcome.verdict.get("verdict") == "complete"), "turns": self.turns}
