"""The synthesis pipeline against a scripted OpenAI-compatible endpoint: every repair path,
every error path, resume, dedup, and `gen all` ending in a catalog that is served and replayed."""

import json
import os
import subprocess
import sys

import pytest

from awm.demo import run_catalog
from awm.fleet import Database
from awm.synth import stages
from awm.synth.embed import HashingEmbedder, dedup
from awm.llm import LLMBadOutput, LLMClient, LLMSettings, LLMUnavailable, extract_json
from awm.synth.pipeline import run_stages
from awm.synth.store import StageOutput, read_jsonl
from tests.llm_server import Reply, ScriptedLLM
from tests.synth_script import Script


def _llm(url: str) -> LLMClient:
    settings = LLMSettings.from_env(url, "test-key", "scripted-model", 4)
    settings.retries = 3
    return LLMClient(settings)


# -- LLM client ----------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ('{"a": 1}', {"a": 1}),
    ('```json\n{"a": 1}\n```', {"a": 1}),
    ('Sure! Here it is:\n{"a": {"b": [1, 2]}}\nHope that helps.', {"a": {"b": [1, 2]}}),
])
def test_extract_json_repairs_unambiguous_wrapping(text, value):
    assert extract_json(text) == value


def test_extract_json_refuses_garbage():
    with pytest.raises(ValueError, match="not valid JSON"):
        extract_json('{"a": ')


async def test_retry_after_429_and_5xx_then_success():
    replies = iter([Reply(status=429, headers={"retry-after": "0"}), Reply(status=503), Reply.json({"tasks": ["x"]})])
    with ScriptedLLM(lambda stage, body, i: next(replies)) as server:
        llm = _llm(server.base_url)
        out = await llm.structured("task", "[awm-stage: task]", "go", stages._Tasks)
        await llm.close()
    assert out.tasks == ["x"] and llm.usage["task"].retries == 2 and llm.usage["task"].calls == 1


async def test_malformed_json_is_retried_with_the_error_never_dropped():
    replies = iter([Reply('{"tasks": ['), Reply.json({"wrong": 1}), Reply.json({"tasks": ["ok"]})])
    with ScriptedLLM(lambda stage, body, i: next(replies)) as server:
        llm = _llm(server.base_url)
        out = await llm.structured("task", "[awm-stage: task]", "go", stages._Tasks)
        second_prompt = server.requests[1][1]["messages"][-1]["content"]
        await llm.close()
    assert out.tasks == ["ok"] and llm.usage["task"].repairs == 2
    assert "could not be used" in second_prompt and "not valid JSON" in second_prompt


async def test_persistently_bad_output_is_an_error_not_an_empty_result():
    with ScriptedLLM(lambda stage, body, i: Reply("no json here")) as server:
        llm = _llm(server.base_url)
        with pytest.raises(LLMBadOutput, match="no valid _Tasks after 3 attempts"):
            await llm.structured("task", "[awm-stage: task]", "go", stages._Tasks)
        await llm.close()


async def test_unreachable_and_refusing_endpoints_are_clear_errors():
    llm = _llm("http://127.0.0.1:9/v1")
    with pytest.raises(LLMUnavailable, match="cannot reach"):
        await llm.complete("task", [{"role": "user", "content": "hi"}])
    await llm.close()
    with ScriptedLLM(lambda stage, body, i: Reply(status=401)) as server:
        llm = _llm(server.base_url)
        with pytest.raises(LLMUnavailable, match="refused the request: HTTP 401"):
            await llm.complete("task", [{"role": "user", "content": "hi"}])
        await llm.close()


def test_cli_exits_non_zero_when_the_endpoint_is_unreachable(tmp_path, pg):
    (tmp_path / "gen_scenario.jsonl").write_text(json.dumps({"name": "x", "description": "y"}) + "\n")
    env = dict(os.environ, AWM_HOME=str(pg.root.parent), AWM_LLM_BASE_URL="http://127.0.0.1:9/v1")
    result = subprocess.run([sys.executable, "-m", "awm.cli", "gen", "task", "--dir", str(tmp_path)],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 3
    assert "unavailable" in result.stderr and "cannot reach" in result.stderr
    assert not (tmp_path / "gen_tasks.jsonl").exists()


# -- store and dedup -----------------------------------------------------------------------

def test_stage_output_resumes_without_duplicates(tmp_path):
    path = tmp_path / "gen_tasks.jsonl"
    out = StageOutput(path, lambda r: r["scenario"])
    out.append({"scenario": "a", "tasks": [1]})
    out.append({"scenario": "a", "tasks": [2]})  # same key: ignored
    with open(path, "a") as handle:
        handle.write('{"scenario": "b", "tas')  # a write torn by a crash
    again = StageOutput(path, lambda r: r["scenario"])
    assert list(again.done) == ["a"] and "b" not in again
    again.append({"scenario": "b", "tasks": [3]})
    assert [r["scenario"] for r in read_jsonl(path)] == ["a", "b"]
    with pytest.raises(ValueError, match="never overwrites its input"):
        StageOutput(path, lambda r: r["scenario"], inputs=[path])


async def test_dedup_rejects_near_duplicates_and_full_categories():
    emb = HashingEmbedder()
    pool = await emb.embed(["online_bookshop: an online shop selling books and e-books"])
    candidates = [
        {"name": "online_book_shop", "description": "an online shop selling books and ebooks", "category": "shop"},
        {"name": "vet_clinic", "description": "a veterinary clinic booking pets' appointments", "category": "health"},
        {"name": "dentist", "description": "a dental practice with patient appointments", "category": "health"},
    ]
    vectors = await emb.embed([f"{c['name']}: {c['description']}" for c in candidates])
    accepted, reasons = dedup(candidates, vectors, pool, 0.85, max_per_category=1, counts={})
    assert [c["name"] for c, _ in accepted] == ["vet_clinic"]
    assert "too similar" in reasons["online_book_shop"] and "is full" in reasons["dentist"]


# -- the whole pipeline ------------------------------------------------------------------------

@pytest.mark.slow
async def test_gen_all_repairs_every_failure_and_serves_the_result(tmp_path, admin_dsn, monkeypatch):
    script = Script(faults=True)
    with ScriptedLLM(script) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=3, num_tasks=2)
        seeds = tmp_path / "seeds.jsonl"
        seeds.write_text("")
        summary = await run_stages(run, stages.STAGES, seeds=seeds, target=2, embedder=HashingEmbedder())
        calls_before_resume = sum(server.counts.values())
        # A second run resumes: nothing left to do, no request, no duplicate line.
        again = stages.Run(tmp_path, llm, admin_dsn, attempts=3, num_tasks=2)
        await run_stages(again, stages.STAGES, seeds=seeds, target=2, embedder=HashingEmbedder())
        assert sum(server.counts.values()) == calls_before_resume
        await llm.close()

    for fault in ("scenario::fault", "db:library:fault", "sample:library:fault", "env:todo:fault",
                  "verifier:library:fault", "solution:todo:fault"):
        assert fault in script.served, fault
    assert summary["stages"]["verifier"]["kept"] == 4 and summary["stages"]["solution"]["kept"] == 4
    assert summary["tokens"]["task"]["retries"] >= 1 and summary["tokens"]["scenario"]["repairs"] >= 1
    assert summary["total_tokens"] > 0
    assert len(read_jsonl(tmp_path / "gen_verifier.jsonl")) == 4  # resume wrote nothing twice
    assert json.loads((tmp_path / "report.json").read_text())["environments"]

    # The catalog loads and serves as is: every task passes both gates through MCP.
    monkeypatch.setattr(Database, "open", classmethod(lambda cls, url=None: Database(admin_dsn)))
    from awm import catalog
    bundles = catalog.load(tmp_path / "catalog")
    assert sorted(b.name for b in bundles) == ["library", "todo"]
    # awm gen recorded both gates for every task it kept: the catalog is served gated.
    assert summary["gates"] == {"tasks": 4, "passed": 4}
    results, totals = await run_catalog(bundles, negative_gate=True, show_progress=False)
    assert totals["passed"] == totals["tasks"] == 4 and totals["ungated_skipped"] == 0
    assert all(r.negatives_passed == r.tasks for r in results)


async def test_items_that_never_validate_are_rejected_with_reasons(tmp_path, admin_dsn):
    def always_broken_ddl(stage, body, index):
        if stage == "db":
            return Reply.json({"ddl": "CREATE TABLE broken (id BIGSERIAL PRIMARY KEY, x INT REFERENCES nowhere(id));"})
        raise AssertionError(stage)

    (tmp_path / "gen_scenario.jsonl").write_text(json.dumps({"name": "library", "description": "d"}) + "\n")
    (tmp_path / "gen_tasks.jsonl").write_text(json.dumps({"scenario": "library", "tasks": ["a", "b"]}) + "\n")
    with ScriptedLLM(always_broken_ddl) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=2, num_tasks=2)
        await stages.stage_db(run)
        await llm.close()
        assert server.counts["db"] == 2
    assert not (tmp_path / "gen_db.jsonl").exists()
    rejected = read_jsonl(tmp_path / "gen_db.rejected.jsonl")
    assert rejected[0]["scenario"] == "library" and 'relation "nowhere" does not exist' in rejected[0]["errors"][0]
    assert run.report["db"]["rejected"] == 1


@pytest.mark.slow
async def test_gen_all_in_judge_mode_makes_judged_gated_tasks(tmp_path, admin_dsn, monkeypatch):
    """`awm gen all --verifier-mode judge`: evidence gatherers with success/failure criteria, each
    kept once the judge does not call the untouched state complete (one whose evidence is not JSON
    is repaired), solutions kept once the judge calls them complete, gates recorded with the judge;
    the catalog is served gated, judged by the same endpoint."""
    from awm.judge import JudgeSettings

    script = Script(faults=False, judge_mode=True)
    with ScriptedLLM(script) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=3, num_tasks=2, verifier_mode="judge")
        assert run.judge is not None and run.judge.base_url == server.base_url
        seeds = tmp_path / "seeds.jsonl"
        seeds.write_text("")
        summary = await run_stages(run, stages.STAGES, seeds=seeds, target=2, embedder=HashingEmbedder())
        await llm.close()
        assert "verifier:library:not-json" in script.served
        assert summary["stages"]["verifier"]["kept"] == 4 and summary["stages"]["solution"]["kept"] == 4
        assert summary["gates"] == {"tasks": 4, "passed": 4}
        from awm import catalog
        bundles = catalog.load(tmp_path / "catalog")
        tasks = [t for b in bundles for t in b.tasks]
        assert {t.verifier.kind for t in tasks} == {"judge"} and all(t.verifier.success_criteria for t in tasks)
        monkeypatch.setattr(Database, "open", classmethod(lambda cls, url=None: Database(admin_dsn)))
        results, totals = await run_catalog(bundles, show_progress=False,
                                            judge=JudgeSettings(base_url=server.base_url, model="m"))
        assert totals["passed"] == totals["tasks"] == 4


async def test_long_errors_are_summarised_before_they_are_fed_back(tmp_path, admin_dsn):
    """Short errors go back verbatim (no call); long ones are summarised by the LLM first; a
    summariser that fails leaves the errors cut to size, and the run goes on."""
    replies = [Reply.json({"guidance": "Column member_id does not exist: use members.id."}), Reply("no", status=400)]

    def answer(stage, body, index):
        assert stage == "summary"
        return replies.pop(0)

    with ScriptedLLM(answer) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn)
        assert "- one short error" in await stages.feedback(run, ["one short error"])
        assert server.counts["summary"] == 0
        long = [f"statement {i}: column member_id does not exist " + "x" * 200 for i in range(40)]
        summarised = await stages.feedback(run, long)
        assert "use members.id" in summarised and "summary of 40 error(s)" in summarised
        assert "statement 0:" in server.requests[0][1]["messages"][1]["content"]
        fallback = await stages.feedback(run, long)  # the summariser refuses: cut, not stopped
        assert "statement 0:" in fallback and "use members.id" not in fallback and len(fallback) < 6000
        await llm.close()


async def test_scenarios_are_classified_and_unsuitable_ones_are_not_synthesised(tmp_path, admin_dsn):
    """The reference's CRUD-suitability classification: every seed and generated scenario gets
    categories, a score and features; one below the threshold is recorded as rejected with the
    reason and never reaches the task stage; few-shot examples are the most suitable ones."""
    script = Script(faults=False)
    with ScriptedLLM(script) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, num_tasks=2)
        seeds = [{"name": "stock_ticker", "description": "A live stock price feed streamed from exchanges."},
                 {"name": "library", "description": "A public library: members borrow and return books."}]
        await stages.stage_scenario(run, seeds, target=3, embedder=HashingEmbedder())
        await llm.close()
    kept = {r["name"]: r for r in read_jsonl(tmp_path / "gen_scenario.jsonl")}
    assert "stock_ticker" not in kept and {"library", "todo"} <= set(kept)
    assert kept["library"]["classification"]["suitability_score"] == 8
    (refused,) = read_jsonl(tmp_path / "gen_scenario.rejected.jsonl")
    assert refused["name"] == "stock_ticker" and "score 2" in refused["errors"][0]
    assert server.counts["classify"] == 2  # the seeds, then the generated batch


def test_rows_for_a_schema_that_does_not_run_are_an_error_not_a_crash(admin_dsn):
    # --keep-best carries an unvalidated schema to the sample stage: found with a real model, whose
    # "DDL" was a numbered list of sentences; the seed check raised and ended the whole run.
    from awm.bundle import SeedTable
    from awm.synth.validate import check_seed

    errors = check_seed(admin_dsn, "2. Add a new task. 3. Add a new task.", [SeedTable(table="t", rows=[{"a": 1}])])
    assert len(errors) == 1 and "does not run" in errors[0] and "syntax error" in errors[0]


async def test_a_stage_that_keeps_nothing_stops_the_run_with_a_report(tmp_path, admin_dsn):
    # Found with a real model: its one scenario's rows were rejected, and the next stage then
    # ended the run with "gen_sample.jsonl does not exist (run the previous stage first)".
    (tmp_path / "gen_scenario.jsonl").write_text(json.dumps(
        {"name": "library", "description": "A library.", "category": "seed", "seed": True}) + "\n")
    with ScriptedLLM(Script(faults=False)) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=1, num_tasks=5)  # the script writes 2 tasks
        summary = await run_stages(run, ["task", "db", "sample"])
        await llm.close()
    assert summary["stopped_after"] == "task" and "db" not in summary["stages"]
    assert summary["stopped_because"] == ["library: need 5 distinct tasks, got 2"]
    assert json.loads((tmp_path / "report.json").read_text())["stopped_after"] == "task"


async def test_a_check_that_raises_fails_the_candidate_not_the_run(tmp_path, admin_dsn):
    from awm.synth import prompts

    with ScriptedLLM(Script(faults=False)) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=2, num_tasks=2)

        async def broken(reply):
            raise RuntimeError("the check itself failed")

        reply, errors = await stages._repair_loop(run, "task", prompts.TASK, prompts.task_user("library", "A library.", 2),
                                                  stages._Tasks, broken)
        await llm.close()
    assert reply is None and errors == ["validation failed: RuntimeError: the check itself failed"]


async def test_a_task_list_carried_on_by_keep_best_is_marked_unvalidated(tmp_path, admin_dsn):
    # Found with a real model (SmolLM2-135M): one repetitive "task" where three were asked for went
    # on as a validated task list under --keep-best, so nothing stopped it reaching the catalog.
    (tmp_path / "gen_scenario.jsonl").write_text(json.dumps(
        {"name": "library", "description": "A library.", "category": "seed", "seed": True}) + "\n")
    with ScriptedLLM(Script()) as server:
        llm = _llm(server.base_url)
        for keep_best in (True, False):
            run = stages.Run(tmp_path / str(keep_best), llm, admin_dsn, attempts=2, num_tasks=5, keep_best=keep_best)
            run.dir.mkdir()
            (run.dir / "gen_scenario.jsonl").write_text((tmp_path / "gen_scenario.jsonl").read_text())
            await stages.stage_task(run)
            kept = read_jsonl(run.dir / "gen_tasks.jsonl") if (run.dir / "gen_tasks.jsonl").exists() else []
            if keep_best:  # the script writes 2 tasks: the best attempt goes on, marked
                (record,) = kept
                assert "need 5 distinct tasks, got 2" in record["unvalidated"][0]
                assert run.report["task"]["unvalidated"] == 1 and run.report["task"]["kept"] == 0
            else:
                assert kept == [] and len(read_jsonl(run.dir / "gen_tasks.rejected.jsonl")) == 1
        await llm.close()


@pytest.mark.slow
async def test_keep_best_carries_a_failed_stage_on_but_never_into_the_catalog(tmp_path, admin_dsn):
    """--keep-best: the todo app's tools never stop crashing, so its env stage keeps its best
    attempt marked unvalidated; verifiers and solutions are still made for it (the run learns how
    far it gets), but the catalog takes only fully validated scenarios."""
    script = Script(faults=True, stubborn=True)
    with ScriptedLLM(script) as server:
        llm = _llm(server.base_url)
        run = stages.Run(tmp_path, llm, admin_dsn, attempts=2, num_tasks=2, keep_best=True)
        seeds = tmp_path / "seeds.jsonl"
        seeds.write_text("")
        summary = await run_stages(run, stages.STAGES, seeds=seeds, target=2, embedder=HashingEmbedder())
        await llm.close()
    envs = {r["scenario"]: r for r in read_jsonl(tmp_path / "gen_envs.jsonl")}
    assert "division by zero" in " ".join(envs["todo"]["unvalidated"]) and "unvalidated" not in envs["library"]
    assert summary["stages"]["env"]["unvalidated"] == 1
    assert any(v["scenario"] == "todo" for v in read_jsonl(tmp_path / "gen_verifier.jsonl"))  # carried on
    assert [e["name"] for e in summary["environments"]] == ["library"]
    (refused,) = summary["stages"]["assemble"]["rejections"]
    assert refused["item"] == "todo" and "unvalidated env" in refused["reasons"][0]
