"""The supervised warm start (trainer/warmstart.py) on a real fleet and Postgres: demonstrations
are the reference solutions played through the agent loop, the loss reads only the assistant's
tokens, and - with the real model (SmolLM2-135M-Instruct, tests/real_model.py) - one
demonstration teaches a model that answered in prose to call a tool, on a task it was not shown.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import real_model
from tests.conftest import require

FIXTURES = Path(__file__).parent / "fixtures"


def _source(bundles, admin_dsn):
    from awm.episode.sources import LocalFleetSource
    from awm.fleet import Database

    return LocalFleetSource(bundles, replicas=1, database=Database(admin_dsn), allow_ungated=True, instances=2)


async def _demonstrations(admin_dsn, tasks=None, tool_format="native", envs=("lamps",)):
    from awm.authoring import compile_source_dir
    from awm.trainer import warmstart as ws
    from awm.trainer.agent import AgentConfig

    bundles = [compile_source_dir(FIXTURES / env) for env in envs]
    chosen, skipped = ws.demonstration_tasks(bundles, tasks, allow_ungated=True)
    agent = AgentConfig(max_turns=5, call_diff_rows=0, tool_format=tool_format)
    async with _source(bundles, admin_dsn) as source:
        demos = await ws.demonstrations(source, bundles, chosen, agent)
    return bundles, chosen, skipped, demos


async def test_demonstrations_are_replayed_solutions_and_only_the_assistant_is_trained(admin_dsn):
    from transformers import AutoTokenizer

    from awm.trainer import warmstart as ws
    from awm.trainer.chatformat import chat_format

    bundles, chosen, skipped, demos = await _demonstrations(admin_dsn)
    assert [t.task_id for t in chosen] == ["green_on", "blue_on"] and not skipped and not demos.skipped
    for traj in demos.trajectories:  # each a complete episode: the reference call, its result, an answer
        assert traj.verdict["verdict"] == "complete"
        roles = [m["role"] for m in traj.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant"], roles
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "tiny-qwen")
    seqs = ws.sequences(demos.trajectories, chat_format(tokenizer))
    trained = [tokenizer.decode([i for i, m in zip(s.input_ids, s.loss_mask) if m]) for s in seqs]
    context = [tokenizer.decode([i for i, m in zip(s.input_ids, s.loss_mask) if not m]) for s in seqs]
    text = "".join(trained)
    assert '"color": "green"' in text and '"color": "blue"' in text and "Done." in text
    assert "Switch on" not in text and "<tool_response>" not in text  # instructions and results are context
    assert any("Switch on the green lamp" in c for c in context)


@pytest.mark.parametrize("tool_format", ["text", "awm"])
async def test_demonstrations_in_the_text_and_awm_formats_over_two_environments(admin_dsn, tool_format):
    """The demonstrations are written as the policy must write its calls: text ``<tool_call>``
    blocks, or the AWM meta-tools (``list_tools`` once, then ``call_tool``), executed by the
    same agent loop and verified complete, over two environments at once; what is trained is
    exactly those calls and the answers."""
    from transformers import AutoTokenizer

    from awm.trainer import warmstart as ws
    from awm.trainer.chatformat import chat_format

    tasks = ["green_on", "add_note", "count_notes"]
    bundles, chosen, skipped, demos = await _demonstrations(admin_dsn, tasks, tool_format, ("lamps", "notes"))
    assert sorted(f"{t.env}/{t.task_id}" for t in chosen) == ["lamps/green_on", "notes/add_note", "notes/count_notes"]
    assert not demos.skipped and len(demos.trajectories) == 3
    for traj in demos.trajectories:
        assert traj.verdict["verdict"] == "complete", (traj.task_id, traj.verdict)
        assert traj.tools is None  # no tools parameter: the calls are the reply's text
        calls = [c for turn in traj.turns for c in turn.tool_calls]
        assert calls and not any(c.get("malformed") for c in calls)
        if tool_format == "awm":
            assert traj.turns[0].results[0]["name"] == "list_tools"
            assert all(c.get("via") == "call_tool" for turn in traj.turns[1:] for c in turn.tool_calls)
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "tiny-qwen")
    trained = "".join(tokenizer.decode([i for i, m in zip(s.input_ids, s.loss_mask) if m])
                      for s in ws.sequences(demos.trajectories, chat_format(tokenizer)))
    assert "You have 3 notes." in trained and "<tool_response>" not in trained
    if tool_format == "text":
        assert '<tool_call>{"name": "switch_on", "arguments": {"color": "green"}}</tool_call>' in trained
    else:
        assert '{"name": "list_tools", "arguments": {}}' in trained and '"name": "call_tool"' in trained
        assert '"tool_name": "switch_on"' in trained


async def test_a_warm_start_trains_and_writes_a_model_that_loads(admin_dsn, tmp_path):
    from transformers import AutoModelForCausalLM

    from awm.trainer import warmstart as ws
    from awm.trainer.agent import AgentConfig

    bundles, chosen, skipped, demos = await _demonstrations(admin_dsn, ["green_on"])
    out = tmp_path / "warm"
    record = ws.fine_tune(demos, chosen, AgentConfig(max_turns=4, call_diff_rows=0), FIXTURES / "tiny-qwen", out,
                          ws.WarmStartConfig(epochs=6, lr=3e-3, lora_rank=4))
    assert record["demonstrations"] == ["lamps/green_on"] and record["trained_tokens"] > 0
    assert len(record["losses"]) == 6 and record["losses"][-1] < record["losses"][0]
    assert json.loads((out / "warmstart.json").read_text())["losses"] == record["losses"]
    assert not (tmp_path / "warm.partial").exists()
    model = AutoModelForCausalLM.from_pretrained(out)  # the LoRA is merged: a plain model
    assert not any("lora" in name for name, _ in model.named_parameters())
    # a directory that is not a warm start's, or the base model itself, is never replaced
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    for target in (tmp_path / "mine", FIXTURES / "tiny-qwen"):
        with pytest.raises(ValueError, match="--out"):
            ws.fine_tune(demos, chosen, AgentConfig(max_turns=4), FIXTURES / "tiny-qwen", target, ws.WarmStartConfig())
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match="not a model directory"):
        ws.fine_tune(demos, chosen, AgentConfig(max_turns=4), tmp_path / "mine", tmp_path / "w2", ws.WarmStartConfig())


def test_a_bad_warm_start_config_is_refused():
    from awm.trainer.warmstart import WarmStartConfig

    for bad in ({"epochs": 0}, {"lora_rank": -1}, {"lr": 0.0}, {"batch_size": 0}):
        with pytest.raises(ValueError, match="warm start"):
            WarmStartConfig(**bad)


@pytest.mark.slow
@pytest.mark.timeout(1200)
async def test_one_demonstration_teaches_the_real_model_to_call_on_a_task_it_was_not_shown(admin_dsn, tmp_path):
    """Measured first by hand (docs/benchmarks.md): SmolLM2-135M answers the lamps tasks in prose;
    after 4 LoRA steps on blue_on's one demonstration it calls switch_on with the colour of the
    held-out green_on, greedy and unguided."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from awm.episode.toolcalls import ToolCall, parse_text
    from awm.trainer import warmstart as ws
    from awm.trainer.agent import AgentConfig

    if not real_model.installed():
        try:
            real_model.install()
        except Exception as exc:  # noqa: BLE001 - reported by require
            require(False, f"the real model could not be built: {str(exc)[-2000:]}")
    require(real_model.installed(), f"the real model is not built in {real_model.cache_dir()} (python tests/real_model.py)")
    base = real_model.model_dir()
    template = base / "tool_chat_template.jinja"
    bundles, _, _, demos = await _demonstrations(admin_dsn)
    held_out = next(t for t in demos.trajectories if t.task_id == "green_on")
    taught = ws.Demonstrations([t for t in demos.trajectories if t.task_id == "blue_on"])
    out = tmp_path / "smollm2-warm"
    record = ws.fine_tune(taught, [], AgentConfig(max_turns=4, call_diff_rows=0), base, out,
                          ws.WarmStartConfig(epochs=4, lr=5e-4), chat_template=template)
    assert record["demonstrations"] == ["lamps/blue_on"]

    def reply(model_dir: Path) -> str:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = template.read_text()
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        prompt = tokenizer.apply_chat_template(held_out.messages[:2], tools=held_out.tools, tokenize=False,
                                               add_generation_prompt=True)
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            generated = model.generate(**ids, max_new_tokens=48, do_sample=False)
        return tokenizer.decode(generated[0][ids["input_ids"].shape[1]:], skip_special_tokens=True)

    before, after = reply(base), reply(out)
    assert not [c for c in parse_text(before) if isinstance(c, ToolCall)], before  # prose, or nothing parseable
    assert parse_text(after) == [ToolCall("call_0", "switch_on", {"color": "green"})], after
