"""How chat messages become token ids for an in-process model, and for re-tokenising turns whose
ids a server did not return.

:func:`chat_format` picks the format: the tokenizer's own chat template
(:class:`TemplateFormat`: ``apply_chat_template`` with ``tools=`` and, for Qwen3-style templates,
``enable_thinking``) whenever it has one - the text a vLLM server renders for the same messages,
so rollouts and training see the same prompt. Only a tokenizer without a template (the tiny
word-level test model) gets :class:`ChatFormat`, a hand-written ChatML that is *not* any real
model's format (its tool block and thinking differ from Qwen3's); it says so in the log.

Both give :meth:`turn`: the prompt ids of a context and the ids of the assistant message that
followed it, the way the model generated it (up to and including its end-of-turn token). With
ChatFormat the prompt of turn t+1 starts with the prompt of turn t plus the tokens generated at
turn t, so the learner scores a whole episode in one forward pass; a template need not extend
its earlier prompts (Qwen3 drops an empty think block from past turns), and where a prefix
changes the learner starts a new segment (:mod:`awm.trainer.samples`).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

log = logging.getLogger("awm.trainer.chatformat")

from awm.episode.toolcalls import render_text_call

IM_START, IM_END = "<|im_start|>", "<|im_end|>"


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The OpenAI ``tools`` parameter as text in the system message, with the call format."""
    lines = ["# Tools", "Call a tool by writing <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>."]
    for tool in tools:
        fn = tool.get("function", tool)
        lines.append(json.dumps({"name": fn.get("name"), "description": fn.get("description", ""),
                                 "parameters": fn.get("parameters", {})}, separators=(",", ":")))
    return "\n".join(lines)


class ChatFormat:
    """The fallback: hand-written ChatML for tokenizers without a chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}

    def render(self, message: dict[str, Any]) -> str:
        role, content = message.get("role", "user"), message.get("content") or ""
        if role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                fn = call.get("function", {})
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except (TypeError, json.JSONDecodeError):
                    args = fn.get("arguments")
                content += render_text_call(fn.get("name", ""), args)
        if role == "tool":
            role, content = "user", f"<tool_response>\n{content}\n</tool_response>"
        return f"{IM_START}{role}\n{content}{IM_END}\n"

    def encode_text(self, text: str) -> list[int]:
        ids = self._cache.get(text)
        if ids is None:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._cache) < 4096:
                self._cache[text] = ids
        return ids

    def encode_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of the messages followed by the assistant header (the generation prompt)."""
        messages = list(messages)
        if tools:
            if messages and messages[0].get("role") == "system":
                messages[0] = {**messages[0], "content": (messages[0].get("content") or "") + "\n\n" + tools_block(tools)}
            else:
                messages.insert(0, {"role": "system", "content": tools_block(tools)})
        ids: list[int] = []
        for message in messages:
            ids += self.encode_text(self.render(message))
        return ids + self.encode_text(f"{IM_START}assistant\n")

    def turn(self, context: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             message: dict[str, Any]) -> tuple[list[int], list[int]]:
        """(prompt ids, generated ids) of ``message`` answering ``context``."""
        prompt = self.encode_prompt(context, tools)
        full = self.encode_text(self.render(message))
        header = self.encode_text(f"{IM_START}assistant\n")
        completion = full[len(header):] if full[:len(header)] == header else full
        return prompt, _through_end(completion, self.encode_text(IM_END))


def _through_end(ids: list[int], end: list[int]) -> list[int]:
    """``ids`` up to and including the last end-of-turn (what follows it is the next context's)."""
    for i in range(len(ids) - len(end), -1, -1):
        if ids[i:i + len(end)] == end:
            return ids[:i + len(end)]
    return ids


class TemplateFormat:
    """The tokenizer's chat template (``apply_chat_template``), as a vLLM server applies it."""

    def __init__(self, tokenizer: Any, thinking: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.thinking = thinking

    def _kwargs(self) -> dict[str, Any]:
        return {} if self.thinking is None else {"enable_thinking": self.thinking}

    def render_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                      generation: bool = True) -> str:
        return self.tokenizer.apply_chat_template(_for_template(messages), tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation, **self._kwargs())

    def encode_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return list(self.tokenizer.encode(self.render_prompt(messages, tools), add_special_tokens=False))

    def turn(self, context: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             message: dict[str, Any]) -> tuple[list[int], list[int]]:
        prompt = self.render_prompt(context, tools)
        full = self.render_prompt([*context, message], tools, generation=False)
        if not full.startswith(prompt):  # a template that renders the last turn differently
            raise ValueError("the chat template does not render a reply after its generation prompt")
        eos = self.tokenizer.eos_token or ""
        reply = full[len(prompt):]
        if eos and eos in reply:
            reply = reply[:reply.index(eos) + len(eos)]
        return (list(self.tokenizer.encode(prompt, add_special_tokens=False)),
                list(self.tokenizer.encode(reply, add_special_tokens=False)))


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call arguments as objects: templates render them with ``tojson`` (Qwen's accept either)."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for call in m["tool_calls"]:
                fn = dict(call.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass
                calls.append({**call, "function": fn})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


def chat_format(tokenizer: Any, thinking: bool | None = None) -> ChatFormat | TemplateFormat:
    """The tokenizer's own template when it has one; else the ChatML fallback, with a warning."""
    if getattr(tokenizer, "chat_template", None):
        return TemplateFormat(tokenizer, thinking)
    log.warning("the tokenizer has no chat template: prompts use awm's built-in ChatML formatter, "
                "which is not the model's own format (fine for the tiny test model, not for a real one)")
    return ChatFormat(tokenizer)
