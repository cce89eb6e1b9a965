"""Prompt formats and the pieces of the vLLM path that need no server: the tokenizer's chat
template (tools, thinking on/off, re-tokenising a turn), the AWM meta-tool format, early
termination on a format error, and truncated importance sampling in the GRPO loss."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from tests.tiny_qwen import MODEL_DIR, lamps_context
from awm.trainer import awm_format
from awm.episode.reward import RewardConfig, score
from awm.episode.toolcalls import MalformedCall, ToolCall, parse_text, strip_thinking



@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR, local_files_only=True)


def test_the_template_renders_tools_and_thinking(tokenizer) -> None:
    from awm.trainer.chatformat import TemplateFormat, chat_format

    system, _, tools, instructions = lamps_context()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": instructions[0]}]
    assert isinstance(chat_format(tokenizer), TemplateFormat)
    off = TemplateFormat(tokenizer, thinking=False).render_prompt(messages, tools)
    on = TemplateFormat(tokenizer, thinking=True).render_prompt(messages, tools)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and on.endswith("<|im_start|>assistant\n")
    assert off.startswith("<|im_start|>system\n" + system + "\n\n# Tools\n")
    assert '"name": "switch_on"' in on and "<tool_call>" in on
    assert "# Tools" not in TemplateFormat(tokenizer).render_prompt(messages, None)


def test_a_turn_is_retokenised_as_the_model_generated_it(tokenizer) -> None:
    from awm.trainer.chatformat import TemplateFormat

    fmt = TemplateFormat(tokenizer, thinking=False)
    system, _, tools, instructions = lamps_context()
    context = [{"role": "system", "content": system}, {"role": "user", "content": instructions[0]}]
    call = {"id": "c0", "type": "function", "function": {"name": "switch_on", "arguments": '{"color": "red"}'}}
    prompt, completion = fmt.turn(context, tools, {"role": "assistant", "content": "", "tool_calls": [call]})
    assert prompt == fmt.encode_prompt(context, tools)
    text = tokenizer.decode(completion)
    assert text == '<tool_call>\n{"name": "switch_on", "arguments": {"color": "red"}}\n</tool_call><|im_end|>'
    assert completion[-1] == tokenizer.eos_token_id


def test_a_tokenizer_without_a_template_falls_back_and_says_so(caplog) -> None:
    from awm.trainer import tiny
    from awm.trainer.chatformat import ChatFormat, chat_format

    with caplog.at_level(logging.WARNING, logger="awm.trainer.chatformat"):
        fmt = chat_format(tiny.build_tokenizer(["hello world"], []))
    assert isinstance(fmt, ChatFormat) and "not the model's own format" in caplog.text


def test_awm_meta_tools_resolve() -> None:
    (listing,) = parse_text('<tool_call>{"name": "list_tools", "arguments": {}}</tool_call>')
    assert awm_format.resolve(listing) == ("list", None)
    (call,) = parse_text(awm_format.render_call("switch_on", {"color": "green"}))
    kind, real = awm_format.resolve(call)
    assert kind == "call" and real == ToolCall(call.id, "switch_on", {"color": "green"})
    kind, real = awm_format.resolve(ToolCall("c", "mcp_tool_switch_on", {"color": "red"}))
    assert kind == "call" and real.name == "switch_on"
    assert awm_format.resolve(ToolCall("c", "switch_on", {})) == ("unknown", None)
    bad = awm_format.resolve(ToolCall("c", "call_tool", {"tool_name": "switch_on", "arguments": "{not json"}))
    assert isinstance(bad, MalformedCall) and "not JSON" in bad.error
    assert isinstance(awm_format.resolve(ToolCall("c", "call_tool", {"arguments": "{}"})), MalformedCall)
    text = awm_format.list_tools_text([{"name": "a", "description": " d ", "inputSchema": {"type": "object"}}])
    assert json.loads(text) == {"name": "a", "description": "d", "parameters": {"type": "object"}}


def test_thinking_is_not_acted_on() -> None:
    reply = '<think>\nmaybe <tool_call>{"name": "x"}</tool_call>\n</think>\n\nDone.'
    assert strip_thinking(reply) == "Done." and parse_text(strip_thinking(reply)) == []
    assert strip_thinking("<think>\nunfinished") == "" and strip_thinking("plain") == "plain"


def test_early_termination_is_scored_format_error() -> None:
    result = score({"verdict": "format_error"}, ["tool_error"], 3, None, RewardConfig(format_error=-1.0))
    assert result.reward == -1.0 and not result.masked
    assert score({"verdict": "complete"}, [], 0).reward == 1.0


def test_truncated_importance_weights_scale_each_tokens_policy_term() -> None:
    from awm.trainer.grpo import grpo_loss

    logp = torch.log(torch.tensor([[0.5, 0.5]], requires_grad=True))
    advantages = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    plain, _ = grpo_loss(logp, logp.detach(), advantages, mask)
    weighted, _ = grpo_loss(logp, logp.detach(), advantages, mask, token_weights=torch.tensor([[2.0, 0.5]]))
    assert math.isclose(float(plain), -1.0) and math.isclose(float(weighted), -(2.0 + 0.5) / 2)


def test_the_learner_logs_the_gap_and_truncates(tokenizer) -> None:
    """A batch whose sampling log-probs differ from the learner's: the gap is measured, tokens whose
    importance weight passes the cap are counted, and the step still trains."""
    from transformers import AutoModelForCausalLM

    from awm.trainer.config import GRPOConfig
    from awm.trainer.learner import Learner
    from awm.trainer.local_policy import SamplingSpec
    from awm.trainer.samples import Sequence

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, local_files_only=True, dtype=torch.float32)
    learner = Learner(model, GRPOConfig(lr=1e-4, tis_cap=2.0), SamplingSpec())
    ids = tokenizer.encode("<|im_start|>assistant\nDone.<|im_end|>", add_special_tokens=False)
    n = len(ids)
    gen = 3
    seqs = [Sequence(ids, [0] * (n - gen) + [1] * gen, [0.0] * (n - gen) + [-30.0] * gen, advantage=a,
                     episode_id=f"e{i}") for i, a in enumerate((1.0, -1.0))]
    stats = learner.step(seqs)
    assert stats["logprob_gap"] > 10 and stats["tis_truncated_fraction"] == 1.0
    assert stats["trained_tokens"] == 2 * gen and learner.version == 1
    # A step with nothing to train (every group scored alike) reports the same keys, empty: a
    # run's records keep one schema (a step-1 record without them failed the vLLM test in CI).
    empty = learner.step([])
    assert set(empty) == set(stats) and empty["logprob_gap"] is None and learner.version == 1


def test_the_vllm_example_loads_and_bad_vllm_settings_are_refused() -> None:
    from pathlib import Path

    from awm.trainer.config import PolicyConfig, TrainConfig

    cfg = TrainConfig.load(Path(__file__).parent.parent / "examples" / "train-vllm.yaml")
    assert cfg.policy.kind == "vllm" and Path(cfg.policy.path, "config.json").exists()
    assert cfg.policy.lora.rank == 8 and cfg.grpo.tis_cap == 2.0
    with pytest.raises(ValueError, match="learner.distributed needs policy.kind vllm"):
        TrainConfig.from_dict({"learner": {"distributed": True}})  # a sharded model cannot sample alone
    with pytest.raises(ValueError, match="learner.backend"):
        TrainConfig.from_dict({"learner": {"backend": "mpi"}})
    for bad, words in (({"kind": "vllm", "base_url": "http://x/v1"}, "policy.path"),
                       ({"kind": "vllm", "path": "m"}, "base_url"),
                       ({"kind": "vllm", "path": "m", "base_url": "u", "weight_sync": "nccl"}, "weight_sync")):
        with pytest.raises(ValueError, match=words):
            PolicyConfig.from_dict(bad)


def test_the_catalog_scale_example_loads() -> None:
    """examples/train-catalog-1000.yaml: 16 late-binding instances over a catalog built next to
    the repository (run as its comment says; measured in docs/benchmarks.md)."""
    from pathlib import Path

    from awm.trainer.config import TrainConfig

    cfg = TrainConfig.load(Path(__file__).parent.parent / "examples" / "train-catalog-1000.yaml")
    assert cfg.instances == 16 and cfg.allow_ungated and cfg.mode == "sync"
    assert cfg.catalog.endswith("catalogs/varied-1000")  # resolved against the file once it is built
