"""Builds the tiny Qwen3-architecture model the vLLM tests serve (nothing downloaded), and a LoRA
adapter for it. The outputs are committed (well under 1 MB); run this script to regenerate them:

    PYTHONPATH=. python tests/tiny_qwen.py      # -> tests/fixtures/tiny-qwen, tiny-qwen-lora

* Tokenizer: byte-level BPE trained here on the texts the tests render, with Qwen's special
  tokens (``<|im_start|>``, ``<|im_end|>`` as end of turn) and its added tokens (``<tool_call>``,
  ``</tool_call>``, ``<think>``, ... single tokens, as vLLM's ``hermes`` tool parser expects), and
  a Qwen3-style chat template (``fixtures/tiny_qwen_template.jinja``: tools, thinking on/off).
* Model: ``Qwen3ForCausalLM`` (hidden 64, 2 layers, 2 heads of 32, 1 KV head; vLLM's CPU attention
  needs a head size of at least 32), float32, embeddings *not* tied to the output layer: vLLM's
  CPU build (0.32) leaves a tied output layer stale after ``reload_weights`` (measured: the
  reloaded server's log-probs then differ from the learner's), so full-weight sync is tested on
  an untied model.
* Warm start: random weights write noise, and a noise-writer never produces a parseable call,
  so there is nothing for RL to reinforce. The model is first trained (a few hundred steps,
  seconds) on canned episodes of the ``lamps`` environment as the agent renders them - native
  tools with thinking off and on, and the AWM format - where the first call switches on a lamp of
  a *uniformly random* colour and the reply after the result is ``Done.``. A GRPO run on
  ``green_on`` thus starts at about a quarter of episodes complete and has a colour to learn.
* Adapter: a peft LoRA (rank 8) trained to always pick ``blue``: loading it into the server
  visibly changes what it generates.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).with_name("fixtures")
MODEL_DIR = FIXTURES / "tiny-qwen"
LORA_DIR = FIXTURES / "tiny-qwen-lora"
TEMPLATE = FIXTURES / "tiny_qwen_template.jinja"
COLORS = ["red", "green", "blue", "yellow"]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]
SEED = 0


def lamps_context() -> tuple[str, str, list[dict[str, Any]], list[str]]:
    """(native system prompt, AWM system prompt, OpenAI tools, instructions) as the agent renders them."""
    from awm.authoring import compile_source_dir
    from awm.trainer import awm_format
    from awm.trainer.agent import DEFAULT_SYSTEM
    from awm.episode.toolcalls import openai_tools

    bundle = compile_source_dir(FIXTURES / "lamps")
    mcp = [{"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in bundle.tools]
    scenario = bundle.scenario.description.strip()
    system = DEFAULT_SYSTEM + "\n\nEnvironment: " + scenario
    return system, awm_format.system_prompt(scenario), openai_tools(mcp), [t.instruction for t in bundle.tasks]


def _call(color: str) -> dict[str, Any]:
    return {"id": "call_0", "type": "function",
            "function": {"name": "switch_on", "arguments": json.dumps({"color": color})}}


def episodes(rng: random.Random, n: int, color: str | None = None) -> list[dict[str, Any]]:
    """Canned episodes: ``{"messages", "tools", "thinking", "targets"}`` where targets are the
    indices of the assistant messages to learn."""
    from awm.trainer import awm_format

    system, awm_system, tools, instructions = lamps_context()
    mcp = [{"name": t["function"]["name"], "description": t["function"]["description"],
            "inputSchema": t["function"]["parameters"]} for t in tools]
    out = []
    for i in range(n):
        pick = color or rng.choice(COLORS)
        instruction = rng.choice(instructions)
        kind = i % 3
        if kind < 2:  # native tools, thinking off (0) or on (1)
            think = "<think>\nI switch on a lamp.\n</think>\n\n" if kind == 1 else ""
            done = "<think>\nThe lamp is on.\n</think>\n\n" if kind == 1 else ""
            messages = [{"role": "system", "content": system}, {"role": "user", "content": instruction},
                        {"role": "assistant", "content": think, "tool_calls": [_call(pick)]},
                        {"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"on": pick})},
                        {"role": "assistant", "content": done + "Done."}]
            out.append({"messages": messages, "tools": tools, "thinking": kind == 1, "targets": [2, 4]})
        else:  # the AWM format: list_tools, then call_tool, then the answer (thinking on)
            listing = '<tool_call>{"name": "list_tools", "arguments": {}}</tool_call>'
            messages = [{"role": "system", "content": awm_system}, {"role": "user", "content": instruction},
                        {"role": "assistant", "content": "<think>\nI list the tools.\n</think>\n\n" + listing},
                        {"role": "user", "content": "<tool_response>\n" + awm_format.list_tools_text(mcp)
                         + "\n</tool_response>"},
                        {"role": "assistant", "content": "<think>\nI switch on a lamp.\n</think>\n\n"
                         + awm_format.render_call("switch_on", {"color": pick})},
                        {"role": "user", "content": "<tool_response>\n" + json.dumps({"on": pick}) + "\n</tool_response>"},
                        {"role": "assistant", "content": "<think>\nThe lamp is on.\n</think>\n\nDone."}]
            out.append({"messages": messages, "tools": None, "thinking": True, "targets": [2, 4, 6]})
    return out


def build_tokenizer(texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=SPECIAL + ADDED, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"], model_max_length=2048)
    tokenizer.add_tokens(ADDED)  # not special: they survive decoding, as in Qwen's tokenizer
    tokenizer.chat_template = TEMPLATE.read_text()
    return tokenizer


def tokenized(tokenizer: Any, episode: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Token ids of the whole episode and a mask of the target assistant turns, each turn rendered
    as the server will render the prompt before it."""
    ids: list[int] = []
    mask: list[int] = []
    messages = episode["messages"]
    for index in episode["targets"]:
        prompt = tokenizer.apply_chat_template(messages[:index], tools=episode["tools"], add_generation_prompt=True,
                                               tokenize=False, enable_thinking=episode["thinking"])
        full = tokenizer.apply_chat_template(messages[:index + 1], tools=episode["tools"], tokenize=False,
                                             enable_thinking=episode["thinking"])
        assert full.startswith(prompt), (prompt[-200:], full[len(prompt) - 200:])
        reply = full[len(prompt):].split("<|im_end|>")[0] + "<|im_end|>"
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(reply, add_special_tokens=False)
        ids, mask = p + r, [0] * len(p) + [1] * len(r)  # the last turn's context holds the earlier ones
        yield ids, mask


def train(model: Any, batches: list[tuple[list[int], list[int]]], steps: int, lr: float, seed: int) -> float:
    import torch

    torch.manual_seed(seed)
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    model.train()
    loss_value = 0.0
    for _ in range(steps):
        chunk = rng.sample(batches, 16)
        width = max(len(ids) for ids, _ in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width))
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, (x, m) in enumerate(chunk):
            ids[i, :len(x)] = torch.tensor(x)
            mask[i, :len(x)] = torch.tensor(m, dtype=torch.float32)
            attention[i, :len(x)] = 1
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        loss_value = float(loss)
    return loss_value


def build(model_dir: Path = MODEL_DIR, lora_dir: Path = LORA_DIR) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    rng = random.Random(SEED)
    data = episodes(rng, 300)
    # the tokenizer learns from the rendered conversations (rendered once with a bootstrap template)
    texts = [json.dumps(e["messages"]) + json.dumps(e["tools"]) for e in data] + [TEMPLATE.read_text()]
    tokenizer = build_tokenizer(texts)
    rendered = [tokenizer.apply_chat_template(e["messages"], tools=e["tools"], tokenize=False) for e in data]
    tokenizer = build_tokenizer(texts + rendered)
    batches = [pair for e in data for pair in tokenized(tokenizer, e)]
    torch.manual_seed(SEED)
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None, torch_dtype="float32")
    model = Qwen3ForCausalLM(config)
    loss = train(model, batches, 400, 3e-3, SEED)
    print(f"warm start: loss {loss:.4f}", file=sys.stderr)
    model_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    # the adapter: always blue
    blue = [pair for e in episodes(random.Random(SEED + 1), 60, color="blue") for pair in tokenized(tokenizer, e)]
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    loss = train(lora, blue, 60, 1e-2, SEED + 1)
    print(f"adapter: loss {loss:.4f}", file=sys.stderr)
    lora.save_pretrained(lora_dir)
    (lora_dir / "README.md").unlink(missing_ok=True)  # peft's model-card boilerplate
    config_file = lora_dir / "adapter_config.json"
    adapter = json.loads(config_file.read_text())
    adapter["base_model_name_or_path"] = None  # not a machine path (and nothing for peft to look up)
    config_file.write_text(json.dumps(adapter, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    build()
    for path in (MODEL_DIR, LORA_DIR):
        print(path, sum(f.stat().st_size for f in path.iterdir()), "bytes")
