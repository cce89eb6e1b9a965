"""A tiny causal LM and a word-level tokenizer, built locally from a config (nothing downloaded).

Used by the tests and the CPU demo. The tokenizer's vocabulary is the words of the environment's
texts plus *action words*: whole tool calls such as
``<tool_call>{"name":"switch_on","arguments":{"color":"green"}}</tool_call>`` written without
spaces, so that one token is one complete call. Sampling is restricted to the action words and
the end-of-turn token, which makes the action space small enough that a randomly initialised
model hits the rewarded call by chance sometimes - the precondition for any RL signal. Real
models need none of this: they write calls token by token (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from awm.trainer.chatformat import IM_END, IM_START

SPECIALS = ["[PAD]", "[UNK]", IM_START, IM_END]


@dataclass
class TinySpec:
    actions: list[str] = field(default_factory=list)  # the output vocabulary (besides end-of-turn)
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    max_positions: int = 4096
    max_vocab_words: int = 2000

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TinySpec:
        return cls(**(data or {}))


def build_tokenizer(corpus: list[str], actions: list[str], max_words: int = 2000):  # type: ignore[no-untyped-def]
    """A ``PreTrainedTokenizerFast`` over whitespace-separated words (unknown words -> [UNK])."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in SPECIALS + list(actions) + ["assistant", "user", "system", "<tool_response>", "</tool_response>"]:
        vocab.setdefault(token, len(vocab))
    for text in corpus:
        for word in text.split():
            if len(vocab) >= max_words + len(SPECIALS):
                break
            vocab.setdefault(word, len(vocab))
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token=IM_END, additional_special_tokens=[IM_START])
    return tokenizer


def build_model(vocab_size: int, spec: TinySpec, seed: int = 0):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=spec.hidden_size * 2,
                         num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
                         max_position_embeddings=spec.max_positions, tie_word_embeddings=True,
                         pad_token_id=0, bos_token_id=None, eos_token_id=SPECIALS.index(IM_END))
    return LlamaForCausalLM(config)


def allowed_ids(tokenizer: Any, actions: list[str]) -> list[int] | None:
    """Token ids the tiny policy may generate: its actions and end-of-turn (None: unrestricted)."""
    if not actions:
        return None
    ids = tokenizer.convert_tokens_to_ids(list(actions) + [IM_END])
    if tokenizer.unk_token_id in ids:
        raise ValueError("an action is not a single token of the tokenizer")
    return ids
