"""awm as a verl agent loop: ``AwmAgentLoop`` (registered as ``awm_agent``), one awm episode per
sample of a verl rollout.

verl's ``ToolAgentLoop`` calls a ``BaseTool``'s ``create``/``execute``/``release`` around every
single tool call, and takes rewards from a separate reward function: it has no place for what an
awm episode is - an instance held from reset to verdict, and a reward that is the verifier's
verdict on the instance's final state. So the integration is an agent loop
(``verl.experimental.agent_loop.AgentLoopBase``), which owns the whole episode:

* the dataset row's ``extra_info`` names the environment and task (``env``, ``task_id``);
* the loop claims an instance (:func:`awm.episode.sources.source_from_config` with the
  ``awm`` settings of the agent-loop config: an ``awm serve --json`` file, or the operator's
  allocation API), resets it and builds the prompt (tools and the ``<tool_call>`` format in the
  system message, the task's instruction) with verl's own tokenization (Continuous Token);
* each turn the rollout server generates, the reply's tool calls run through MCP
  (:meth:`awm.episode.session.EpisodeSession.act`), the results come back as a user message whose
  tokens are masked out of the loss (``response_mask`` 0);
* a reply without a call ends the episode: awm's verdict and reward become ``reward_score``;
* with ``trajectories`` (a JSONL path) in the ``awm`` settings every episode is written to awm's
  trajectory log there (:mod:`awm.integrations.episode_log`): ``awm ui`` shows it.
  An episode that failed through the environment's fault is *masked*: its ``response_mask`` is
  all 0 (no gradient) and ``extra_fields["awm_masked"]`` is True; its reward (0.0) still enters
  the GRPO group's mean, as verl has no per-sample exclusion from the baseline.

With an ``instances_file`` every agent-loop worker process would hand out the same instances:
use one worker (``actor_rollout_ref.rollout.agent.num_workers=1``) or the operator, whose claims
are global.
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from awm import settings
from awm.episode import toolcalls
from awm.episode.reward import RewardConfig
from awm.episode.session import EpisodeSession, Outcome
from awm.episode.sources import source_from_config
from awm.integrations.episode_log import EpisodeRecorder, act, settings_log
from awm.trainer.agent import DEFAULT_SYSTEM


def _settings(awm: Any) -> dict[str, Any]:
    """The ``awm`` block of the agent-loop config, or ``AWM_INSTANCES_FILE`` / a Campaign Job's
    operator settings from the environment."""
    if awm:
        return {k: v for k, v in (awm.items() if hasattr(awm, "items") else dict(awm).items())}
    if settings.AWM_INSTANCES_FILE:
        return {"instances_file": settings.AWM_INSTANCES_FILE}
    return {"operator": {"environments": settings.AWM_ENVIRONMENTS}}


@register("awm_agent")
class AwmAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, awm: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.awm = _settings(awm)
        self.response_length = int(self.rollout_config.response_length)
        self.max_turns = int(self.awm.get("max_turns", 10))
        self.max_steps = int(self.awm.get("max_steps", 30))
        reward = self.awm.get("reward")
        self.reward = RewardConfig.from_dict(dict(reward.items()) if reward is not None else None)
        self.log = settings_log(self.awm)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        info = kwargs.get("extra_info") or {}
        if not info.get("env"):
            raise ValueError("an awm sample names its environment and task: extra_info.env, extra_info.task_id")
        source = source_from_config(self.awm)
        lease = await source.claim(info["env"])
        assert lease.handle is not None
        episode = EpisodeSession(lease.handle, self.reward, self.max_steps)
        try:
            return await self._episode(episode, info.get("task_id"), sampling_params)
        finally:
            await source.release(lease, healthy=episode.healthy)

    async def _episode(self, episode: EpisodeSession, task_id: str | None,
                       sampling_params: dict[str, Any]) -> AgentLoopOutput:
        try:
            await episode.reset(task_id)
        except Exception as exc:  # noqa: BLE001 - the environment's failure: a masked sample
            outcome = await episode.abort(f"reset failed: {type(exc).__name__}: {exc}")
            if self.log is not None:
                EpisodeRecorder(self.log, "verl", episode).end(outcome)
            ids = self.tokenizer.encode("") or [self.tokenizer.eos_token_id]
            return self._output(ids, [self.tokenizer.eos_token_id], [0], None, outcome, 0)
        recorder = EpisodeRecorder(self.log, "verl", episode) if self.log is not None else None
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + toolcalls.text_tools_prompt(episode.tools)},
            {"role": "user", "content": episode.instruction}]
        runtime = await self.ct_build_initial_tokens(messages)
        prompt_len = len(runtime)
        mask: list[int] = []
        logprobs: list[float] | None = None
        turns = 0
        while episode.outcome is None:
            turns += 1
            out = await self.server_manager.generate(request_id=uuid4().hex, prompt_ids=runtime,
                                                     sampling_params=sampling_params)
            if logprobs is None and out.log_probs and not mask:  # the server returns log-probs
                logprobs = []
            merged, mask, logprobs = await self.ct_merge_assistant_token(
                runtime, out.token_ids, mask, logprobs, assistant_logprobs=out.log_probs or None)
            runtime = merged.token_ids
            reply = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": reply})
            step = await act(episode, recorder, reply)
            if step.done:
                break
            if turns >= self.max_turns or len(mask) >= self.response_length:
                await episode.finish(None, f"{turns} turns" if turns >= self.max_turns else "response length")
                break
            previous = list(messages)
            messages.append({"role": "user", "content": step.observation})
            merged, mask, logprobs = await self.ct_merge_context_msg(previous, messages, runtime, mask, logprobs)
            runtime = merged.token_ids
        assert episode.outcome is not None
        if recorder is not None:
            recorder.end(episode.outcome)
        prompt_len = len(runtime) - len(mask)
        return self._output(runtime[:prompt_len], runtime[prompt_len:], mask, logprobs, episode.outcome,
                            len(messages))

    def _output(self, prompt_ids: list[int], response_ids: list[int], mask: list[int], logprobs: list[float] | None,
                outcome: Outcome, num_turns: int) -> AgentLoopOutput:
        n = self.response_length
        if outcome.masked:  # the environment failed the episode: nothing of it is trained on
            mask = [0] * len(mask)
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=response_ids[:n], response_mask=mask[:n],
            response_logprobs=logprobs[:n] if logprobs else None, reward_score=outcome.reward or 0.0,
            num_turns=num_turns, metrics={},
            extra_fields={"awm_masked": outcome.masked, "awm_verdict": outcome.verdict.get("verdict"),
                          "awm_mask_reason": outcome.mask_reason, "awm_ended_by": outcome.ended_by})
