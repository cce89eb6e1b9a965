"""Export to the AWM-1K format (`awm catalog export --format awm`) on what the fixture's plain
round trip (tests/test_awm1k_import.py) does not reach: values and names that SQLite text must
spell carefully, tool descriptions and parameters the importer reads in its own way, task ids
that are not indices, a judge as the primary verifier, and environments the format cannot hold."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from awm import catalog
from awm.bundle import EnvBundle, SeedTable, Tool
from awm.importers.awm1k import import_awm_dir
from awm.importers.awm1k_export import export_catalog

FIXTURE = Path(__file__).with_name("fixtures") / "awm1k"
NOW = dt.datetime(2025, 6, 1)
LIB = "library_loans_1"

# Values the importer's SQLite evaluation must give back unchanged: a backslash before a quote
# (the importer reads \' as an escape), trailing backslashes, quotes, control characters and
# non-BMP text, a text that looks like bytea, floats that need all their digits, a huge integer.
AWKWARD = [
    {"id": 10, "order": 10, "group": "a\\'b", "body": "ends with \\", "score": 0.1 + 0.2, "raw": "\\x00ff"},
    {"id": 11, "order": -(2 ** 62), "group": "\\", "body": "'quoted' and ''doubled''", "score": 1e-300, "raw": "\\x"},
    {"id": 12, "order": 0, "group": "x\\\\'y\\'", "body": "tab\tnewline\nnul-free é ☃ 🚀", "score": -2.5e17, "raw": None},
    {"id": 13, "order": 1, "group": "", "body": "\\x0a", "score": None, "raw": None},
]


def _edit(path: Path, change: Any) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for record in records:
        change(record)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _source(tmp_path: Path) -> Path:
    """The fixture plus a table whose columns are SQL keywords, an endpoint with a summary and no
    description, and a parameter whose type neither gen_spec nor the app gives."""
    src = tmp_path / "src"
    shutil.copytree(FIXTURE, src, ignore=shutil.ignore_patterns("*.py"))

    def schema(record: dict[str, Any]) -> None:
        if record["scenario"] == LIB:
            record["db_schema"]["tables"].append({"name": "shelf_notes", "indexes": [], "ddl": (
                'CREATE TABLE shelf_notes (id INTEGER PRIMARY KEY, "order" INTEGER NOT NULL, "group" TEXT, '
                "body TEXT, score REAL, raw BLOB);")})

    def spec(record: dict[str, Any]) -> None:
        for group in record["api_spec"]["api_groups"]:
            for endpoint in group["endpoints"]:
                if endpoint["operation_id"] == "get_book":
                    endpoint["description"] = ""
                if endpoint["operation_id"] == "search_books":
                    endpoint["request_params"]["sort"] = {"type": "enum", "param_type": "query", "required": False,
                                                          "description": "Sort order."}

    _edit(src / "gen_db.jsonl", schema)
    _edit(src / "gen_spec.jsonl", spec)
    return src


def _import(src: Path, out: Path, **options: Any) -> EnvBundle:
    report = import_awm_dir(src, out, now=NOW, envs=[LIB], check=False, **options)
    assert [e.status for e in report.environments] == ["imported"], report.to_json()
    return catalog.load(out, [LIB])[0]


def test_awkward_values_names_descriptions_and_task_ids_round_trip(admin_dsn, tmp_path):
    lib = _import(_source(tmp_path), tmp_path / "first", admin_dsn=admin_dsn)
    assert lib.tool("get_book").description == "Get a book by ID"  # the cases are really there
    assert "type" not in lib.tool("search_books").input_schema["properties"]["sort"]
    assert all(s.table != "shelf_notes" for s in lib.database.seed)
    lib.database.seed.append(SeedTable(table="shelf_notes", rows=AWKWARD))
    emma = lib.task("task_2")
    emma.id = "emma_in_catalog"  # not an AWM index: written at the next free one

    report = export_catalog([lib], tmp_path / "awm")
    assert report.exported == [LIB] and report.refused == {}
    assert any("emma_in_catalog -> task_4" in x for x in report.lost[LIB]), report.lost
    sample = (tmp_path / "awm" / "gen_sample.jsonl").read_text()
    assert '\\"order\\"' in sample and "char(92)" in sample  # quoted keywords; backslash before a quote

    again = _import(tmp_path / "awm", tmp_path / "second", admin_dsn=admin_dsn)
    expected = lib.model_copy(deep=True)
    moved = expected.task("emma_in_catalog")
    moved.id = "task_4"
    expected.tasks = [t for t in expected.tasks if t is not moved] + [moved]
    assert again.model_dump(mode="json") == expected.model_dump(mode="json")
    rows = next(s for s in again.database.seed if s.table == "shelf_notes").rows
    assert rows == AWKWARD


def test_a_judge_primary_is_reported_and_comes_back_with_prefer_judge(admin_dsn, tmp_path):
    lib = _import(FIXTURE, tmp_path / "first", admin_dsn=admin_dsn)
    task = lib.task("task_0")
    assert task.alt_verifier is not None and task.alt_verifier.kind == "judge"
    task.verifier, task.alt_verifier = task.alt_verifier, task.verifier
    report = export_catalog([lib], tmp_path / "awm")
    assert any("judge as primary verifier of task_0" in x and "--prefer judge" in x for x in report.lost[LIB])
    again = _import(tmp_path / "awm", tmp_path / "second", admin_dsn=admin_dsn, prefer="judge")
    assert again.model_dump(mode="json") == lib.model_dump(mode="json")


def test_environments_the_format_cannot_hold_are_refused_with_every_reason(admin_dsn, tmp_path):
    starter = catalog.load("starter")
    lib = _import(FIXTURE, tmp_path / "first", admin_dsn=admin_dsn)
    mixed = lib.model_copy(deep=True)
    mixed.scenario.name = "mixed"
    mixed.tools.append(Tool(name="count_books", description="How many books.", input_schema={"type": "object"},
                            code="def count_books(db):\n    return db.scalar('SELECT count(*) FROM books')\n"))
    lib.database.seed.append(SeedTable(table="ghost", rows=[{"id": 1}]))  # no such table in its SQLite schema
    lib.database.seed[0].rows[0]["nickname"] = "Reader"  # nor such a column
    report = export_catalog([*starter, mixed, lib], tmp_path / "awm")
    assert report.exported == [LIB]
    assert any("seed rows of users.nickname, table ghost" in x for x in report.lost[LIB]), report.lost
    assert set(report.refused) == {"bike_shop", "crm", "project_tracker", "mixed"}
    crm = report.refused["crm"]
    assert "Python functions" in crm and "no SQLite original" in crm and "read Postgres views" in crm, crm
    assert report.refused["mixed"] == "tools count_books are Python functions, not routes of its app"
    exported = [json.loads(x)["name"] for x in (tmp_path / "awm" / "gen_scenario.jsonl").read_text().splitlines()]
    assert exported == [LIB]  # nothing of a refused environment is written


def test_cli_export_forms(admin_dsn, tmp_path):
    first = tmp_path / "first"
    _import(FIXTURE, first, admin_dsn=admin_dsn)
    env = dict(os.environ, AWM_HOME=str(tmp_path / "home"))

    def awm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "awm.cli", "catalog", "export", *args], capture_output=True,
                              text=True, env=env, timeout=300)

    done = awm("--format", "awm", "--out", str(tmp_path / "a"), str(first))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "a" / "export-report.json").read_text())["exported"] == [LIB]
    assert (tmp_path / "a" / "gen_envs.jsonl").read_text().count("\n") == 1
    # The older form (OUTPUT, --catalog); only refused environments: exit 1, each one said why.
    refused = awm(str(tmp_path / "b"), "--catalog", "starter", "--format", "awm")
    assert refused.returncode == 1 and "not exported crm" in " ".join(refused.stderr.split())
    twice = awm("--out", str(tmp_path / "c"), str(first), "--catalog", "starter")
    assert twice.returncode == 2 and "once" in twice.stderr
    assert awm("--format", "awm").returncode == 2  # nowhere to write
