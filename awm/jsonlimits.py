"""JSON from untrusted peers, with limits: nesting depth, lone surrogates, iterative walks.

Every listener (an instance's MCP and control APIs) and every reply of a worker goes through
here, so that hostile JSON is a clear client error and never a ``RecursionError`` deep inside
the server: ``json.loads`` of a 50,000-deep array raises one, a recursive walk over a deeply
nested result raises one, and a lone surrogate (``"\\ud800"``, valid JSON) cannot be encoded as
UTF-8 on its way to Postgres.
"""

from __future__ import annotations

import json
from typing import Any, Callable

MAX_DEPTH = 64


class JsonLimitError(ValueError):
    """The JSON is well-formed but beyond a limit (nesting depth)."""


def depth_exceeds(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether containers nest deeper than ``max_depth`` (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return False


def loads(raw: bytes | str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises :class:`ValueError` (never ``RecursionError``) for JSON nested
    deeper than ``max_depth``."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise JsonLimitError(f"JSON nested deeper than {max_depth} levels") from None
    if depth_exceeds(value, max_depth):
        raise JsonLimitError(f"JSON nested deeper than {max_depth} levels")
    return value


def lone_surrogate(value: Any) -> str | None:
    """The path of the first string (or key) holding a lone UTF-16 surrogate, else None."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return path or "(value)"
        elif isinstance(item, dict):
            for key, child in item.items():
                sub = f"{path}.{key}" if path else str(key)
                if isinstance(key, str) and lone_surrogate(key) is not None:
                    return sub
                stack.append((child, sub))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string (dict keys too), lists and tuples as lists;
    iterative, so a result nested thousands of levels deep is converted, not a crash."""
    return map_leaves(value, lambda v: fn(v) if isinstance(v, str) else v, keys=fn)


def map_leaves(value: Any, fn: Callable[[Any], Any], keys: Callable[[str], str] | None = None) -> Any:
    """``value`` with every leaf (anything but a dict, list or tuple) replaced by ``fn(leaf)``
    and string keys by ``keys(key)``; iterative."""
    if not isinstance(value, (dict, list, tuple)):
        return fn(value)
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while stack:
        item, parent, key = stack.pop()
        if isinstance(item, dict):
            out: Any = {}
            for k, v in item.items():
                k2 = keys(k) if keys is not None and isinstance(k, str) else k
                out[k2] = None
                stack.append((v, out, k2))
        elif isinstance(item, (list, tuple)):
            out = [None] * len(item)
            stack.extend((v, out, i) for i, v in enumerate(item))
        else:
            out = fn(item)
        parent[key] = out
    return root[0]
