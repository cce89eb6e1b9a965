"""Every starter task passes both gates, served for real and replayed through MCP: the
verifier says 'not complete' on the untouched snapshot and 'complete' after the solution."""

import pytest

from awm import catalog
from awm.demo import run_catalog
from awm.fleet import Database


@pytest.mark.slow
async def test_every_starter_task_passes_both_gates(admin_dsn, monkeypatch):
    bundles = catalog.load("starter")
    monkeypatch.setattr(Database, "open", classmethod(lambda cls, url=None: Database(admin_dsn)))
    results, totals = await run_catalog(bundles, show_progress=False, negative_gate=True, allow_ungated=True)
    problems = []
    for r, b in zip(results, bundles):
        assert r.served_tools == sorted(t.name for t in b.tools)
        problems += [f"{r.name}/{e.task_id} untouched: {e.verdict}: {e.reason}" for e in r.negatives if not e.ok]
        problems += [f"{r.name}/{e.task_id} solution: {e.verdict}: {e.reason}" for e in r.episodes if not e.ok]
    assert not problems, "\n".join(problems)
    assert totals["passed"] == totals["tasks"] >= 30


def test_every_starter_task_has_a_current_gate_record():
    """The starter's gates.json (awm catalog validate --record) must match its verifiers and seed:
    edit a verifier or the seed without re-recording and the task would be refused."""
    from awm import catalog
    from awm.gates import gate_status

    stale = [(b.name, t.id, gate_status(b, t)[1]) for b in catalog.load("starter") for t in b.tasks
             if not gate_status(b, t)[0]]
    assert stale == []
