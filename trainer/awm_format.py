"""The reference system's agent format (``agent.tool_format: awm``), so that a checkpoint trained
with it (Arctic-AWM) is evaluated and trained the way it learned to act.

What the reference agent does, and this module reproduces:

* no ``tools`` request parameter: the system prompt offers two *meta-tools*, ``list_tools()``
  and ``call_tool(tool_name, arguments)`` (``arguments`` a JSON string of the tool's arguments);
* calls are text, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; only the first
  call of a reply is executed (one call per turn); a reply without a call is the final answer;
* ``list_tools`` answers with every tool's name, description and parameters; a name written as
  ``mcp_tool_<name>`` (the reference's namespaced listing) is taken as ``call_tool`` of
  ``<name>``; an unknown name is answered ``Unknown tool``;
* results go back as ``<tool_response>`` blocks, errors as ``Error: <text>``; thinking is on
  (``chat_template_kwargs: {"enable_thinking": true}`` - ``agent.thinking``).

The system prompt is ours, written from the reference's description (its repository carries no
licence, so its text is not copied): the same facts - already logged in as user 1, the two
functions, one call per step, list the tools once, answer directly at the end.

The paper's early termination on a format error is ``agent.stop_on_format_error``; such an
episode is scored ``reward.format_error`` (-1.0 by default, OpenEnv's published value for
the reference's format errors) instead of its verdict (docs/training.md).
"""

from __future__ import annotations

import json
from typing import Any

from awm.episode.toolcalls import MalformedCall, Parsed, ToolCall

SYSTEM_PROMPT = (
    "You are an agent that completes the user's task in an application by calling its tools. "
    "You have already logged in, and your user id is 1.\n\n"
    "You have two functions:\n"
    "- list_tools(): returns the application's tools with their descriptions and parameters. "
    "Call it once, at the start.\n"
    "- call_tool(tool_name, arguments): calls one tool; `arguments` is a JSON string of its arguments.\n\n"
    "Call exactly one function per step, written as\n"
    "<tool_call>{\"name\": \"<function>\", \"arguments\": {...}}</tool_call>\n"
    "and wait for its result. When the task is done, answer directly, without a function call.")

LIST_TOOLS, CALL_TOOL = "list_tools", "call_tool"
_PREFIX = "mcp_tool_"


def system_prompt(scenario: str = "") -> str:
    return SYSTEM_PROMPT + ("\n\nApplication: " + scenario.strip() if scenario.strip() else "")


def list_tools_text(mcp_tools: list[dict[str, Any]]) -> str:
    """The answer to ``list_tools``: one JSON line per tool (name, description, parameters)."""
    lines = [json.dumps({"name": t["name"], "description": (t.get("description") or "").strip(),
                         "parameters": t.get("inputSchema") or {"type": "object", "properties": {}}})
             for t in mcp_tools]
    return "\n".join(lines) or "(no tools)"


def resolve(call: Parsed) -> tuple[str, ToolCall | None] | MalformedCall:
    """What one text call asks for: ``("list", None)``, ``("call", ToolCall of the real tool)``,
    ``("unknown", None)``; a ``call_tool`` whose arguments cannot be read is malformed."""
    if isinstance(call, MalformedCall):
        return call
    name = call.name
    if name == LIST_TOOLS:
        return "list", None
    if name.startswith(_PREFIX):
        return "call", ToolCall(call.id, name[len(_PREFIX):], call.arguments)
    if name != CALL_TOOL:
        return "unknown", None
    tool = call.arguments.get("tool_name")
    args: Any = call.arguments.get("arguments", {})
    if not isinstance(tool, str) or not tool:
        return MalformedCall(call.id, json.dumps(call.arguments)[:500], "call_tool needs a \"tool_name\"")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return MalformedCall(call.id, args[:500], f"call_tool {tool}: arguments are not JSON: {exc.msg}")
    if not isinstance(args, dict):
        return MalformedCall(call.id, json.dumps(args)[:500], f"call_tool {tool}: arguments must be a JSON object")
    return "call", ToolCall(call.id, tool, args)


def render_call(name: str, arguments: dict[str, Any]) -> str:
    """A ``call_tool`` of ``name`` as the model writes it (tests, fixtures)."""
    inner = {"tool_name": name, "arguments": json.dumps(arguments)}
    return "<tool_call>" + json.dumps({"name": CALL_TOOL, "arguments": inner}) + "</tool_call>"
