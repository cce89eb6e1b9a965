"""The sliding history window, shared by rollouts and training.

Long episodes outgrow a context window, and the reference system simply re-sends everything.
Here the prompt of every turn keeps

* the system message(s) and the task instruction (the first user message),
* the first ``list_tools`` exchange (the call and its result), wherever it was, and
* the last ``turns`` assistant turns with their tool results.

The ``list_tools`` exchange is kept because in the AWM format (``agent.tool_format: awm``) its
result is the only place the tools are shown: a window without it hides the tools from the model
after turn ``turns + 1``. The paper's history-aware training keeps it in every sample for the same
reason (docs/reproduce.md). A turn is cut whole: an assistant message is never kept without the
tool results that answer it (or vice versa), because chat APIs reject orphaned tool messages.

The learner must score each generated token under exactly the context the policy saw, so it
calls the same :func:`window` (see :mod:`awm.trainer.samples`); never re-implement it elsewhere.
"""

from __future__ import annotations

from typing import Any

from awm.episode.toolcalls import ToolCall, parse_text, strip_thinking
from awm.trainer.awm_format import LIST_TOOLS

Message = dict[str, Any]


def window(messages: list[Message], turns: int | None) -> list[Message]:
    """Messages the policy sees: the head (system + instruction), the first ``list_tools``
    exchange, and the last ``turns`` turns. ``turns`` of ``None`` or ``0`` keeps everything."""
    if not turns:
        return list(messages)
    head_end = _head_length(messages)
    head, rest = messages[:head_end], messages[head_end:]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
    if len(starts) <= turns:
        return list(messages)
    cut = starts[-turns]
    return head + _first_listing(rest, starts[:-turns], cut) + rest[cut:]


def _first_listing(rest: list[Message], dropped: list[int], cut: int) -> list[Message]:
    """The first ``list_tools`` turn (assistant message and its results) among the turns the
    window drops, or nothing (it is in the window already, or there was none)."""
    for n, start in enumerate(dropped):
        if lists_tools(rest[start]):
            end = dropped[n + 1] if n + 1 < len(dropped) else cut
            return rest[start:end]
    return []


def lists_tools(message: Message) -> bool:
    """Whether this assistant message's executed call is ``list_tools``. A text reply counts by
    its first call outside ``<think>`` (the AWM format executes only that one; a second call was
    answered "not executed" and its turn holds no tool list); native calls by any of them."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name") == LIST_TOOLS:
            return True
    content = message.get("content")
    if not isinstance(content, str) or LIST_TOOLS not in content:  # the cheap test first
        return False
    calls = parse_text(strip_thinking(content))
    return bool(calls) and isinstance(calls[0], ToolCall) and calls[0].name == LIST_TOOLS


def _head_length(messages: list[Message]) -> int:
    """System messages, then the first user message (the instruction)."""
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    if i < len(messages) and messages[i].get("role") == "user":
        i += 1
    return i
