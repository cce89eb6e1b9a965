"""The catalog as the UI shows it: environments, their tables, tools and tasks with gate records.

Built from the bundles themselves (awm/catalog.py), so it shows what would be served, including
why a task is not (its gate status, the same check the env server makes).
"""

from __future__ import annotations

import re
from typing import Any

from awm import catalog as catalog_mod
from awm.bundle import EnvBundle
from awm.gates import gate_status

_CREATE = re.compile(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?\"?([A-Za-z_][\w]*)\"?\s*\(", re.IGNORECASE)
_CONSTRAINT = re.compile(r"^(PRIMARY|UNIQUE|FOREIGN|CHECK|CONSTRAINT|EXCLUDE)\b", re.IGNORECASE)


def _split_top(body: str) -> list[str]:
    """Split a column list at the commas outside parentheses."""
    parts, depth, current = [], 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def tables(ddl: str) -> list[dict[str, Any]]:
    """Tables and their columns (name and declared type) from the bundle's PostgreSQL DDL.

    A display aid, not a parser of all of SQL: the env server loads the DDL into PostgreSQL, which
    is the authority; this reads the CREATE TABLE statements' column lists only.
    """
    out = []
    for match in _CREATE.finditer(ddl):
        depth, i = 1, match.end()
        while i < len(ddl) and depth:
            depth += {"(": 1, ")": -1}.get(ddl[i], 0)
            i += 1
        columns = []
        for part in _split_top(ddl[match.end():i - 1]):
            if not part or _CONSTRAINT.match(part):
                continue
            name, _, rest = part.partition(" ")
            columns.append({"name": name.strip('"'), "type": rest.strip()})
        out.append({"name": match.group(1), "columns": columns})
    return out


def _task(bundle: EnvBundle, task: Any) -> dict[str, Any]:
    gated, reason = gate_status(bundle, task)
    return {"id": task.id, "instruction": task.instruction, "verifier_kind": task.verifier.kind,
            "alt_verifier_kind": task.alt_verifier.kind if task.alt_verifier else None,
            "gated": gated, "gate_reason": reason,
            "gates": [g.model_dump(mode="json") for g in task.gates],
            "solution": [c.model_dump(mode="json") for c in task.solution],
            "success_criteria": task.verifier.success_criteria, "failure_criteria": task.verifier.failure_criteria}


def environment(bundle: EnvBundle) -> dict[str, Any]:
    seeded = {s.table: len(s.rows) for s in bundle.database.seed}
    return {"name": bundle.name, "description": bundle.scenario.description,
            "tables": [{**t, "rows": seeded.get(t["name"], 0)} for t in tables(bundle.database.ddl)],
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                      for t in bundle.tools],
            "tasks": [_task(bundle, t) for t in bundle.tasks]}


def load(catalog: str) -> dict[str, Any]:
    """Every environment of a catalog; a broken bundle is listed with its error."""
    envs, broken = [], []
    for entry in catalog_mod.entries(catalog):
        if entry.bundle is None:
            broken.append({"name": entry.name, "error": entry.error})
        else:
            envs.append(environment(entry.bundle))
    return {"catalog": str(catalog), "environments": envs, "broken": broken}
