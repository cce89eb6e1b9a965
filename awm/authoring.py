"""Compile a hand-written environment source directory into an :class:`EnvBundle`.

People write environments as ordinary files (SQL, Python with type hints and docstrings, YAML);
machines exchange bundles (one JSON document). This module is the only bridge between the two:

    env.yaml       scenario, limits, tasks (id, instruction, solution, final_answer)
    schema.sql     PostgreSQL DDL
    seed.py        ``def rows() -> list[tuple[str, list[dict]]]`` (or seed.json: [{table, rows}])
    tools.py       every public top-level function is a tool ``def name(db, ...)``; its typed
                   signature becomes the input schema and its docstring the description; all
                   other top-level code is the shared tool prelude
    verifiers.py   ``def verify_<task id>(final, initial, answer)`` per task; other top-level
                   code is the shared verifier prelude
    gates.json     (written by ``awm catalog validate --record``) each task's gate records
"""

from __future__ import annotations

import ast
import inspect
import json
import runpy
from pathlib import Path
from typing import Any, Callable

import docstring_parser
import yaml
from pydantic import Field, create_model

from awm.bundle import Database, EnvBundle, SeedTable, Task, Tool, Verifier

SOURCE_MARKER = "env.yaml"


class ToolError(Exception):
    """Raised by tool code for an error the agent should see (also injected into tool code)."""


GATES = "gates.json"  # {task id: [GateRecord]}, written by `awm catalog validate --record`


def write_gates(path: Path, bundle: EnvBundle) -> Path:
    """Store a source directory's gate records (the rest of the directory is the author's)."""
    records = {t.id: [r.model_dump(mode="json") for r in t.gates] for t in bundle.tasks if t.gates}
    (path / GATES).write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    return path / GATES


def is_source_dir(path: Path) -> bool:
    return path.is_dir() and (path / SOURCE_MARKER).is_file()


def compile_source_dir(path: Path) -> EnvBundle:
    meta = yaml.safe_load((path / SOURCE_MARKER).read_text())
    tool_prelude, tools = _compile_tools((path / "tools.py").read_text(), path / "tools.py")
    verifier_prelude, verifiers = _split_module((path / "verifiers.py").read_text())
    gates = json.loads((path / GATES).read_text()) if (path / GATES).is_file() else {}
    tasks = []
    for raw in meta.get("tasks", []):
        entry = f"verify_{raw['id']}"
        if entry not in verifiers:
            raise ValueError(f"{path.name}: no {entry}() in verifiers.py for task {raw['id']!r}")
        tasks.append(
            Task(
                id=raw["id"],
                instruction=raw["instruction"].strip(),
                verifier=Verifier(code=verifiers.pop(entry), entrypoint=entry),
                solution=raw.get("solution", []),
                final_answer=raw.get("final_answer"),
                gates=gates.get(raw["id"], []),
            )
        )
    orphans = [name for name in verifiers if name.startswith("verify_")]
    if orphans:
        raise ValueError(f"{path.name}: verifiers without a task: {', '.join(sorted(orphans))}")
    verifier_prelude = "\n\n".join([verifier_prelude, *verifiers.values()]).strip()
    return EnvBundle(
        scenario=meta["scenario"],
        database=Database(ddl=(path / "schema.sql").read_text(), seed=_load_seed(path)),
        tool_prelude=tool_prelude,
        tools=tools,
        verifier_prelude=verifier_prelude,
        tasks=tasks,
        limits=meta.get("limits", {}),
    )


def _load_seed(path: Path) -> list[SeedTable]:
    if (path / "seed.py").is_file():
        namespace = runpy.run_path(str(path / "seed.py"))
        pairs = namespace["rows"]()
        return [SeedTable(table=table, rows=rows) for table, rows in pairs]
    if (path / "seed.json").is_file():
        return [SeedTable.model_validate(t) for t in json.loads((path / "seed.json").read_text())]
    return []


def _split_module(source: str) -> tuple[str, dict[str, str]]:
    """Split a module into (prelude, {public function name: source})."""
    tree = ast.parse(source)
    prelude: list[str] = []
    functions: dict[str, str] = {}
    for node in tree.body:
        segment = ast.get_source_segment(source, node, padded=False) or ""
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            functions[node.name] = segment
        elif isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
            continue  # module docstring
        else:
            prelude.append(segment)
    return "\n\n".join(prelude), functions


def _compile_tools(source: str, origin: Path) -> tuple[str, list[Tool]]:
    prelude, functions = _split_module(source)
    namespace: dict[str, Any] = {"ToolError": ToolError, "__name__": "awm_tools"}
    # dont_inherit: this module's "from __future__ import annotations" must not turn the
    # tool signatures into strings that pydantic cannot resolve.
    exec(compile(source, str(origin), "exec", dont_inherit=True), namespace)  # trusted source file
    tools = []
    for name, code in functions.items():
        fn = namespace[name]
        description, schema = describe_function(fn)
        tools.append(Tool(name=name, description=description, input_schema=schema, code=code))
    return prelude, tools


def describe_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """(description, JSON Schema of the arguments after the first) from a typed function."""
    doc = docstring_parser.parse(inspect.getdoc(fn) or "")
    param_docs = {p.arg_name: p.description for p in doc.params}
    description = "\n\n".join(x for x in (doc.short_description, doc.long_description) if x)
    if not description:
        raise ValueError(f"tool {fn.__name__} has no docstring")
    fields: dict[str, Any] = {}
    params = list(inspect.signature(fn).parameters.values())[1:]
    for p in params:
        if p.annotation is inspect.Parameter.empty:
            raise ValueError(f"tool {fn.__name__}: parameter {p.name} has no type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (p.annotation, Field(default, description=param_docs.get(p.name)))
    model = create_model(f"{fn.__name__}_args", **fields)
    schema = model.model_json_schema()
    _strip_titles(schema)
    schema["additionalProperties"] = False
    schema.setdefault("properties", {})
    return description, schema


def _strip_titles(node: Any) -> None:
    if isinstance(node, dict):
        node.pop("title", None)
        for key, value in node.items():
            if key != "properties":
                _strip_titles(value)
            else:
                for prop in value.values():
                    _strip_titles(prop)
    elif isinstance(node, list):
        for item in node:
            _strip_titles(item)
