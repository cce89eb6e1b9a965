"""awm as the environment of TRL's ``GRPOTrainer`` (its ``rollout_func`` integration).

TRL (>= 1.x) lets a ``rollout_func(prompts, trainer)`` produce the completions of a batch itself.
:class:`AwmRollout` is one: every prompt names an awm task, and the ``num_generations`` copies
of a prompt that TRL's sampler puts next to each other are *one GRPO group*: one group claim of
instances of the task's environment (an :class:`awm.episode.sources.InstanceSource` - a local
fleet's pool or the operator's allocation API), reset to the same snapshot, each sample one episode of awm's own
agent loop (:func:`awm.trainer.agent.run_episode`: multi-turn, tool calls over MCP, the verifier's
verdict, :mod:`awm.episode.reward`). The policy is the model TRL trains, sampled in process
(:class:`awm.trainer.local_policy.LocalPolicy` sharing its weights), or any awm policy you pass.

What TRL gets back, per sample (one row of the batch):

* ``prompt_ids`` - the episode's first prompt (system, tools, instruction, as the policy saw it);
* ``completion_ids`` - everything after it: the policy's replies *and* the tool responses in
  between, with ``env_mask`` 1 on generated tokens and 0 on tool output (TRL masks those out of
  the loss);
* ``awm_reward`` - the episode's reward, or None when it is masked (an environment failure):
  :func:`awm_reward` hands it to TRL, which leaves a None out of the group baseline and gives the
  sample advantage 0, exactly awm's own masking.

The prompt of a task is ``"[awm:<env>/<task_id>] <instruction>"`` (:func:`task_dataset` builds
the dataset), so TRL's logs show the instruction and the rollout knows the task.
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from awm.episode.reward import RewardConfig
from awm.episode.sources import InstanceSource
from awm.integrations.loop import BackgroundLoop, shared_loop
from awm.trainer.agent import AgentConfig, run_episode
from awm.trainer.local_policy import LocalPolicy, SamplingSpec
from awm.trainer.policy import Policy
from awm.trainer.rollout import TaskRef
from awm.trainer.chatformat import chat_format
from awm.trainer.samples import episode_sequences, turn_tokens
from awm.trainer.trajectory import Trajectory, TrajectoryLog

_PROMPT = re.compile(r"^\[awm:([^/\]]+)/([^\]]+)\]")


def task_prompt(env: str, task_id: str, instruction: str) -> str:
    return f"[awm:{env}/{task_id}] {instruction}"


def prompt_task(prompt: Any) -> TaskRef:
    """The task a dataset prompt names (a string, or a conversation whose last message does)."""
    text = prompt if isinstance(prompt, str) else (prompt[-1].get("content") if prompt else "")
    match = _PROMPT.match(text if isinstance(text, str) else "")
    if match is None:
        raise ValueError(f"not an awm task prompt (expected '[awm:<env>/<task_id>] ...'): {str(prompt)[:120]!r}")
    return TaskRef(match.group(1), match.group(2))


def task_dataset(bundles: list[Any], tasks: list[TaskRef], repeat: int = 1) -> Any:
    """A ``datasets.Dataset`` with one row per task (``repeat`` times): ``prompt``, ``env``, ``task_id``."""
    from datasets import Dataset

    instructions = {(b.name, t.id): t.instruction for b in bundles for t in b.tasks}
    rows = [{"prompt": task_prompt(t.env, t.task_id, instructions[(t.env, t.task_id)]), "env": t.env,
             "task_id": t.task_id} for t in tasks] * repeat
    return Dataset.from_list(rows)


def awm_reward(prompts: list[Any], completions: list[Any], awm_reward: list[float | None] | None = None,
               **kwargs: Any) -> list[float | None]:
    """The reward function to give ``GRPOTrainer``: awm's reward of each episode (None: masked)."""
    if awm_reward is None:
        raise ValueError("awm_reward needs the rollout_func AwmRollout (no awm_reward field in the batch)")
    return list(awm_reward)


@dataclass
class RolloutStats:
    """What the rollouts of a run did (the reward itself is in TRL's logs)."""

    groups: int = 0
    episodes: int = 0
    masked: int = 0
    complete: int = 0
    group_claims: list[int] = field(default_factory=list)  # instances per group claim


class AwmRollout:
    """``rollout_func`` for ``GRPOTrainer``: each run of identical prompts is a GRPO group on a
    group claim of instances. ``instances`` must live on ``loop`` (build it there)."""

    def __init__(self, instances: InstanceSource, *, loop: BackgroundLoop | None = None,
                 agent: AgentConfig | None = None, reward: RewardConfig | None = None,
                 sampling: SamplingSpec | None = None, policy: Callable[[Any], Policy] | None = None,
                 scenarios: dict[str, str] | None = None, log: TrajectoryLog | None = None, seed: int = 0) -> None:
        self.instances = instances
        self.loop = loop or shared_loop()
        self.agent = agent or AgentConfig()
        if self.agent.history_window and self.agent.history_window < self.agent.max_turns:
            # TRL trains one sequence per sample: every turn must extend the one before it
            raise ValueError("AwmRollout needs the whole episode in one sequence: agent.history_window unset "
                             "or at least max_turns")
        self.reward = reward or RewardConfig()
        self.sampling = sampling or SamplingSpec()
        self.make_policy = policy
        self.scenarios = dict(scenarios or {})
        self.log = log
        self.seed = seed
        self.stats = RolloutStats()
        self._policy: Any = None
        self._format: Any = None  # the chat format, for policies that return no token ids

    def policy_for(self, trainer: Any) -> Policy:
        """The policy sampling this batch: the trainer's own model (weights shared), version = step."""
        if self._policy is None:
            if self.make_policy is not None:
                self._policy = self.make_policy(trainer)
            else:
                model = trainer.accelerator.unwrap_model(trainer.model)
                self._policy = LocalPolicy(model, trainer.processing_class, self.sampling, name="trl-policy",
                                           seed=self.seed, share=True)
        self._policy.version = int(trainer.state.global_step)
        return self._policy

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        policy = self.policy_for(trainer)
        groups: list[tuple[TaskRef, int]] = []  # consecutive identical prompts: one GRPO group
        for prompt in prompts:
            task = prompt_task(prompt)
            if groups and groups[-1][0] == task and groups[-1][1] < trainer.num_generations:
                groups[-1] = (task, groups[-1][1] + 1)
            else:
                groups.append((task, 1))
        results = self.loop.run(self._run(policy, groups))
        eos = trainer.processing_class.eos_token_id
        if self._format is None and self.make_policy is not None:
            self._format = chat_format(trainer.processing_class)
        out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [],
                                     "awm_reward": [], "awm_verdict": []}
        for traj in (t for group in results for t in group):
            prompt_ids, completion_ids, logprobs, mask = to_sample(traj, eos, self._format)
            out["prompt_ids"].append(prompt_ids)
            out["completion_ids"].append(completion_ids)
            out["logprobs"].append(logprobs)
            out["env_mask"].append(mask)
            out["awm_reward"].append(None if traj.masked else traj.reward)
            out["awm_verdict"].append(traj.verdict.get("verdict"))
            self.stats.episodes += 1
            self.stats.masked += traj.masked
            self.stats.complete += traj.verdict.get("verdict") == "complete"
        return out

    async def _run(self, policy: Policy, groups: list[tuple[TaskRef, int]]) -> list[list[Trajectory]]:
        return list(await asyncio.gather(*(self._group(policy, task, n) for task, n in groups)))

    async def _group(self, policy: Policy, task: TaskRef, n: int) -> list[Trajectory]:
        """``n`` episodes of ``task`` on one group claim; with fewer instances than samples the
        instances take the samples in turns."""
        group_id = uuid.uuid4().hex[:12]
        leases = await self.instances.claim_group(task.env, n)
        self.stats.groups += 1
        self.stats.group_claims.append(len(leases))
        healthy = False
        try:
            for lease in leases:
                assert lease.handle is not None
                lease.handle.scenario = lease.handle.scenario or self.scenarios.get(lease.env, "")

            async def lane(j: int) -> list[Trajectory]:
                handle = leases[j].handle
                assert handle is not None
                return [await run_episode(policy, handle, task.task_id, self.agent, self.reward, self.log,
                                          group_id, i) for i in range(j, n, len(leases))]

            lanes = await asyncio.gather(*(lane(j) for j in range(len(leases))))
            healthy = all(t.infra_error is None for lane_ in lanes for t in lane_)
        finally:
            await self.instances.release(leases, healthy=healthy)
        return sorted((t for lane_ in lanes for t in lane_), key=lambda t: t.sample_index)


def to_sample(traj: Trajectory, eos_id: int, fmt: Any = None) -> tuple[list[int], list[int], list[float], list[int]]:
    """(prompt ids, completion ids, sampling log-probs, env mask) of one episode for TRL: the first
    prompt, then every reply and tool response after it (turns without token ids are encoded
    with ``fmt``, as :mod:`awm.trainer.samples` does). An episode in which the policy never spoke
    (its reset failed: masked) becomes one masked end-of-turn token."""
    sequences = episode_sequences(traj, fmt)
    if not sequences:
        return [eos_id], [eos_id], [0.0], [0]
    if len(sequences) > 1:
        raise ValueError(f"episode {traj.episode_id} is not one sequence (a history window cut it)")
    (seq,) = sequences
    first = next(tokens for turn in traj.turns if (tokens := turn_tokens(traj, turn, fmt)) and tokens[1])
    p = len(first[0])
    logprobs = [0.0 if math.isnan(x) else x for x in seq.old_logprobs[p:]]
    return seq.input_ids[:p], seq.input_ids[p:], logprobs, seq.loss_mask[p:]
