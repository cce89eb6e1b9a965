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
so the positive gates, which rest on them, go too), non-default limits, preludes, criteria of
code verifiers (the importer reads criteria only from sql-mode rows), a judge verifier as the
primary one (re-import with ``--prefer judge``), task ids that are not ``task_<n>`` (written at
new indices), and the time each gate ran (re-import records the code verifiers' negative gates
anew). Tasks are written at their index (``task_<n>``); an index whose task was not imported is
written with a placeholder and no verifier, so re-import skips it and the ids stay the same.

Everything else is written so that the importer reads back exactly what the bundle holds: seed
values as SQLite literals that evaluate to the same values (identifiers quoted, so a column named
``order`` loads; a backslash before a quote written as ``char(92)``, since the importer repairs
``\\'`` as a MySQL-style escape), tool descriptions split into summary and description only where
the importer joins them back unchanged, and parameters without a type left without one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm.bundle import EnvBundle, Limits, Task, Tool, Verifier
from awm.importers import sqlite_to_pg as s2p
from awm.importers.awm1k import _ENTRYPOINT, FILES, EnvReport, _parse_schema

_TASK_ID = re.compile(r"^task_(0|[1-9][0-9]*)$")  # task_007 would come back as task_7
_JSON_TYPES = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean",
               "array": "array", "object": "object"}


@dataclass
class ExportReport:
    out: str
    exported: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # env -> why (every reason, "; "-joined)
    lost: dict[str, list[str]] = field(default_factory=dict)  # env -> what the format cannot carry

    def to_json(self) -> dict[str, Any]:
        return {"out": self.out, "exported": self.exported, "refused": self.refused, "lost": self.lost}


def _names(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def refusals(bundle: EnvBundle) -> list[str]:
    """Every reason ``bundle`` cannot be written in the AWM format (empty: it can). An AWM
    environment is a FastAPI app over SQLite with SQLite-file verifiers; awm's own environments
    (Python tools and verifiers over Postgres, a Postgres schema) have none of the three."""
    reasons = []
    functions = [t.name for t in bundle.tools if t.route is None]
    if bundle.app is None:
        reasons.append(f"its {len(functions)} tools are Python functions (def name(db, **arguments)) over "
                       "Postgres, not routes of a FastAPI app: the AWM format carries only an app (gen_envs)")
    elif functions:
        reasons.append(f"tools {_names(functions)} are Python functions, not routes of its app")
    if not bundle.database.awm_schema:
        reasons.append("its schema is PostgreSQL DDL with no SQLite original (database.awm_schema, which "
                       "`awm catalog import` keeps): gen_db holds SQLite DDL")
    views = [t.id for t in bundle.tasks if any(v.inputs != "sqlite" for v in t.verifiers())]
    if views:
        reasons.append(f"the verifiers of {len(views)} task(s) ({_names(views)}) read Postgres views "
                       "(inputs 'db'); AWM verifiers read SQLite files")
    return reasons


def exportable(bundle: EnvBundle) -> str | None:
    """Why ``bundle`` cannot be written in the AWM format, or ``None``."""
    return "; ".join(refusals(bundle)) or None


# -- gen_sample: rows as SQLite literals the importer evaluates back to the same values ----------


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str) and value.startswith("\\x") and re.fullmatch(r"\\x[0-9a-f]*", value):
        return f"X'{value[2:]}'"  # bytea as the importer writes it: a blob literal reads back the same
    if isinstance(value, (dict, list)):
        value = json.dumps(value)
    text = "'" + str(value).replace("'", "''") + "'"
    if "\\'" in text:
        # The importer reads \' as a MySQL-style escape (the release has them), so a backslash
        # that ends up before a quote is spelt char(92).
        text = text.replace("\\", "' || char(92) || '")
    return text


def _inserts(bundle: EnvBundle) -> dict[str, Any]:
    tables = []
    for seed in bundle.database.seed:
        statements = []
        for row in seed.rows:
            columns = ", ".join(map(s2p.quote, row))
            values = ", ".join(_literal(v) for v in row.values())
            statements.append(f"INSERT INTO {s2p.quote(seed.table)} ({columns}) VALUES ({values});")
        tables.append({"table_name": seed.table, "insert_statements": statements})
    return {"tables": tables}


def _undeclared_seed(bundle: EnvBundle) -> list[str]:
    """Seed tables and columns that the SQLite schema does not declare: re-import cannot load
    them (the bundle was changed after its import, or the table is one only the app's ORM makes)."""
    tables, _ = _parse_schema({"db_schema": bundle.database.awm_schema}, EnvReport("", ""))
    declared = {t.name.lower(): {c.name.lower() for c in t.columns} for t in tables}
    missing = []
    for seed in bundle.database.seed:
        columns = declared.get(seed.table.lower())
        if columns is None:
            missing.append(f"table {seed.table}")
            continue
        extra = sorted({c for row in seed.rows for c in row if c.lower() not in columns})
        missing += [f"{seed.table}.{c}" for c in extra]
    return missing


# -- gen_spec: one endpoint per tool, read back by the importer as the same tool -----------------


def _param(prop: dict[str, Any], where: str, required: bool) -> dict[str, Any]:
    kinds = prop.get("type")
    kinds = [k for k in (kinds if isinstance(kinds, list) else [kinds]) if k and k != "null"]
    out: dict[str, Any] = {"param_type": where, "required": required}
    if kinds:  # no type stays no type: the importer then asks the app, as it did the first time
        out["type"] = _JSON_TYPES.get(kinds[0], "string")
    if prop.get("description"):
        out["description"] = prop["description"]
    if prop.get("examples"):
        out["example"] = prop["examples"][0]
    return out


def _summary(description: str) -> tuple[str, str]:
    """(summary, description) that the importer joins back (``summary + "\n\n" + description``,
    each stripped, empty ones left out) into exactly ``description``."""
    first, _, rest = description.partition("\n\n")
    if first and rest and first == first.strip() and rest == rest.strip():
        return first, rest
    return description, ""


def _endpoint(tool: Tool) -> dict[str, Any]:
    assert tool.route is not None
    summary, description = _summary(tool.description)
    required = set(tool.input_schema.get("required", []))
    params = {name: _param(prop, tool.route.params.get(name, "query"), name in required)
              for name, prop in tool.input_schema.get("properties", {}).items()}
    return {"path": tool.route.path, "method": tool.route.method, "summary": summary,
            "description": description, "operation_id": tool.route.operation_id or tool.name,
            "tags": [], "request_params": params, "response": {}, "required_tables": [], "required_fields": {}}


# -- verifiers and tasks -----------------------------------------------------------------------


def _raw_response(verifier: Verifier) -> str:
    if verifier.kind == "code":
        return ""
    return json.dumps({"reasoning": "", "python_code": verifier.code, "function_name": verifier.entrypoint,
                       "success_criteria": verifier.success_criteria, "failure_criteria": verifier.failure_criteria})


def _indexed(tasks: list[Task]) -> tuple[dict[int, Task], list[str]]:
    """Tasks by their AWM index: ``task_<n>`` keeps ``n``; any other id takes the next free one."""
    by_index = {int(m.group(1)): t for t in tasks if (m := _TASK_ID.match(t.id))}
    renamed = []
    for task in tasks:
        if _TASK_ID.match(task.id) is None:
            index = max(by_index, default=-1) + 1
            by_index[index] = task
            renamed.append(f"{task.id} -> task_{index}")
    return by_index, renamed


def _lost(bundle: EnvBundle, renamed: list[str]) -> list[str]:
    lost = []
    solved = [t.id for t in bundle.tasks if t.solution or t.final_answer]
    if solved:
        lost.append(f"reference solutions of {len(solved)} task(s), and the positive gates resting on them")
    if bundle.limits != Limits():
        lost.append(f"limits {bundle.limits.model_dump()} (re-import uses the defaults)")
    if bundle.verifier_prelude or bundle.tool_prelude:
        lost.append("tool and verifier preludes")
    judged_first = [t.id for t in bundle.tasks if t.verifier.kind == "judge" and t.alt_verifier is not None]
    if judged_first:
        lost.append(f"the judge as primary verifier of {_names(judged_first)} (re-import with --prefer judge)")
    criteria = [t.id for t in bundle.tasks for v in t.verifiers()
                if v.kind == "code" and (v.success_criteria or v.failure_criteria)]
    if criteria:
        lost.append(f"success/failure criteria of the code verifiers of {_names(criteria)}")
    other_entry = [t.id for t in bundle.tasks for v in t.verifiers()
                   if (m := _ENTRYPOINT.search(v.code)) is None or m.group(1) != v.entrypoint]
    if other_entry:
        lost.append(f"verifier entrypoints of {_names(other_entry)}: the importer calls the first "
                    "top-level def verify_...()")
    if renamed:
        lost.append(f"task ids {_names(renamed)} (AWM tasks are numbered)")
    undeclared = _undeclared_seed(bundle)
    if undeclared:
        lost.append(f"seed rows of {_names(undeclared)}: not declared by its SQLite schema")
    return lost


def _records(bundle: EnvBundle, files: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Append the environment's records to ``files``; returns what the format could not carry."""
    name = bundle.name
    by_index, renamed = _indexed(bundle.tasks)
    count = max(by_index, default=-1) + 1
    texts = [by_index[i].instruction if i in by_index else f"(task {i} was not imported)" for i in range(count)]
    db_path = f"./outputs/databases/{name}.db"
    files["gen_scenario"].append({"name": name, "description": bundle.scenario.description})
    files["gen_tasks"].append({"scenario": name, "tasks": texts})
    files["gen_db"].append({"scenario": name, "db_path": db_path, "db_schema": bundle.database.awm_schema})
    files["gen_sample"].append({"scenario": name, "sample_data": _inserts(bundle)})
    files["gen_spec"].append({"scenario": name, "api_spec": {"api_groups": [
        {"group_name": name, "endpoints": [_endpoint(t) for t in bundle.tools]}]}})
    files["gen_envs"].append({"scenario": name, "db_path": db_path, "full_code": bundle.app.code})  # type: ignore[union-attr]
    for index, task in sorted(by_index.items()):
        for verifier in task.verifiers():
            target = "gen_verifier.pure_code" if verifier.kind == "code" else "gen_verifier"
            files[target].append({"scenario": name, "task_idx": index, "task": task.instruction,
                                  "verification": {"code": verifier.code, "raw_response": _raw_response(verifier)}})
    return _lost(bundle, renamed)


def export_catalog(bundles: list[EnvBundle], out: Path) -> ExportReport:
    """Write the AWM files of every exportable bundle into ``out``; the others are refused, each
    with every reason, and what an exported one loses is listed."""
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport(str(out))
    files: dict[str, list[dict[str, Any]]] = {name: [] for name in FILES}
    for bundle in sorted(bundles, key=lambda b: b.name):
        why = exportable(bundle)
        if why is not None:
            report.refused[bundle.name] = why
            continue
        lost = _records(bundle, files)
        report.exported.append(bundle.name)
        if lost:
            report.lost[bundle.name] = lost
    for stem, records in files.items():
        with (out / f"{stem}.jsonl").open("w", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return report
