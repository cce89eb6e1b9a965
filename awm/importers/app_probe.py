"""``python -m awm.importers.app_probe``: load one generated FastAPI app and describe it.

Run by the importer in a child process with a scrubbed environment (the app's code is untrusted
and runs its module body on import), confined by the kernel like a sandbox worker
(:mod:`awm.sandbox.confine`) before the app's code runs, and loaded exactly as a worker loads it
(:func:`awm.sandbox.appshim.load_app`, no database). Reads ``{"code", "name"}`` as JSON on
stdin and prints one JSON object: the routes that have an ``operation_id`` (method, path, where
each parameter goes, which are required, their JSON types) and the ORM's tables (column types,
and CREATE TABLE statements for PostgreSQL and SQLite, for tables the app creates itself).
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from awm import settings  # before the confinement: reading a variable afterwards needs no file

MARKER = "AWM_PROBE_RESULT "


def describe(code: str, name: str) -> dict[str, Any]:
    from awm.sandbox.appshim import load_app

    module, app = load_app(code, f"awm_app_{name}")
    return {"ok": True, "routes": _routes(app), "tables": _tables(module)}


def _routes(app: Any) -> list[dict[str, Any]]:
    """From the app's OpenAPI document (stable across FastAPI versions, and it already applies
    FastAPI's rules for flattening a single body model)."""
    document = app.openapi()
    components = document.get("components", {}).get("schemas", {})
    out = []
    for path, operations in document.get("paths", {}).items():
        for method, op in operations.items():
            if not isinstance(op, dict) or not op.get("operationId"):
                continue
            params: dict[str, str] = {}
            required: list[str] = []
            types: dict[str, str] = {}
            descriptions: dict[str, str] = {}
            for param in op.get("parameters", []):
                if param.get("in") not in ("path", "query"):
                    continue
                params[param["name"]] = param["in"]
                if param.get("required"):
                    required.append(param["name"])
                _describe(param["name"], _resolve(param.get("schema", {}), components), types, descriptions,
                          param.get("description"))
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            bare_body = False
            if body is not None:
                body = _resolve(body, components)
                if body.get("type") == "object" or "properties" in body:
                    for key, schema in body.get("properties", {}).items():
                        params[key] = "body"
                        _describe(key, _resolve(schema, components), types, descriptions, None)
                    required += list(body.get("required", []))
                else:
                    bare_body = True
            out.append({"operation_id": op["operationId"], "method": method.upper(), "path": path,
                        "params": params, "required": required, "types": types, "descriptions": descriptions,
                        "summary": op.get("summary", ""), "description": op.get("description", ""),
                        "bare_body": bare_body})
    return out


def _resolve(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if ref and ref.startswith("#/components/schemas/"):
        return components.get(ref.rsplit("/", 1)[1], {})
    if isinstance(schema, dict) and "allOf" in schema and len(schema["allOf"]) == 1:
        return _resolve(schema["allOf"][0], components)
    return schema if isinstance(schema, dict) else {}


def _describe(name: str, schema: dict[str, Any], types: dict[str, str], descriptions: dict[str, str],
              description: str | None) -> None:
    kind = schema.get("type")
    if kind is None:  # Optional[X] is anyOf [X, null]
        kinds = [s.get("type") for s in schema.get("anyOf", []) if isinstance(s, dict) and s.get("type") != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if isinstance(kind, str):
        types[name] = kind
    text = description or schema.get("description")
    if text:
        descriptions[name] = text


def _tables(module: Any) -> dict[str, Any]:
    from sqlalchemy import MetaData
    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.schema import CreateTable

    metadatas: list[MetaData] = []
    for value in vars(module).values():
        candidate = value if isinstance(value, MetaData) else getattr(value, "metadata", None)
        if isinstance(candidate, MetaData) and all(candidate is not m for m in metadatas):
            metadatas.append(candidate)
    tables: dict[str, Any] = {}
    for metadata in metadatas:
        for table in metadata.sorted_tables:
            columns = {}
            for column in table.columns:
                affinity = getattr(column.type, "_type_affinity", None)
                columns[column.name] = (affinity or type(column.type)).__name__
            entry: dict[str, Any] = {"columns": columns}
            for key, dialect in (("pg_ddl", postgresql.dialect()), ("sqlite_ddl", sqlite.dialect())):
                try:
                    entry[key] = str(CreateTable(table).compile(dialect=dialect)).strip()
                except Exception as exc:  # noqa: BLE001 - reported, not fatal
                    entry[key + "_error"] = f"{type(exc).__name__}: {exc}"
            tables[table.name] = entry
    return tables


def _confine() -> None:
    """Everything the probe needs is imported first; then the kernel confines this process."""
    import sqlalchemy.dialects.postgresql  # noqa: F401
    import sqlalchemy.dialects.sqlite  # noqa: F401
    import sqlalchemy.schema  # noqa: F401

    from awm.sandbox import appshim, confine
    from awm.sandbox.pool import read_paths

    appshim.prepare()
    report = confine.confine(read_paths(app=True), confine.Limits(memory_mb=2048))
    if not report.strong and not settings.AWM_ALLOW_WEAK_ISOLATION:
        raise SystemExit(f"refusing to load untrusted app code: confinement layers missing: {report.missing}")


def main() -> None:
    warnings.simplefilter("ignore")
    request = json.loads(sys.stdin.read())
    _confine()
    try:
        result = describe(request["code"], request["name"])
    except Exception as exc:  # noqa: BLE001 - the importer reports it
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    # The app's module body may print; the result is the last line, behind a marker.
    sys.stdout.write("\n" + MARKER + json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
