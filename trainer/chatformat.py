"""How chat messages become token ids for an in-process model (ChatML, as Qwen models use).

Messages are encoded one by one and concatenated, so the prompt of turn t+1 normally starts with
the prompt of turn t plus the tokens generated at turn t. The learner relies on that to score a
whole episode in one forward pass (tool results in between are context, masked out of the
loss); where the history window cut the prefix, it starts a new segment (:mod:`trainer.samples`).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from trainer.toolcalls import render_text_call

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
