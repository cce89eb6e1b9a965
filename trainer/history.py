"""The sliding history window, shared by rollouts and training.

Long episodes outgrow a context window, and the reference system simply re-sends everything.
Here the prompt of every turn keeps the system message(s), the task instruction (the first user
message) and only the last ``turns`` assistant turns with their tool results. A turn is cut
whole: an assistant message is never kept without the tool results that answer it (or vice
versa), because chat APIs reject orphaned tool messages.

The learner must score each generated token under exactly the context the policy saw, so it
calls the same :func:`window` (see :mod:`awm.trainer.samples`); never re-implement it elsewhere.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]


def window(messages: list[Message], turns: int | None) -> list[Message]:
    """Messages the policy sees: the head (system + instruction) and the last ``turns`` turns.

    ``turns`` of ``None`` or ``0`` keeps everything.
    """
    head_end = _head_length(messages)
    head, rest = messages[:head_end], messages[head_end:]
    if not turns:
        return list(messages)
    starts = [i for i, m in enumerate(rest) if m.get("role") == "assistant"]
    if len(starts) <= turns:
        return list(messages)
    return head + rest[starts[-turns]:]


def _head_length(messages: list[Message]) -> int:
    """System messages, then the first user message (the instruction)."""
    i = 0
    while i < len(messages) and messages[i].get("role") == "system":
        i += 1
    if i < len(messages) and messages[i].get("role") == "user":
        i += 1
    return i
