"""Tool calls in a policy's reply: native OpenAI ``tool_calls`` or the text fallback.

Models served without a tool parser (and small local models) write calls as text, AWM's format:
``<tool_call>{"name": "...", "arguments": {...}}</tool_call>``. Both forms become a
:class:`ToolCall`; anything that looks like a call but cannot be executed becomes a
:class:`MalformedCall`, which the agent loop answers with an error message and the reward
charges as a format error (it is the policy's fault).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

_TEXT_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MalformedCall:
    id: str
    raw: str
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "malformed": True}


Parsed = ToolCall | MalformedCall


def parse_native(tool_calls: list[dict[str, Any]] | None, prefix: str = "call") -> list[Parsed]:
    """OpenAI ``message.tool_calls``; arguments arrive as a JSON string (or, from some servers, an object)."""
    parsed: list[Parsed] = []
    for i, call in enumerate(tool_calls or []):
        call_id = str(call.get("id") or f"{prefix}_{i}")
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            parsed.append(MalformedCall(call_id, json.dumps(call, default=str)[:500], "tool call without a function name"))
            continue
        raw_args = function.get("arguments")
        args, error = _arguments(raw_args)
        if error:
            parsed.append(MalformedCall(call_id, str(raw_args)[:500], f"{function['name']}: {error}"))
        else:
            parsed.append(ToolCall(call_id, function["name"], args))
    return parsed


def parse_text(content: str | None, prefix: str = "call") -> list[Parsed]:
    """Every ``<tool_call>...</tool_call>`` block in the text, in order; an unclosed block is malformed."""
    if not content or _OPEN not in content:
        return []
    parsed: list[Parsed] = []
    for i, match in enumerate(_TEXT_CALL.finditer(content)):
        parsed.append(_parse_block(match.group(1), f"{prefix}_{i}"))
    tail = content[content.rfind("</tool_call>") + len("</tool_call>"):] if "</tool_call>" in content else content
    if _OPEN in tail:
        parsed.append(MalformedCall(f"{prefix}_{len(parsed)}", tail[tail.find(_OPEN):][:500],
                                    "<tool_call> without a closing </tool_call>"))
    return parsed


def _parse_block(raw: str, call_id: str) -> Parsed:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        return MalformedCall(call_id, raw[:500], f"not JSON: {exc.msg} at position {exc.pos}")
    if isinstance(value, list) and len(value) == 1:  # AWM unwraps a one-element list too
        value = value[0]
    if not isinstance(value, dict):
        return MalformedCall(call_id, raw[:500], "a tool call must be a JSON object with name and arguments")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(call_id, raw[:500], "tool call without a \"name\"")
    args, error = _arguments(value.get("arguments", {}))
    if error:
        return MalformedCall(call_id, raw[:500], f"{name}: {error}")
    return ToolCall(call_id, name, args)


def _arguments(raw: Any) -> tuple[dict[str, Any], str]:
    if raw is None or raw == "":
        return {}, ""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            return {}, f"arguments are not JSON: {exc.msg}"
    if not isinstance(raw, dict):
        return {}, "arguments must be a JSON object"
    return raw, ""


_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def has_thinking(content: str | None) -> bool:
    """Whether a reply carries its reasoning block: a closed ``</think>`` (a Qwen3 template that
    opens the block in the prompt leaves only the close to the reply)."""
    return bool(content) and "</think>" in content  # type: ignore[operator]


def strip_thinking(content: str | None) -> str:
    """The reply without its ``<think>...</think>`` reasoning (a Qwen3-style model thinking
    aloud may mention a ``<tool_call>`` it does not make); an unclosed block is all thought."""
    if not content:
        return ""
    text = _THINK.sub("", content)
    if "<think>" in text:
        text = text[:text.find("<think>")]
    return text if text == content else text.lstrip()


def strip_calls(content: str | None) -> str:
    """The reply text without its tool-call blocks (what is left is prose or a final answer)."""
    if not content:
        return ""
    text = _TEXT_CALL.sub("", content)
    if _OPEN in text:
        text = text[:text.find(_OPEN)]
    return text.strip()


def render_text_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# -- tool specifications -----------------------------------------------------------------------

# What a short schema keeps of a JSON schema: what constrains a value, not what explains it.
_SCHEMA_PROSE = ("description", "title", "examples", "$comment")
_NAMED = ("properties", "patternProperties", "$defs", "definitions")
_VALUES = ("default", "const", "enum")
# an Optional's other branch is folded only when it holds nothing that "null" would then have to meet
_UNFOLDABLE = ("const", "allOf", "anyOf", "oneOf", "not", "$ref", "if")


def short_tools(mcp_tools: list[dict[str, Any]], max_chars: int = 120) -> list[dict[str, Any]]:
    """The tools with shorter descriptions, for models whose context or attention a long tool list
    swamps (a 135M model sees ~5,900 prompt tokens of bike_shop's 47 tools): each description cut
    to its first sentence (at most ``max_chars``), and the prose of the parameter schemas (their
    descriptions, titles, examples) dropped. Types, enums, formats, bounds, ``required`` and
    defaults stay: what makes an argument valid is never removed."""
    return [{**t, "description": first_sentence(t.get("description") or "", max_chars),
             "inputSchema": _strip_prose(t.get("inputSchema") or {"type": "object", "properties": {}})}
            for t in mcp_tools]


def first_sentence(text: str, max_chars: int = 120) -> str:
    """The first sentence of a docstring-like text (up to its first ". " or blank line)."""
    text = " ".join(text.strip().split("\n\n", 1)[0].split())
    end = re.search(r"[.!?](\s|$)", text)
    sentence = text[:end.start() + 1] if end else text
    return sentence if len(sentence) <= max_chars else sentence[:max_chars - 1].rstrip() + "…"


def _strip_prose(schema: Any, key: str = "") -> Any:
    if isinstance(schema, dict):
        # under these the keys are names (a parameter may be called "title"), not keywords
        keep = schema.items() if key in _NAMED else ((k, v) for k, v in schema.items() if k not in _SCHEMA_PROSE)
        # values (a default, a const, an enum's members) are data, not schema: kept as they are
        stripped = {k: v if k in _VALUES else _strip_prose(v, k) for k, v in keep}
        return stripped if key in _NAMED else _fold_optional(stripped)
    if isinstance(schema, list):
        return [_strip_prose(v) for v in schema]
    return schema


def _fold_optional(schema: dict[str, Any]) -> dict[str, Any]:
    """pydantic's ``Optional[X]`` (``anyOf: [{type: X, ...}, {type: null}]``) as the same schema
    in one object (``type: [X, "null"]``; an enum gains ``null``): a third of a long tool list's
    tokens went to that wrapping. Anything else is left as it is."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or {"type": "null"} not in branches:
        return schema
    other = branches[0] if branches[1] == {"type": "null"} else branches[1]
    if not isinstance(other, dict) or not isinstance(other.get("type"), str) or set(other) & set(schema) \
            or set(other) & set(_UNFOLDABLE):
        return schema
    folded = {k: v for k, v in schema.items() if k != "anyOf"}
    folded.update(other, type=[other["type"], "null"])
    if isinstance(other.get("enum"), list) and None not in other["enum"]:
        folded["enum"] = [*other["enum"], None]
    return folded


def openai_tools(mcp_tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP ``tools/list`` entries as the OpenAI ``tools`` request parameter."""
    return [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description") or "",
        "parameters": t.get("inputSchema") or {"type": "object", "properties": {}},
    }} for t in mcp_tools]


def text_tools_prompt(mcp_tools: list[dict[str, Any]]) -> str:
    """The tool list and call format for models without native tool calling (AWM's convention)."""
    lines = ["You can call these tools. To call one, write exactly one block per call:",
             '<tool_call>{"name": "<tool name>", "arguments": {<JSON arguments>}}</tool_call>',
             "Tool results come back in the next message. When the task is done, answer without a tool call.",
             "", "Tools:"]
    for t in mcp_tools:
        schema = json.dumps(t.get("inputSchema") or {}, separators=(",", ":"))
        description = (t.get("description") or "").strip().splitlines()
        lines.append(f"- {t['name']}: {description[0] if description else ''} parameters: {schema}")
    return "\n".join(lines)
