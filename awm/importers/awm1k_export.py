"""Write a catalog back in the AWM-1K release format (`awm catalog export --format awm`).

The inverse of :mod:`awm.importers.awm1k`, for the environments it can describe: an AWM
environment is a FastAPI + SQLAlchemy app over SQLite, so a bundle exports when it has an app
(``EnvBundle.app``), tools that are its routes, and the SQLite schema it was translated from
(``Database.awm_schema``) - that is, environments that came from an AWM import. awm's own
environments (Python tools over Postgres) are refused, each with the reason.

Files: ``gen_scenario``, ``gen_tasks``, ``gen_db`` (the release's schema, as imported),
``gen_sample`` (INSERTs of the snapshot's rows, as SQLite literals), ``gen_spec`` (one endpoint per
tool: path, method, operation_id, request_params from the input schema and the routing),
``gen_envs`` (the app), ``gen_verifier.pure_code`` (code verifiers) and ``gen_verifier`` (judge
verifiers, their criteria in ``raw_response``).

``import(export(c))`` gives back ``c``, except for what the AWM format has no place for, which
the export report lists per environment: reference solutions and final answers (AWM ships none;
so the positive gates, which rest on them, go too), non-default limits, and the time each gate
ran (re-import records the code verifiers' negative gates anew). Tasks are written at their index
(``task_<n>``); an index whose task was not imported is written with a placeholder and no
verifier, so re-import skips it and the ids stay the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm.bundle import EnvBundle, Limits, Tool

_TASK_ID = re.compile(r"^task_(\d+)$")
_JSON_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
               "array": "array", "object": "object"}


@dataclass
class ExportReport:
    out: str
    exported: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # env -> why
    lost: dict[str, list[str]] = field(default_factory=dict)  # env -> what the format cannot carry

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "exported": self.exported, "refused": self.refused, "lost": self.lost}


def exportable(bundle: EnvBundle) -> str | None:
    """Why ``bundle`` cannot be written in the AWM format, or ``None``."""
    if bundle.app is None:
        return "its tools are Python functions, not routes of a FastAPI app (the AWM format has only apps)"
    if any(t.route is None for t in bundle.tools):
        return "some tools are not routes of its app"
    if not bundle.database.awm_schema:
        return "it has no SQLite schema from an AWM import (database.awm_schema)"
    if any(_TASK_ID.match(t.id) is None for t in bundle.tasks):
        return "its task ids are not task_<index>"
    return None


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and value.startswith("\\x") and re.fullmatch(r"\\x[0-9a-f]*", value):
        return f"X'{value[2:]}'"
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    return "'" + str(value).replace("'", "''") + "'"


def _inserts(bundle: EnvBundle) -> dict[str, Any]:
    tables = []
    for seed in bundle.database.seed:
        statements = []
        for row in seed.rows:
            columns = ", ".join(row)
            values = ", ".join(_literal(v) for v in row.values())
            statements.append(f"INSERT INTO {seed.table} ({columns}) VALUES ({values});")
        tables.append({"table_name": seed.table, "insert_statements": statements})
    return {"tables": tables}


def _param(name: str, prop: dict[str, Any], where: str, required: bool) -> dict[str, Any]:
    kinds = prop.get("type")
    kinds = [k for k in (kinds if isinstance(kinds, list) else [kinds]) if k and k != "null"]
    out: dict[str, Any] = {"type": _JSON_TYPES.get(kinds[0], "string") if kinds else "string",
                           "param_type": where, "required": required}
    if prop.get("description"):
        out["description"] = prop["description"]
    if prop.get("examples"):
        out["example"] = prop["examples"][0]
    return out


def _endpoint(tool: Tool) -> dict[str, Any]:
    assert tool.route is not None
    summary, _, description = tool.description.partition("\n\n")
    required = set(tool.input_schema.get("required", []))
    params = {name: _param(name, prop, tool.route.params.get(name, "query"), name in required)
              for name, prop in tool.input_schema.get("properties", {}).items()}
    return {"path": tool.route.path, "method": tool.route.method, "summary": summary,
            "description": description or summary, "operation_id": tool.route.operation_id or tool.name,
            "tags": [], "request_params": params, "response": {}, "required_tables": [], "required_fields": {}}


def _raw_response(kind: str, verifier: Any) -> str:
    if kind == "code":
        return ""
    return json.dumps({"reasoning": "", "python_code": verifier.code, "function_name": verifier.entrypoint,
                       "success_criteria": verifier.success_criteria, "failure_criteria": verifier.failure_criteria})


def _lost(bundle: EnvBundle) -> list[str]:
    lost = []
    solved = [t.id for t in bundle.tasks if t.solution or t.final_answer]
    if solved:
        lost.append(f"reference solutions of {len(solved)} task(s), and the positive gates resting on them")
    if bundle.limits != Limits():
        lost.append(f"limits {bundle.limits.model_dump()} (re-import uses the defaults)")
    if bundle.verifier_prelude or bundle.tool_prelude:
        lost.append("tool and verifier preludes")
    return lost


def export_catalog(bundles: list[EnvBundle], out: Path) -> ExportReport:
    """Write the AWM files of every exportable bundle into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport(str(out))
    files: dict[str, list[dict[str, Any]]] = {name: [] for name in (
        "gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_spec", "gen_envs", "gen_verifier",
        "gen_verifier.pure_code")}
    for bundle in sorted(bundles, key=lambda b: b.name):
        why = exportable(bundle)
        if why is not None:
            report.refused[bundle.name] = why
            continue
        name = bundle.name
        by_index = {int(_TASK_ID.match(t.id).group(1)): t for t in bundle.tasks}  # type: ignore[union-attr]
        count = max(by_index, default=-1) + 1
        texts = [by_index[i].instruction if i in by_index else f"(task {i} was not imported)" for i in range(count)]
        files["gen_scenario"].append({"name": name, "description": bundle.scenario.description})
        files["gen_tasks"].append({"scenario": name, "tasks": texts})
        files["gen_db"].append({"scenario": name, "db_schema": bundle.database.awm_schema})
        files["gen_sample"].append({"scenario": name, "sample_data": _inserts(bundle)})
        files["gen_spec"].append({"scenario": name, "api_spec": {"api_groups": [
            {"group_name": name, "endpoints": [_endpoint(t) for t in bundle.tools]}]}})
        files["gen_envs"].append({"scenario": name, "db_path": f"./outputs/databases/{name}.db",
                                  "full_code": bundle.app.code})  # type: ignore[union-attr]
        for index, task in sorted(by_index.items()):
            for verifier in task.verifiers():
                target = "gen_verifier.pure_code" if verifier.kind == "code" else "gen_verifier"
                files[target].append({"scenario": name, "task_idx": index, "task": task.instruction,
                                      "verification": {"code": verifier.code,
                                                       "raw_response": _raw_response(verifier.kind, verifier)}})
        report.exported.append(name)
        lost = _lost(bundle)
        if lost:
            report.lost[name] = lost
    for stem, records in files.items():
        with (out / f"{stem}.jsonl").open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return report
