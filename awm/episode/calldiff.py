"""What each tool call did to the database: the difference of two row-level diffs.

The env server's ``GET /diff?rows=N`` answers what changed since the reset (the snapshot). Taken
after every tool call that changed something, two consecutive answers give that call's own
change: a row whose value after the previous call differs from its value now was inserted,
updated or deleted by this call. This is done here, on the agent's side (the episode session),
because the env server does not know where one call of the agent's ends for the viewer (and keeping per-call history there
would cost every episode memory whether anyone looks or not).

Tables with a primary key are matched by key. Tables without one are multisets of rows: a row
that appears is inserted, one that disappears deleted (an update shows as both). When either diff
was cut at its row limit the call's change is not exact: the table is marked ``truncated`` and
keeps what could be matched.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from awm.postgres.snapshot import add_change

Row = dict[str, Any]


def _key(row: Row, key: list[str]) -> str:
    return json.dumps([row.get(c) for c in key], default=str)


def _states(entry: dict[str, Any] | None) -> tuple[dict[str, Row | None], dict[str, Row | None]]:
    """Per primary key: the snapshot's row and the current row (None: absent)."""
    before: dict[str, Row | None] = {}
    after: dict[str, Row | None] = {}
    if not entry:
        return before, after
    key = entry.get("key") or []
    for row in entry.get("inserted", []):
        before[_key(row, key)], after[_key(row, key)] = None, row
    for row in entry.get("deleted", []):
        before[_key(row, key)], after[_key(row, key)] = row, None
    for pair in entry.get("updated", []):
        k = _key(pair["after"], key)
        before[k], after[k] = pair["before"], pair["after"]
    return before, after


def _keyed(prev: dict[str, Any] | None, cur: dict[str, Any] | None, key: list[str]) -> dict[str, Any]:
    prev_snap, prev_now = _states(prev)
    cur_snap, cur_now = _states(cur)
    out: dict[str, Any] = {"key": key, "inserted": [], "updated": [], "deleted": []}
    for k in sorted(set(prev_now) | set(cur_now)):
        snapshot = prev_snap.get(k) if k in prev_snap else cur_snap.get(k)
        was = prev_now[k] if k in prev_now else snapshot  # not in a diff: as in the snapshot
        now = cur_now[k] if k in cur_now else snapshot
        if was != now:
            add_change(out, was, now)
    return out


def _multiset(prev: dict[str, Any] | None, cur: dict[str, Any] | None) -> dict[str, Any]:
    def bag(entry: dict[str, Any] | None, side: str) -> Counter[str]:
        return Counter(json.dumps(r, sort_keys=True, default=str) for r in (entry or {}).get(side, []))

    # present now relative to the snapshot = inserted - deleted; the call's change is the difference
    gained = (bag(cur, "inserted") - bag(prev, "inserted")) + (bag(prev, "deleted") - bag(cur, "deleted"))
    lost = (bag(prev, "inserted") - bag(cur, "inserted")) + (bag(cur, "deleted") - bag(prev, "deleted"))
    return {"key": [], "inserted": [json.loads(r) for r in gained.elements()], "updated": [],
            "deleted": [json.loads(r) for r in lost.elements()]}


def call_diff(prev: dict[str, Any], cur: dict[str, Any]) -> dict[str, Any]:
    """The change between two ``rows`` answers of ``GET /diff`` (table -> inserted/updated/deleted
    rows, ``truncated`` where a limit cut either answer); only tables that changed."""
    out: dict[str, Any] = {}
    for table in sorted(set(prev) | set(cur)):
        p, c = prev.get(table), cur.get(table)
        key = (c or p or {}).get("key") or []
        change = _keyed(p, c, key) if key else _multiset(p, c)
        truncated = bool((p or {}).get("truncated") or (c or {}).get("truncated"))
        if change["inserted"] or change["updated"] or change["deleted"] or truncated:
            change["truncated"] = truncated
            out[table] = change
    return out


class DiffTracker:
    """Per episode: the last row-level diff seen, so each call's change can be told apart."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.last: dict[str, Any] = {}  # right after a reset the state is the snapshot: no change

    async def after_call(self, control: Any) -> dict[str, Any]:
        """This call's change (``control``: an :class:`awm.client.ControlClient`)."""
        current = (await control.diff(rows=self.rows)).get("rows", {})
        change = call_diff(self.last, current)
        self.last = current
        return change
