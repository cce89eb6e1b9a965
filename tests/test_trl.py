"""TRL's GRPOTrainer trains on awm: examples/trl_grpo.py as shipped (the tiny model of
examples/train-tiny.yaml on CPU, the ``lamps`` fixture environment on a real local fleet on the
session's PostgreSQL, TRL's own trainer and optimiser), its reward rising; and the pieces of
the rollout function on live instances (GRPO groups on group claims, masked episodes).

The learning task is that of tests/test_trainer_learn.py: ``green_on`` is complete when the
first tool call switches the green lamp on; a random policy gets it about one time in ten.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from awm import catalog as catalog_mod
from awm.fleet import Database, LocalFleet

from tests.conftest import FIXTURES, require

require(importlib.util.find_spec("trl") is not None, "trl is not installed (the trl extra)")

from awm.episode.sources import PoolSource  # noqa: E402
from awm.integrations.loop import BackgroundLoop  # noqa: E402
from awm.integrations.trl_env import (AwmRollout, awm_reward, prompt_task, task_dataset, task_prompt,  # noqa: E402
                                  to_sample)
from awm.trainer.policy import ReplayPolicy  # noqa: E402
from awm.trainer.rollout import TaskRef  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trl_grpo.py"


def mean(values):
    return sum(values) / len(values)


@pytest.mark.slow
def test_trl_grpo_example_raises_the_reward_of_the_tiny_model(admin_dsn, tmp_path):
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1")
    run = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "30", "--output-dir", str(tmp_path / "run"),
                          "--database-url", admin_dsn, "--json"], capture_output=True, text=True, env=env,
                         timeout=1200, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-4000:]
    (line,) = run.stdout.strip().splitlines()  # --json: the summary alone on stdout (TRL's logs on stderr)
    summary = json.loads(line)
    rewards = summary["reward"]
    start, end = mean(rewards[:3]), mean(rewards[-5:])
    print(f"\nTRL GRPOTrainer: reward steps 1-3 {start:.3f} -> steps 26-30 {end:.3f}; per step {rewards}")
    assert summary["steps"] == 30
    assert start < 0.25
    assert end >= start + 0.4 and end > 0.6
    # 30 steps x 2 groups x 8 samples, every group on one group claim of the fleet's 4 instances
    assert summary["episodes"] == 480 and summary["groups"] == 60 and summary["group_claims"] == [4]
    assert summary["masked"] == 0
    episodes = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    ends = [e for e in episodes if e["event"] == "end"]
    assert len(ends) == 480 and {e["task_id"] for e in ends} == {"green_on"}


def test_task_prompts_name_their_task():
    prompt = task_prompt("lamps", "green_on", "Switch on the green lamp.")
    assert prompt_task(prompt) == TaskRef("lamps", "green_on")
    assert prompt_task([{"role": "user", "content": prompt}]) == TaskRef("lamps", "green_on")
    with pytest.raises(ValueError, match="not an awm task prompt"):
        prompt_task("Switch on the green lamp.")
    assert awm_reward(["p", "p"], ["c", "c"], awm_reward=[1.0, None]) == [1.0, None]


@pytest.fixture(scope="module")
def fleet(admin_dsn):
    """3 lamps instances and 3 notes instances (whose hostile verifiers are served ungated), on
    the loop the rollouts use."""
    loop = BackgroundLoop("test-trl")
    bundles = catalog_mod.load(str(FIXTURES / "lamps")) + catalog_mod.load(str(FIXTURES / "notes"))
    local = LocalFleet(bundles, replicas=3, database=Database(admin_dsn), allow_ungated=True)
    loop.run(local.start())
    yield loop, local, bundles
    loop.run(local.stop())
    loop.stop()


def grpo_trainer(rollout, num_generations, output_dir):
    """A real GRPOTrainer around a tiny model, with ``rollout`` as its rollout_func."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from awm.trainer.tiny import TinySpec, build_model, build_tokenizer

    tokenizer = build_tokenizer(["switch on the lamp"], [])
    tokenizer.padding_side = "left"
    args = GRPOConfig(output_dir=str(output_dir), num_generations=num_generations, per_device_train_batch_size=num_generations,
                      max_steps=1, use_cpu=True, report_to="none", save_strategy="no")
    dataset = Dataset.from_list([{"prompt": task_prompt("lamps", "green_on", "Switch on the green lamp.")}])
    return GRPOTrainer(model=build_model(len(tokenizer), TinySpec()), reward_funcs=awm_reward, args=args,
                       processing_class=tokenizer, rollout_func=rollout, train_dataset=dataset)


def test_groups_run_on_group_claims_and_masked_episodes_reach_trl_as_none(fleet, tmp_path):
    """Replayed reference solutions (ReplayPolicy) on live instances: a batch of 2 prompts x 3
    samples is 2 group claims of 3 instances; a task whose verifier crashes is masked (None)."""
    loop, local, bundles = fleet
    pool = PoolSource.from_fleet(local)
    rollout = AwmRollout(pool, loop=loop, policy=lambda trainer: ReplayPolicy(bundles))
    trainer = grpo_trainer(rollout, 3, tmp_path / "trl")
    prompts = [p for p in task_dataset(bundles, [TaskRef("lamps", "green_on"), TaskRef("lamps", "blue_on")])["prompt"]
               for _ in range(3)]
    out = rollout(prompts, trainer)
    assert out["awm_reward"] == [1.0] * 6 and out["awm_verdict"] == ["complete"] * 6
    assert rollout.stats.groups == 2 and rollout.stats.group_claims == [3, 3]
    for ids, completion, mask, logprobs in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"],
                                                out["logprobs"]):
        assert ids and len(completion) == len(mask) == len(logprobs)
        assert mask[0] == 1 and 0 in mask  # the reply counts, the tool response after it does not
    crash = task_dataset(bundles, [TaskRef("notes", "kills_itself")])["prompt"][0]
    masked = rollout([crash, crash], trainer)
    assert masked["awm_reward"] == [None, None] and masked["awm_verdict"] == ["error", "error"]
    assert rollout.stats.masked == 2
    assert pool.free() == 6  # every instance went back


def test_an_episode_without_a_reply_is_one_masked_token():
    from awm.trainer.trajectory import Trajectory

    traj = Trajectory("e", "lamps", "green_on", "", "p", masked=True)
    assert to_sample(traj, eos_id=3) == ([3], [3], [0.0], [0])


def test_a_history_window_is_refused():
    from awm.trainer.agent import AgentConfig

    with pytest.raises(ValueError, match="history_window"):
        AwmRollout(PoolSource([]), agent=AgentConfig(history_window=2, max_turns=3))
    AwmRollout(PoolSource([]), agent=AgentConfig(history_window=2, max_turns=2))  # a window that never cuts
