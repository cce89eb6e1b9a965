"""Import a directory in the AWM-1K release format into a catalog of awm bundles, plus a report.

Input (``Snowflake/AgentWorldModel-1K`` layout): ``gen_scenario.jsonl``, ``gen_tasks.jsonl``,
``gen_db.jsonl``, ``gen_sample.jsonl``, ``gen_spec.jsonl``, ``gen_envs.jsonl`` and
``gen_verifier.pure_code.jsonl`` (code mode) and/or ``gen_verifier.jsonl`` (sql mode), joined on
the normalised scenario name. Verifier files carry duplicate ``(scenario, task_idx)`` rows from
append-mode resumes; the first one wins, as in the reference readers.

Per environment:

1. the schema is translated to PostgreSQL and the inserts evaluated (:mod:`.sqlite_to_pg`), with
   the column types the app's ORM uses (from :mod:`.app_probe`, run in a child process);
2. everything is loaded into a scratch database, statement by statement and row by row, so that
   each table, constraint, index and row that PostgreSQL refuses is *reported* with its reason
   and left out, never lost silently; then the finished bundle is loaded the way the fleet loads
   it (``provision.load_snapshot``), which proves it;
3. tools are the gen_spec endpoints the app really serves (schemas from ``request_params``,
   routing from the app's own OpenAPI document); tasks keep *both* verifiers when the release has
   both: the code-mode one (``verify_task_completion(initial_db_path, final_db_path,
   final_answer)``, kind ``code``) and the sql-mode one (``verify_task(initial_db_path,
   final_db_path)`` returning evidence for the LLM judge, kind ``judge``, with the success and
   failure criteria of its ``raw_response``). The primary one is code mode when it exists (or the
   ``prefer``red kind); the report says which each task got. A verifier's kind is what its code
   does, not which file it came in: sql-mode-file code that builds the code mode's verdict
   (``{"result": "complete" | "others"}``, :func:`returns_code_verdict`) is served as a code
   verifier, no judge needed, and ``verifier_kind_detected`` says so;
4. every verifier is run, sandboxed, on the untouched snapshot: code verifiers that already say
   complete are a flaw of the source data and are listed (their negative gate fails too), and
   judge verifiers must at least produce JSON evidence there.

Imported tasks have no reference solution, so they have not passed the positive gate: they are
served only with ``--allow-ungated`` until ``awm gen solution`` gives them one.

Timestamps written as ``datetime('now', ...)`` are evaluated against one reference instant (the
import date at 00:00 UTC unless given), so the same input and reference give the same snapshot.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import keyword
import os
import re
import secrets
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import ValidationError

from awm import settings
from awm.bundle import (App, Database, EnvBundle, Limits, Route, Scenario, SeedTable, Task, Tool, Verifier)
from awm.gates import EpisodeReport
from awm.gates import record as record_gate
from awm.importers import sqlite_to_pg as s2p
from awm.importers.app_probe import MARKER
from awm.postgres import provision

FILES = ("gen_scenario", "gen_tasks", "gen_db", "gen_sample", "gen_spec", "gen_envs", "gen_verifier",
         "gen_verifier.pure_code")
REQUIRED = ("gen_db", "gen_sample", "gen_envs", "gen_tasks")
_SPEC_TYPES = {"string": "string", "str": "string", "text": "string", "integer": "integer", "int": "integer",
               "number": "number", "float": "number", "double": "number", "decimal": "number",
               "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
               "object": "object", "dict": "object", "datetime": "string", "date": "string"}


class SourceError(RuntimeError):
    """The source directory is not in the AWM-1K format."""


def normalize_scenario_name(name: str) -> str:
    """The reference's join key: lowercase, [^a-z0-9_] -> _, runs collapsed, ends stripped."""
    text = re.sub(r"[^a-z0-9_]", "_", name.lower())
    return re.sub(r"_+", "_", text).strip("_")


def env_identifier(scenario: str) -> str:
    """A bundle name (``^[a-z][a-z0-9_]{0,62}$``) for a normalised scenario name."""
    name = scenario if re.match(r"^[a-z]", scenario) else f"s_{scenario}"
    name = name[:63].rstrip("_") or "scenario"
    return "report_env" if name == "report" else name  # report.json is the import report


# -- report ----------------------------------------------------------------------------------


@dataclass
class EnvReport:
    name: str
    scenario: str
    status: str = "imported"  # imported | skipped
    reason: str = ""
    tables: int = 0
    tables_failed: list[dict[str, str]] = field(default_factory=list)
    rows_loaded: int = 0
    rows_rejected: list[dict[str, Any]] = field(default_factory=list)
    escapes_repaired: int = 0
    tools_served: int = 0
    tools_not_served: list[dict[str, str]] = field(default_factory=list)
    tasks: int = 0
    tasks_served: int = 0
    code_verifier_tasks: int = 0
    judge_verifier_tasks: int = 0
    both_verifier_tasks: int = 0
    verifier_of: dict[str, str] = field(default_factory=dict)  # task id -> primary kind, "+" when both
    # Verifiers whose code says they are of the other mode than their file (task id -> what was
    # detected, e.g. "code verifier in the sql-mode file"): served as what they are.
    verifier_kind_detected: dict[str, str] = field(default_factory=dict)
    sql_only_tasks: list[str] = field(default_factory=list)
    no_verifier_tasks: list[str] = field(default_factory=list)
    broken_verifier_tasks: list[dict[str, str]] = field(default_factory=list)
    duplicate_verifier_rows: int = 0
    complete_on_untouched: list[str] = field(default_factory=list)
    verifier_errors_on_untouched: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class ImportReport:
    source: str
    out: str
    reference_time: str
    environments: list[EnvReport] = field(default_factory=list)

    @property
    def totals(self) -> dict[str, int]:
        envs = self.environments
        return {
            "environments": len(envs),
            "imported": sum(e.status == "imported" for e in envs),
            "rows_loaded": sum(e.rows_loaded for e in envs),
            "rows_rejected": sum(len(e.rows_rejected) for e in envs),
            "tools_served": sum(e.tools_served for e in envs),
            "tasks": sum(e.tasks for e in envs),
            "tasks_served": sum(e.tasks_served for e in envs),
            "code_verifier_tasks": sum(e.code_verifier_tasks for e in envs),
            "judge_verifier_tasks": sum(e.judge_verifier_tasks for e in envs),
            "both_verifier_tasks": sum(e.both_verifier_tasks for e in envs),
            "sql_only_tasks": sum(len(e.sql_only_tasks) for e in envs),
            "verifier_kind_detected": sum(len(e.verifier_kind_detected) for e in envs),
            "complete_on_untouched": sum(len(e.complete_on_untouched) for e in envs),
        }

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "out": self.out, "reference_time": self.reference_time,
                "totals": self.totals, "environments": [asdict(e) for e in self.environments]}


def print_report(report: ImportReport, console: Any) -> None:
    """A rich table, one row per environment, and the flaws worth reading."""
    from rich.table import Table

    table = Table(title=f"awm catalog import: {report.source} -> {report.out}")
    for col in ("environment", "status", "tables", "rows loaded", "rows rejected", "tools", "tasks",
                "served", "code verif.", "judge verif.", "judge only", "complete untouched"):
        table.add_column(col, justify="left" if col in ("environment", "status") else "right")
    for e in report.environments:
        style = "green" if e.status == "imported" else "red"
        table.add_row(e.name, f"[{style}]{e.status}[/{style}]", str(e.tables), str(e.rows_loaded),
                      str(len(e.rows_rejected)), str(e.tools_served), str(e.tasks), str(e.tasks_served),
                      str(e.code_verifier_tasks), str(e.judge_verifier_tasks), str(len(e.sql_only_tasks)),
                      str(len(e.complete_on_untouched)))
    t = report.totals
    table.add_section()
    table.add_row("total", f"{t['imported']}/{t['environments']}", "", str(t["rows_loaded"]), str(t["rows_rejected"]),
                  str(t["tools_served"]), str(t["tasks"]), str(t["tasks_served"]), str(t["code_verifier_tasks"]),
                  str(t["judge_verifier_tasks"]), str(t["sql_only_tasks"]), str(t["complete_on_untouched"]))
    console.print(table)
    for e in report.environments:
        if e.status != "imported":
            console.print(f"[red]skipped[/red] {e.name}: {e.reason}")
        for task in e.complete_on_untouched:
            console.print(f"[yellow]flawed task[/yellow] {e.name}/{task}: its verifier says complete on the "
                          "untouched snapshot (`awm catalog validate` fails it)")
        for row in e.rows_rejected[:5]:
            console.print(f"[yellow]row rejected[/yellow] {e.name}/{row['table']}: {row['reason']}")
        if len(e.rows_rejected) > 5:
            console.print(f"[yellow]...[/yellow] {len(e.rows_rejected) - 5} more rejected rows of {e.name} in report.json")
        if e.verifier_kind_detected:
            console.print(f"[cyan]verifier kind detected[/cyan] {e.name}: "
                          + "; ".join(f"{t}: {what}" for t, what in e.verifier_kind_detected.items()))
        if e.sql_only_tasks:
            console.print(f"[yellow]judge only[/yellow] {e.name}: {', '.join(e.sql_only_tasks)} have only a sql-mode "
                          "verifier: served with an LLM judge (--judge-base-url/--judge-model)")


# -- reading the release ---------------------------------------------------------------------


class _Jsonl:
    """One release file, indexed by scenario (byte offsets; the files reach hundreds of MB)."""

    def __init__(self, path: Path, key: str = "scenario") -> None:
        self.path = path
        self.offsets: dict[str, list[int]] = {}
        self.bad_lines = 0
        with path.open("rb") as handle:
            while True:
                offset = handle.tell()
                line = handle.readline()
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    name = json.loads(line).get(key)
                except (ValueError, AttributeError):
                    self.bad_lines += 1
                    continue
                if isinstance(name, str):
                    self.offsets.setdefault(normalize_scenario_name(name), []).append(offset)

    def records(self, scenario: str) -> list[dict[str, Any]]:
        out = []
        with self.path.open("rb") as handle:
            for offset in self.offsets.get(scenario, []):
                handle.seek(offset)
                out.append(json.loads(handle.readline()))
        return out

    def first(self, scenario: str) -> dict[str, Any] | None:
        found = self.records(scenario) if scenario in self.offsets else []
        return found[0] if found else None


@dataclass
class _Source:
    files: dict[str, _Jsonl]

    def first(self, kind: str, scenario: str) -> dict[str, Any] | None:
        source = self.files.get(kind)
        return source.first(scenario) if source else None

    def verifiers(self, kind: str, scenario: str) -> tuple[dict[int, dict[str, Any]], int]:
        """First verifier row per task index, and how many duplicates were skipped."""
        source = self.files.get(kind)
        rows: dict[int, dict[str, Any]] = {}
        duplicates = 0
        for record in source.records(scenario) if source else []:
            try:
                index = int(record.get("task_idx"))
            except (TypeError, ValueError):
                continue
            if index in rows:
                duplicates += 1
            else:
                rows[index] = record
        return rows, duplicates


def _open_source(src: Path) -> _Source:
    if not src.is_dir():
        raise SourceError(f"{src} is not a directory")
    files: dict[str, _Jsonl] = {}
    for kind in FILES:
        path = src / f"{kind}.jsonl"
        if path.exists():
            files[kind] = _Jsonl(path, key="name" if kind == "gen_scenario" else "scenario")
    missing = [k for k in REQUIRED if k not in files]
    if missing:
        raise SourceError(f"{src}: missing {', '.join(m + '.jsonl' for m in missing)}")
    if "gen_verifier" not in files and "gen_verifier.pure_code" not in files:
        raise SourceError(f"{src}: no verifier file (gen_verifier.pure_code.jsonl or gen_verifier.jsonl)")
    return _Source(files)


# -- the app probe ---------------------------------------------------------------------------


def probe_app(code: str, name: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """Load the app in a child process with a scrubbed environment and describe it."""
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH", "HOME", settings.names.AWM_ALLOW_WEAK_ISOLATION)}
    with tempfile.TemporaryDirectory(prefix="awm-probe-") as cwd:
        try:
            done = subprocess.run([sys.executable, "-m", "awm.importers.app_probe"],
                                  input=json.dumps({"code": code, "name": name}), capture_output=True, text=True,
                                  timeout=timeout_s, env=env, cwd=cwd)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"the app did not load within {timeout_s:g} s"}
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    return {"ok": False, "error": f"the app probe died (exit {done.returncode}): {done.stderr.strip()[-1500:]}"}


# -- building one environment ----------------------------------------------------------------


@dataclass
class _Built:
    bundle: EnvBundle | None
    report: EnvReport


def _topological(tables: list[s2p.TableSpec]) -> list[s2p.TableSpec]:
    """Parents before children (by foreign keys), otherwise in the given order; cycles keep it."""
    by_name = {t.name.lower(): t for t in tables}
    order: list[s2p.TableSpec] = []
    state: dict[str, int] = {}

    def visit(t: s2p.TableSpec) -> None:
        key = t.name.lower()
        if state.get(key):
            return
        state[key] = 1
        for fk in t.foreign_keys:
            parent = by_name.get(fk.ref_table.lower())
            if parent is not None and parent is not t and not state.get(parent.name.lower()):
                visit(parent)
        state[key] = 2
        order.append(t)

    for t in tables:
        visit(t)
    return order


def _parse_schema(db_record: dict[str, Any], report: EnvReport) -> tuple[list[s2p.TableSpec], list[str]]:
    tables: list[s2p.TableSpec] = []
    indexes: list[str] = []
    for entry in (db_record.get("db_schema") or {}).get("tables", []):
        name = str(entry.get("name", "?"))
        statements = s2p.split_statements(str(entry.get("ddl", "")))
        creates = [s for s in statements if re.match(r"\s*CREATE\s+(TEMP\w*\s+)?TABLE", s, re.I)]
        indexes += [s for s in statements if re.match(r"\s*CREATE\s+(UNIQUE\s+)?INDEX", s, re.I)]
        indexes += [str(i) for i in entry.get("indexes") or []]
        for other in statements:
            if other not in creates and not re.match(r"\s*CREATE\s+(UNIQUE\s+)?INDEX", other, re.I):
                report.warnings.append(f"table {name}: statement ignored: {other[:120]}")
        if not creates:
            report.tables_failed.append({"table": name, "reason": "no CREATE TABLE statement"})
            continue
        try:
            table = s2p.parse_table(creates[0])
        except s2p.DdlError as exc:
            report.tables_failed.append({"table": name, "reason": str(exc)})
            continue
        if any(t.name.lower() == table.name.lower() for t in tables):
            report.warnings.append(f"table {table.name} declared twice; the first declaration is used")
            continue
        tables.append(table)
    return tables, indexes


def _sample_statements(sample: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(table name given by the file, statement), in file order."""
    out = []
    for entry in ((sample or {}).get("sample_data") or {}).get("tables", []):
        for statement in entry.get("insert_statements") or []:
            out.append((str(entry.get("table_name", "")), str(statement)))
    return out


class _Scratch:
    """A throwaway database on the admin server."""

    def __init__(self, admin_dsn: str) -> None:
        self.admin_dsn = admin_dsn
        self.name = f"awm_import_{os.getpid()}_{secrets.token_hex(4)}"

    def __enter__(self) -> psycopg.Connection:
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'").format(
                sql.Identifier(self.name)))
        params = conninfo_to_dict(self.admin_dsn)
        params["dbname"] = self.name
        self.conn = psycopg.connect(make_conninfo(**params), autocommit=True)
        return self.conn

    def __exit__(self, *exc: object) -> None:
        self.conn.close()
        with psycopg.connect(self.admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))


def _try(conn: psycopg.Connection, statement: str | sql.Composable, params: Any = None) -> str | None:
    """Run one statement in its own transaction; the database's reason if it fails."""
    try:
        with conn.transaction():
            conn.execute(statement, params)
        return None
    except psycopg.Error as exc:
        return (exc.diag.message_primary or str(exc)).strip()


def _load_trial(conn: psycopg.Connection, tables: list[s2p.TableSpec], orm_only: dict[str, dict[str, Any]],
                indexes: list[str], rows: dict[str, list[dict[str, Any]]], report: EnvReport,
                ) -> tuple[list[str], list[s2p.TableSpec], dict[str, list[dict[str, Any]]]]:
    """Load into a scratch database piece by piece; keep what PostgreSQL accepts, report the rest."""
    ddl: list[str] = []
    created: list[s2p.TableSpec] = []
    for table in tables:
        statement = table.pg_create()
        error = _try(conn, statement)
        if error and table.has_checks:
            fallback = table.pg_create(with_checks=False)
            if _try(conn, fallback) is None:
                report.warnings.append(f"table {table.name}: CHECK constraints dropped ({error})")
                statement, error = fallback, None
        if error:
            report.tables_failed.append({"table": table.name, "reason": f"PostgreSQL: {error}"})
            continue
        ddl.append(statement)
        created.append(table)
    for name, entry in orm_only.items():
        if entry.get("pg_ddl") and _try(conn, entry["pg_ddl"]) is None:
            ddl.append(entry["pg_ddl"])
            report.warnings.append(f"table {name} exists only in the app's ORM; created empty (as create_all would)")
        else:
            report.warnings.append(f"table {name} exists only in the app's ORM and could not be created")
    created_names = {t.name for t in created}
    for table in created:
        for fk, statement in zip(table.foreign_keys, table.pg_foreign_keys()):
            error = _try(conn, statement) if fk.ref_table in created_names else "the referenced table does not exist"
            if error:
                report.warnings.append(f"table {table.name}: foreign key ({', '.join(fk.columns)}) -> "
                                       f"{fk.ref_table} dropped: {error}")
            else:
                ddl.append(statement)
    for index in indexes:
        try:
            statement = s2p.translate_index(index)
        except Exception as exc:  # noqa: BLE001 - sqlglot raises several types
            report.warnings.append(f"index dropped, cannot translate {index[:100]!r}: {exc}")
            continue
        error = _try(conn, statement)
        if error:
            report.warnings.append(f"index dropped: {index[:100]!r}: {error}")
        else:
            ddl.append(statement)
    accepted: dict[str, list[dict[str, Any]]] = {}
    for table in created:
        kept = []
        for index, row in enumerate(rows.get(table.name, [])):
            columns = list(row)
            statement = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                sql.Identifier(table.name), sql.SQL(", ").join(map(sql.Identifier, columns)),
                sql.SQL(", ").join(sql.Placeholder() * len(columns)))
            error = _try(conn, statement, [row[c] for c in columns])
            if error:
                report.rows_rejected.append({"table": table.name, "stage": "postgres", "index": index,
                                             "reason": f"PostgreSQL: {error}", "values": _short(row)})
            else:
                kept.append(row)
        accepted[table.name] = kept
    return ddl, created, accepted


def _sqlite_reject(r: s2p.Rejected) -> dict[str, Any]:
    """A statement SQLite refused ("index": the statement's position among the table's inserts)."""
    return {"table": r.table, "stage": "sqlite", "index": r.statement, "reason": r.reason, "values": r.sql}


def _short(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, default=str)[:300]


def _tool_schema(request_params: dict[str, Any], app_route: dict[str, Any], report: EnvReport,
                 op: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Input schema from gen_spec's request_params; locations from the app (which decides)."""
    properties: dict[str, Any] = {}
    required: list[str] = []
    locations: dict[str, str] = {}
    app_params: dict[str, str] = app_route.get("params", {})
    for name, spec in (request_params or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        prop: dict[str, Any] = {}
        json_type = _SPEC_TYPES.get(str(spec.get("type", "")).lower()) or app_route.get("types", {}).get(name)
        where = app_params.get(name) or str(spec.get("param_type") or "query")
        if name not in app_params:
            report.warnings.append(f"tool {op}: parameter {name} is in gen_spec but the app does not read it")
        is_required = bool(spec.get("required")) or where == "path" or name in app_route.get("required", [])
        if json_type:
            prop["type"] = json_type if is_required else [json_type, "null"]
        if spec.get("description"):
            prop["description"] = str(spec["description"])
        if "example" in spec and spec["example"] is not None:
            prop["examples"] = [spec["example"]]
        properties[name] = prop
        locations[name] = where if where in ("path", "query", "body") else "query"
        if is_required:
            required.append(name)
    for name in app_route.get("required", []):  # the app insists on it: the agent must see it
        if name not in properties:
            json_type = app_route.get("types", {}).get(name)
            properties[name] = {k: v for k, v in (("type", json_type),
                                                  ("description", app_route.get("descriptions", {}).get(name)))
                                if v}
            locations[name] = app_params[name]
            required.append(name)
            report.warnings.append(f"tool {op}: parameter {name} is required by the app but missing from gen_spec")
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema, locations


def _tool_name(operation_id: str) -> str:
    name = re.sub(r"[^a-z0-9_]", "_", re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", operation_id).lower())
    name = re.sub(r"_+", "_", name).strip("_")
    if not re.match(r"^[a-z]", name):
        name = f"op_{name}"
    name = name[:63]
    return name + "_" if keyword.iskeyword(name) else name


def _tools(spec: dict[str, Any] | None, routes: list[dict[str, Any]], report: EnvReport) -> list[Tool]:
    by_op = {r["operation_id"]: r for r in routes}
    endpoints = [e for g in ((spec or {}).get("api_spec") or {}).get("api_groups", []) for e in g.get("endpoints", [])]
    if not endpoints:  # no gen_spec for this environment: the app's own routes are the tools
        report.warnings.append("no gen_spec endpoints: tools come from the app's routes")
        endpoints = [{"operation_id": r["operation_id"], "summary": r["summary"], "description": r["description"],
                      "request_params": {k: {"param_type": v, "required": k in r["required"]}
                                         for k, v in r["params"].items()}} for r in routes]
    tools: list[Tool] = []
    seen: set[str] = set()
    for endpoint in endpoints:
        op = str(endpoint.get("operation_id") or "")
        route = by_op.get(op)
        if route is None:
            report.tools_not_served.append({"tool": op or "?", "reason": "the app has no route with this operation_id"})
            continue
        if route.get("bare_body"):
            report.tools_not_served.append({"tool": op, "reason": "the route's body is a bare value, not an object"})
            continue
        name = _tool_name(op)
        if name in seen:
            report.tools_not_served.append({"tool": op, "reason": f"duplicate tool name {name}"})
            continue
        schema, locations = _tool_schema(endpoint.get("request_params") or {}, route, report, op)
        if route["method"] not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
            report.tools_not_served.append({"tool": op, "reason": f"method {route['method']}"})
            continue
        description = "\n\n".join(x for x in (str(endpoint.get("summary") or "").strip(),
                                              str(endpoint.get("description") or "").strip()) if x) or op
        seen.add(name)
        tools.append(Tool(name=name, description=description, input_schema=schema,
                          route=Route(method=route["method"], path=route["path"], params=locations,
                                      operation_id=op)))
    return tools


_ENTRYPOINT = re.compile(r"^def\s+(verify_\w+)\s*\(", re.MULTILINE)
_CODE_RESULTS = {"complete", "others"}


def returns_code_verdict(code: str) -> bool:
    """Whether verifier code is a code-mode verifier by what it does: it builds the code mode's
    verdict, ``{"result": "complete" | "others"}`` (a dict display with that key and one of those
    strings, or ``x["result"] = "complete"``), rather than evidence for a judge. Some runs ship
    such code in the sql-mode file (``gen_verifier.jsonl``); its file name would send it to a judge
    that it does not need."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False

    def verdict(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and node.value in _CODE_RESULTS

    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "result" and (
                        verdict(value) or (isinstance(value, ast.IfExp) and verdict(value.body) and verdict(value.orelse))):
                    return True
        elif isinstance(node, ast.Assign) and verdict(node.value):
            for target in node.targets:
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "result"):
                    return True
    return False


def _verifier(kind: str, row: dict[str, Any] | None, task_id: str, report: EnvReport) -> Verifier | None:
    """One release verifier row as a bundle verifier, or ``None`` (absent; broken ones reported)."""
    verification = (row or {}).get("verification") or {}
    code = str(verification.get("code") or "")
    if not code.strip():
        return None
    try:
        compile(code, f"<{task_id} verifier>", "exec")
    except SyntaxError as exc:
        report.broken_verifier_tasks.append({"task": task_id, "kind": kind, "reason": f"SyntaxError: {exc}"})
        return None
    match = _ENTRYPOINT.search(code)
    if match is None:
        report.broken_verifier_tasks.append({"task": task_id, "kind": kind, "reason": "no top-level def verify_...()"})
        return None
    criteria: dict[str, Any] = {}
    if kind == "judge":
        with contextlib.suppress(ValueError, TypeError):
            raw = json.loads(str(verification.get("raw_response") or "{}"))
            criteria = raw if isinstance(raw, dict) else {}
    return Verifier(kind=kind, code=code, entrypoint=match.group(1), inputs="sqlite",  # type: ignore[arg-type]
                    success_criteria=str(criteria.get("success_criteria") or ""),
                    failure_criteria=str(criteria.get("failure_criteria") or ""))


def _tasks(task_texts: list[str], code_rows: dict[int, dict[str, Any]], sql_rows: dict[int, dict[str, Any]],
           report: EnvReport, prefer: str = "code") -> list[Task]:
    tasks = []
    for index, text in enumerate(task_texts):
        task_id = f"task_{index}"
        code = _verifier("code", code_rows.get(index), task_id, report)
        judge = _verifier("judge", sql_rows.get(index), task_id, report)
        if judge is not None and returns_code_verdict(judge.code):
            # The sql-mode file holds a code-mode verifier: a code verdict, no judge needed.
            if code is None:
                code = judge.model_copy(update={"kind": "code", "success_criteria": "", "failure_criteria": ""})
                report.verifier_kind_detected[task_id] = "code verifier in the sql-mode file: served as code"
            else:
                report.verifier_kind_detected[task_id] = ("code verifier in the sql-mode file: the code-mode "
                                                          "file's verifier is served, this one dropped")
            judge = None
        if code is None and judge is None:
            if index not in code_rows and index not in sql_rows:
                report.no_verifier_tasks.append(task_id)
            continue
        report.code_verifier_tasks += code is not None
        report.judge_verifier_tasks += judge is not None
        report.both_verifier_tasks += code is not None and judge is not None
        if code is None:
            report.sql_only_tasks.append(task_id)
        primary, alt = (judge, code) if (prefer == "judge" and judge) or code is None else (code, judge)
        report.verifier_of[task_id] = primary.kind + ("+" + alt.kind if alt else "")  # type: ignore[union-attr]
        tasks.append(Task(id=task_id, instruction=str(text).strip() or task_id, solution=[],
                          verifier=primary, alt_verifier=alt))  # type: ignore[arg-type]
    return tasks


def build_environment(source: _Source, scenario: str, admin_dsn: str, now: dt.datetime,
                      prefer: str = "code") -> _Built:
    """Everything but the untouched-state check, for one scenario."""
    name = env_identifier(scenario)
    report = EnvReport(name=name, scenario=scenario)
    scenario_record = source.first("gen_scenario", scenario) or {}
    tasks_record = source.first("gen_tasks", scenario) or {}
    db_record = source.first("gen_db", scenario)
    env_record = source.first("gen_envs", scenario)
    if db_record is None or env_record is None or not env_record.get("full_code"):
        report.status, report.reason = "skipped", "no gen_db or gen_envs record"
        return _Built(None, report)
    task_texts = [str(t) for t in tasks_record.get("tasks") or []]
    report.tasks = len(task_texts)

    tables, indexes = _parse_schema(db_record, report)
    probe = probe_app(str(env_record["full_code"]), name)
    if not probe.get("ok"):
        report.status, report.reason = "skipped", f"the app does not load: {probe.get('error')}"
        return _Built(None, report)
    orm_tables: dict[str, dict[str, Any]] = probe.get("tables", {})
    for table in tables:
        orm = orm_tables.get(table.name) or next(
            (v for k, v in orm_tables.items() if k.lower() == table.name.lower()), None)
        if orm:
            report.warnings += [f"column type {c}" for c in s2p.apply_orm_types(table, orm["columns"])]
            missing = [c for c in orm["columns"] if table.column(c) is None]
            if missing:
                report.warnings.append(f"table {table.name}: the app maps columns the schema lacks: {', '.join(missing)}")
        report.warnings += [f"table {table.name}: {note}" for note in table.notes]
    known = {t.name.lower() for t in tables}
    orm_only = {k: v for k, v in orm_tables.items() if k.lower() not in known}

    # Seed rows, evaluated by SQLite on the original schema.
    mirror = s2p.SqliteMirror(now)
    ordered = _topological(tables)
    usable = []
    for table in ordered:
        try:
            mirror.create(table)
            usable.append(table)
        except s2p.DdlError as exc:
            report.tables_failed.append({"table": table.name, "reason": str(exc)})
    by_table: dict[str, list[str]] = {}
    others: list[str] = []
    names = {t.name.lower(): t.name for t in usable}
    for hint, statement in _sample_statements(source.first("gen_sample", scenario)):
        target = s2p.insert_target(statement) or ""
        table = names.get(target.lower()) or (names.get(hint.lower()) if not target else None)
        if table:
            by_table.setdefault(table, []).append(statement)
        elif target:
            report.rows_rejected.append({"table": target, "stage": "sqlite", "index": None,
                                         "reason": f"table {target} was not created", "values": statement[:300]})
        else:
            others.append(statement)
    rows: dict[str, list[dict[str, Any]]] = {}
    for table in usable:
        result = mirror.run(table.name, by_table.get(table.name, []))
        report.escapes_repaired += result.escapes_fixed
        report.rows_rejected += [_sqlite_reject(r) for r in result.rejected]
    if others:
        result = mirror.run("(other statements)", others)
        report.rows_rejected += [_sqlite_reject(r) for r in result.rejected]
    for table in usable:
        kept = []
        for index, raw in enumerate(mirror.rows(table)):
            try:
                kept.append({c.name: s2p.to_pg_value(raw.get(c.name), c.pg_type) for c in table.columns})
            except s2p.ValueRejected as exc:
                report.rows_rejected.append({"table": table.name, "stage": "convert", "index": index,
                                             "reason": str(exc), "values": _short(raw)})
        rows[table.name] = kept

    with _Scratch(admin_dsn) as conn:
        ddl, created, accepted = _load_trial(conn, usable, orm_only, indexes, rows, report)
    if not created:
        report.status, report.reason = "skipped", "no table could be created"
        return _Built(None, report)
    report.tables = len(created)
    report.rows_loaded = sum(len(r) for r in accepted.values())
    sqlite_ddl = ";\n".join([t.sqlite_create() for t in created] +
                            [v["sqlite_ddl"] for k, v in orm_only.items() if v.get("sqlite_ddl")]) + ";"

    tools = _tools(source.first("gen_spec", scenario), probe.get("routes", []), report)
    report.tools_served = len(tools)
    if not tools:
        report.status, report.reason = "skipped", "the app serves none of the gen_spec endpoints"
        return _Built(None, report)
    code_rows, code_dups = source.verifiers("gen_verifier.pure_code", scenario)
    sql_rows, sql_dups = source.verifiers("gen_verifier", scenario)
    report.duplicate_verifier_rows = code_dups + sql_dups
    tasks = _tasks(task_texts, code_rows, sql_rows, report, prefer)
    description = str(scenario_record.get("description") or scenario).strip() or scenario
    try:
        bundle = EnvBundle(
            scenario=Scenario(name=name, description=description),
            database=Database(ddl=";\n".join(ddl) + ";", sqlite_ddl=sqlite_ddl,
                              awm_schema=db_record.get("db_schema") or None,
                              seed=[SeedTable(table=t.name, rows=accepted[t.name])
                                    for t in created if accepted.get(t.name)]),
            tools=tools, app=App(code=str(env_record["full_code"])), tasks=tasks, limits=Limits())
    except ValidationError as exc:
        report.status, report.reason = "skipped", f"invalid bundle: {exc}"
        return _Built(None, report)
    return _Built(bundle, report)


# -- the untouched-state check ----------------------------------------------------------------


async def check_untouched(bundle: EnvBundle, admin_dsn: str, pool: Any, report: EnvReport) -> None:
    """Load the bundle as the fleet would, then run every verifier on the untouched snapshot, in a
    confined worker (:mod:`awm.sandbox`), with the snapshot as both its initial and final state."""
    from awm.postgres import snapshot as snap
    from awm.postgres.sqlite_export import build_sqlite, read_tables
    from awm.sandbox.pool import WorkerFailure

    def load() -> bytes:
        with _Scratch(admin_dsn) as conn:
            provision.load_snapshot(conn, bundle)  # proves the bundle loads exactly as served
            return build_sqlite(bundle.database.sqlite_ddl or "", read_tables(conn, "public", snap.public_tables(conn)))

    snapshot = await asyncio.to_thread(load)

    def no_queries(message: dict[str, Any]) -> dict[str, Any]:
        return {"error": "no query views for SQLite verifiers"}

    for task in bundle.tasks:
        for verifier in task.verifiers():
            judged = verifier.kind == "judge"
            message = {"op": "verify", "code": verifier.code, "entrypoint": verifier.entrypoint, "answer": None,
                       "files": {"initial": snapshot, "final": snapshot}, "evidence": judged}
            try:
                reply = await asyncio.to_thread(pool.run, message, no_queries, bundle.limits.verifier_timeout_s)
            except WorkerFailure as exc:
                report.verifier_errors_on_untouched.append(
                    {"task": task.id, "kind": verifier.kind, "reason": f"{exc.kind}: {exc}"})
                continue
            if reply.get("op") != "done":
                report.verifier_errors_on_untouched.append(
                    {"task": task.id, "kind": verifier.kind,
                     "reason": f"{reply.get('kind', 'exception')}: {reply.get('reason', '')}"})
            elif not judged:
                # The code verifier's negative gate, on the snapshot as served: recorded.
                complete = reply.get("complete") is True
                if complete:
                    report.complete_on_untouched.append(task.id)
                negative = EpisodeReport(bundle.name, task.id, not complete, "complete" if complete else "incomplete",
                                         str(reply.get("reason") or ""))
                record_gate(bundle, task, "code", negative, None)


# -- the whole import ------------------------------------------------------------------------


def default_reference_time() -> dt.datetime:
    today = dt.datetime.now(dt.timezone.utc).date()
    return dt.datetime(today.year, today.month, today.day)


@contextlib.contextmanager
def _admin(admin_dsn: str | None) -> Iterator[str]:
    if admin_dsn:
        yield admin_dsn
        return
    from awm.fleet import Database as FleetDatabase

    database = FleetDatabase.open()
    try:
        yield database.admin_dsn
    finally:
        database.close()


async def import_awm_dir_async(src: Path, out: Path, *, admin_dsn: str | None = None,
                               now: dt.datetime | None = None, envs: list[str] | None = None,
                               check: bool = True, progress: Any = None, prefer: str = "code",
                               jobs: int | None = None) -> ImportReport:
    """See :func:`import_awm_dir`."""
    from awm.sandbox.pool import WorkerPool, WorkerSpec

    src, out = Path(src), Path(out)
    now = now or default_reference_time()
    source = await asyncio.to_thread(_open_source, src)
    # Every scenario with a schema or an app; one that lacks either is reported as skipped.
    scenarios = sorted(set(source.files["gen_envs"].offsets) | set(source.files["gen_db"].offsets))
    if envs:
        wanted = {normalize_scenario_name(e) for e in envs}
        scenarios = [s for s in scenarios if s in wanted or env_identifier(s) in wanted]
    out.mkdir(parents=True, exist_ok=True)
    report = ImportReport(str(src), str(out), now.isoformat(sep=" "))
    jobs = max(1, jobs or (os.cpu_count() or 1))
    # Environments are imported ``jobs`` at a time (each one's app probe is its own process and its
    # loading is mostly in Postgres), each with a confined worker of its own for the verifier checks.
    pool = WorkerPool(WorkerSpec(memory_mb=Limits().verifier_memory_mb), size=jobs) if check else None
    slots = asyncio.Semaphore(jobs)

    async def one(scenario: str, dsn: str) -> EnvReport:
        async with slots:
            if progress:
                progress(scenario)
            try:
                built = await asyncio.to_thread(build_environment, source, scenario, dsn, now, prefer)
                if built.bundle is not None and pool is not None:
                    await check_untouched(built.bundle, dsn, pool, built.report)
            except Exception as exc:  # noqa: BLE001 - one broken environment never stops the import
                built = _Built(None, EnvReport(env_identifier(scenario), scenario, "skipped",
                                               f"import failed: {type(exc).__name__}: {exc}"))
            if built.bundle is not None:
                built.report.tasks_served = len(built.bundle.tasks)
                (out / f"{built.bundle.name}.json").write_text(built.bundle.model_dump_json(indent=1))
            return built.report

    with _admin(admin_dsn) as dsn:
        await asyncio.to_thread(provision.ensure_group_roles, dsn)
        if pool is not None:
            await asyncio.to_thread(pool.start)
        try:
            report.environments = list(await asyncio.gather(*(one(s, dsn) for s in scenarios)))
        finally:
            if pool is not None:
                pool.close()
    (out / "report.json").write_text(json.dumps(report.to_json(), indent=2, default=str))
    return report


def import_awm_dir(src: Path, out: Path, **options: Any) -> ImportReport:
    """Import an AWM-1K release directory into ``out`` (one ``<env>.json`` bundle per
    environment, plus ``report.json``). Options: ``admin_dsn`` (default: the embedded server),
    ``now`` (reference instant for ``'now'``), ``envs`` (only these scenarios), ``check``
    (run verifiers on the untouched snapshot; default on), ``prefer`` (``code`` or ``judge``: the
    primary verifier of a task that has both), ``jobs`` (environments at once; default: the CPUs)."""
    return asyncio.run(import_awm_dir_async(src, out, **options))


# -- a release directory served as it is -------------------------------------------------------


@dataclass
class SourceScenario:
    """One scenario of a release as its users name it: the normalised name (OpenEnv's key), the
    bundle it was imported as, its description and *every* task text (also those without a
    verifier, which no bundle holds), in the release's order (a task's index is its ``task_idx``)."""

    name: str
    env: str
    description: str
    tasks: list[str]


def _scenarios_of(source: _Source) -> list[SourceScenario]:
    names = sorted(set(source.files["gen_envs"].offsets) | set(source.files["gen_db"].offsets))
    out = []
    for name in names:
        record = source.first("gen_scenario", name) or {}
        tasks = (source.first("gen_tasks", name) or {}).get("tasks") or []
        out.append(SourceScenario(name, env_identifier(name), str(record.get("description") or ""),
                                  [str(t) for t in tasks]))
    return out


def source_scenarios(src: Path) -> list[SourceScenario]:
    """Every scenario of a release directory with an app or a schema (what an import tries), in
    name order, with its description and task texts."""
    return _scenarios_of(_open_source(Path(src)))


def _importer_digest() -> bytes:
    """This importer's code: a fixed importer imports again."""
    here, h = Path(__file__).parent, hashlib.sha256()
    for code in (Path(__file__), here / "sqlite_to_pg.py", here / "app_probe.py", here.parent / "bundle.py"):
        h.update(code.read_bytes())
    return h.digest()


def source_digest(src: Path) -> str:
    """What an import of ``src`` depends on: the release files' bytes and this importer's code.
    Hashing ~1 GB of AWM-1K takes seconds; an import, minutes."""
    h = hashlib.sha256()
    for kind in FILES:
        path = Path(src) / f"{kind}.jsonl"
        h.update(f"{kind}\0{path.exists()}\0".encode())
        if path.exists():
            with path.open("rb") as handle:
                while chunk := handle.read(1 << 20):
                    h.update(chunk)
    h.update(_importer_digest())
    return h.hexdigest()[:20]


class Release:
    """A release directory served on demand: opened once (an index of byte offsets, seconds for
    AWM-1K), each scenario imported when it is first asked for and cached by the content of its own
    records and this importer's code, so a server of 1,000 scenarios starts at once and pays an
    import only for the scenarios its clients use, once. :meth:`close` ends its verifier worker."""

    def __init__(self, src: Path, admin_dsn: str, cache: Path | None = None, now: dt.datetime | None = None,
                 prefer: str = "code") -> None:
        from awm.catalog import cache_root

        self.src = Path(src)
        self.source = _open_source(self.src)
        self.scenarios = _scenarios_of(self.source)
        self.admin_dsn, self.prefer = admin_dsn, prefer
        self.now = now or default_reference_time()
        self.cache = (Path(cache) if cache else cache_root()) / "awm1k-scenarios"
        self._code = _importer_digest()
        self._pool: Any = None
        self._roles = False

    def digest(self, scenario: str) -> str:
        h = hashlib.sha256(self._code)
        for kind in FILES:
            for record in self.source.files[kind].records(scenario) if kind in self.source.files else []:
                h.update(kind.encode() + b"\0" + json.dumps(record, sort_keys=True, default=str).encode() + b"\0")
        return h.hexdigest()[:24]

    async def load(self, scenario: str) -> tuple[EnvBundle | None, EnvReport, bool]:
        """The scenario's bundle (None when it cannot be served), its report, and whether this call
        imported it (its flaws are new) or found it in the cache."""
        from awm.catalog import load_bundle
        from awm.sandbox.pool import WorkerPool, WorkerSpec

        folder = self.cache / self.digest(scenario)
        if (folder / "report.json").exists():
            report = EnvReport(**json.loads((folder / "report.json").read_text()))
            bundle_path = folder / "bundle.json"
            return (load_bundle(bundle_path) if bundle_path.exists() else None), report, False
        if not self._roles:
            await asyncio.to_thread(provision.ensure_group_roles, self.admin_dsn)
            self._roles = True
        if self._pool is None:
            self._pool = WorkerPool(WorkerSpec(memory_mb=Limits().verifier_memory_mb), size=1)
            await asyncio.to_thread(self._pool.start)
        try:
            built = await asyncio.to_thread(build_environment, self.source, scenario, self.admin_dsn, self.now,
                                            self.prefer)
            if built.bundle is not None:
                await check_untouched(built.bundle, self.admin_dsn, self._pool, built.report)
                built.report.tasks_served = len(built.bundle.tasks)
        except Exception as exc:  # noqa: BLE001 - one broken scenario never stops the others
            built = _Built(None, EnvReport(env_identifier(scenario), scenario, "skipped",
                                           f"import failed: {type(exc).__name__}: {exc}"))
        self.cache.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=self.cache))
        try:
            if built.bundle is not None:
                (scratch / "bundle.json").write_text(built.bundle.model_dump_json())
            (scratch / "report.json").write_text(json.dumps(asdict(built.report), default=str))
            with contextlib.suppress(OSError):  # another server imported it first: theirs is as good
                scratch.rename(folder)
        finally:
            if scratch.exists():
                import shutil

                shutil.rmtree(scratch, ignore_errors=True)
        return built.bundle, built.report, True

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


@dataclass
class CachedImport:
    """A release imported once: ``catalog`` holds the bundles and ``report.json``; ``fresh`` says
    whether this call imported it (its flaws were reported now) or found it in the cache."""

    catalog: Path
    report: dict[str, Any]
    fresh: bool


def import_cached(src: Path, cache: Path | None = None, **options: Any) -> CachedImport:
    """Import ``src`` unless an import of the same content is in the cache (``cache``, default
    :func:`awm.catalog.cache_root`). The import is written beside its final place and moved
    there whole, so a killed import never leaves a half catalog that a later run would serve."""
    from awm.catalog import cache_root

    src = Path(src)
    root = Path(cache) if cache else cache_root()
    target = root / f"awm1k-{source_digest(src)}"
    if (target / "report.json").exists():
        return CachedImport(target, json.loads((target / "report.json").read_text()), False)
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        report = import_awm_dir(src, scratch, **options)
        if not report.totals["imported"]:
            raise SourceError(f"{src}: no environment could be imported "
                              f"({'; '.join(f'{e.name}: {e.reason}' for e in report.environments[:5])})")
        try:
            scratch.rename(target)
        except OSError:  # another run finished the same import first: use theirs
            if not (target / "report.json").exists():
                raise
    finally:
        if scratch.exists():
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
    return CachedImport(target, json.loads((target / "report.json").read_text()), True)
