"""AWM-1K import: a verifier is imported as what its code is, not by its file. A run whose
sql-mode file (``gen_verifier.jsonl``) holds code-mode verifiers is served with code verdicts and
no judge; the report says what was detected."""

from __future__ import annotations

import asyncio
import json
import shutil

from awm import catalog
from awm.client import ControlClient
from awm.fleet import Database, LocalFleet
from awm.importers.awm1k import import_awm_dir, returns_code_verdict
from tests.test_awm1k_import import FIXTURE, NOW

# Task 3 of library_loans_1 asks how many books by Frank Herbert the library has.
CODE_MODE = '''def verify_task(initial_db_path: str, final_db_path: str, final_answer: str | None = None) -> dict:
    import sqlite3
    conn = sqlite3.connect(final_db_path)
    count = conn.execute("SELECT COUNT(*) FROM books WHERE author = 'Frank Herbert'").fetchone()[0]
    return {"result": "complete" if final_answer and str(count) in final_answer else "others"}
'''
EVIDENCE = '''def verify_task(initial_db_path, final_db_path):
    return {"herbert_books": 2, "result_rows": [], "status": "complete"}
'''


def test_code_mode_is_recognised_by_what_the_code_returns():
    assert returns_code_verdict(CODE_MODE)
    assert returns_code_verdict('def verify_task_completion(a, b, c):\n    return {"result": "others"}\n')
    assert returns_code_verdict('def verify_x(a, b):\n    out = {}\n    out["result"] = "complete"\n    return out\n')
    # evidence for a judge, even with words that look like a verdict, is not a code verdict
    assert not returns_code_verdict(EVIDENCE)
    assert not returns_code_verdict('def verify_task(a, b):\n    return {"result": rows(b)}\n')
    assert not returns_code_verdict("def verify_task(:\n")


async def test_a_sql_mode_file_of_code_verifiers_is_served_without_a_judge(admin_dsn, tmp_path):
    source = tmp_path / "run"
    shutil.copytree(FIXTURE, source)
    rows = [json.loads(line) for line in (source / "gen_verifier.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        if (row["scenario"], row["task_idx"]) == ("library_loans_1", 3):
            row["verification"]["code"] = CODE_MODE
    (source / "gen_verifier.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    out = tmp_path / "catalog"
    report = await asyncio.to_thread(import_awm_dir, source, out, admin_dsn=admin_dsn, now=NOW, envs=["library_loans_1"])
    (env,) = report.environments
    assert env.verifier_of["task_3"] == "code" and env.sql_only_tasks == []
    assert env.verifier_kind_detected == {"task_3": "code verifier in the sql-mode file: served as code"}
    assert env.verifier_of["task_0"] == "code+judge"  # evidence code in the same file stays a judge's
    assert env.verifier_errors_on_untouched == [] and "task_3" not in env.complete_on_untouched
    saved = json.loads((out / "report.json").read_text())
    assert saved["totals"]["verifier_kind_detected"] == 1

    (bundle,) = catalog.load(out)
    task = bundle.task("task_3")
    assert task.verifier.kind == "code" and task.alt_verifier is None
    fleet = LocalFleet([bundle], replicas=1, database=Database(admin_dsn), allow_ungated=True)  # no judge
    await fleet.start()
    control = ControlClient(fleet.instances[0].control_url)
    try:
        await control.reset("task_3")  # a judge task would be refused here (409: no judge configured)
        assert (await control.verify("I do not know."))["verdict"] == "incomplete"
        verdict = await control.verify("The library has 1 book by Frank Herbert.")
        assert verdict["verdict"] == "complete" and verdict["reward"] == 1.0, verdict
    finally:
        await control.close()
        await fleet.stop()
