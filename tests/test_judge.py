"""The code-augmented LLM judge: evidence from a confined verifier, the episode's own tool log,
a scripted OpenAI-compatible judge over HTTP, and real instances serving judge tasks."""

import asyncio
import json
import os
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from awm.bundle import Task, Verifier
from awm.client import ControlApiError, ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.gates import gate_status
from awm.judge import Judge, JudgeSettings, Step, majority, render_trajectory
from tests.llm_server import Reply, ScriptedLLM, user_text

KEY = "sk-judge-test-key-never-in-a-worker"

EVIDENCE = '''
def evidence_groceries(final, initial, answer):
    import os
    return {"groceries_after": final.query("SELECT title, body FROM notes WHERE title = 'groceries'"),
            "notes_before": initial.scalar("SELECT count(*) FROM notes"),
            "worker_environment": sorted(os.environ)}
'''


def judge_bundle(notes_bundle):
    """The notes environment with one judge task and one code task (no hostile ones)."""
    task = Task(id="groceries", instruction='Add a note titled "groceries" with the body "milk, eggs".',
                solution=[], verifier=Verifier(kind="judge", code=EVIDENCE, entrypoint="evidence_groceries",
                                               success_criteria="A note groceries with body milk, eggs exists.",
                                               failure_criteria="No such note, or a different body."))
    return notes_bundle.model_copy(update={"tasks": [task, notes_bundle.task("add_note")]})


class Script:
    """What the scripted judge answers next: a class, raw text, or an HTTP status."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.default = Reply.json({"reasoning": "the note exists", "classification": "complete"})

    def __call__(self, stage, body, index):
        return self.replies.pop(0) if self.replies else self.default

    def says(self, *classes: str) -> None:
        self.replies = [Reply.json({"reasoning": f"judged {c}", "classification": c}) for c in classes]


@pytest.fixture(scope="module")
def script():
    return Script()


@pytest.fixture(scope="module")
def llm(script):
    with ScriptedLLM(script) as server:
        yield server


@pytest.fixture(scope="module")
async def judged(admin_dsn, notes_bundle, llm):
    os.environ["AWM_JUDGE_API_KEY"] = KEY
    bundle = judge_bundle(notes_bundle)
    settings = JudgeSettings(base_url=llm.base_url, model="judge-model")
    fleet = LocalFleet([bundle], database=Database(admin_dsn), judge=settings, allow_ungated=True)
    await fleet.start()
    handle = fleet.instances[0]
    control = ControlClient(handle.control_url)
    async with McpSession(handle.mcp_url) as mcp:
        yield control, mcp, handle
    await control.close()
    await fleet.stop()
    os.environ.pop("AWM_JUDGE_API_KEY", None)


async def episode(control, mcp, body="milk, eggs"):
    await control.reset("groceries")
    out = await mcp.call_tool("add_note", {"title": "groceries", "body": body})
    assert not out.is_error
    return await control.verify("Done: I added the note.")


@pytest.mark.parametrize("cls, verdict, kind, reward", [
    ("complete", "complete", None, 1.0),
    ("incomplete", "incomplete", None, 0.0),
    ("agent_error", "agent_error", None, 0.0),
    ("server_error", "error", "server_error", 0.0),  # ours: the trainer masks it
])
async def test_every_judge_class(judged, llm, script, cls, verdict, kind, reward):
    control, mcp, _ = judged
    script.says(cls)
    result = await episode(control, mcp, body=f"milk, eggs ({cls})")  # a new state: no cache hit
    assert (result["verdict"], result["error_kind"], result["reward"]) == (verdict, kind, reward)
    assert result["verifier_kind"] == "judge" and result["judge"]["classification"] == cls
    assert result["judge"]["votes"] == [cls] and result["judge"]["agreement"] == 1.0
    assert result["evidence"]["groceries_after"][0]["body"] == f"milk, eggs ({cls})"


async def test_a_client_waits_for_a_judge_slower_than_its_request_deadline(judged, llm, script):
    """A judge may take its whole deadline (retries, votes: 180 s by default), longer than a
    client's deadline for one answer of an env server (60 s by default, here 1.5 s): the reset
    says how long (``judge_deadline_s``), and the client waits for the verdict instead of masking
    the episode as if the server hung (issue 46)."""
    _, mcp, handle = judged
    slow = ControlClient(handle.control_url, timeout=1.5)
    try:
        reset = await slow.reset("groceries")
        assert reset["judge_deadline_s"] >= 3
        assert not (await mcp.call_tool("add_note", {"title": "groceries", "body": "milk, eggs (slow)"})).is_error
        script.replies = [Reply(json.dumps({"reasoning": "slow but sure", "classification": "complete"}), delay_s=3.0)]
        result = await slow.verify("Done: I added the note.")
        assert result["verdict"] == "complete" and result["judge"]["reasoning"] == "slow but sure", result
        assert (await slow.info())["env"]  # any other request keeps the short deadline
    finally:
        await slow.close()


async def test_the_judge_sees_task_criteria_evidence_and_the_episode_log(judged, llm, script):
    control, mcp, _ = judged
    script.says("complete")
    before = len(llm.requests)
    result = await episode(control, mcp, body="oat milk")
    _, body = llm.requests[before]
    text = user_text(body)
    assert 'Add a note titled "groceries"' in text
    assert "A note groceries with body milk, eggs exists." in text and "a different body" in text
    assert '"oat milk"' in text  # the evidence, from the final database
    assert 'add_note({"body": "oat milk", "title": "groceries"}) -> ok' in text  # the server's own log
    assert "Done: I added the note." in text
    assert body["temperature"] == 0 and body["seed"] == 0 and body["model"] == "judge-model"
    # The verifier's worker has an empty environment: the judge's key is never within its reach.
    assert result["evidence"]["worker_environment"] == []
    assert KEY not in json.dumps(result)


async def test_cache_hit_for_the_same_task_evidence_and_trajectory(judged, llm, script):
    control, mcp, handle = judged
    script.says("incomplete")
    first = await episode(control, mcp, body="same state")
    requests = len(llm.requests)
    second = await episode(control, mcp, body="same state")
    assert len(llm.requests) == requests  # answered from the cache
    assert second["judge"]["cached"] is True and first["judge"]["cached"] is False
    assert second["verdict"] == first["verdict"] == "incomplete"
    async with httpx.AsyncClient() as client:
        text = (await client.get(handle.control_url + "/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("awm_judge_cache_hits_total", ())] >= 1
    assert samples[("awm_judge_tokens_total", (("kind", "prompt"),))] > 0
    assert samples[("awm_judge_verdicts_total", (("classification", "incomplete"),))] >= 1
    assert samples[("awm_judge_seconds_count", ())] >= 2


async def test_malformed_judge_output_is_asked_again_then_masked(judged, llm, script):
    control, mcp, _ = judged
    script.replies = [Reply("I think it is fine"), Reply.json({"reasoning": "ok", "classification": "complete"})]
    before = len(llm.requests)
    repaired = await episode(control, mcp, body="repaired")
    assert repaired["verdict"] == "complete"
    assert "malformed judge output" in user_text(llm.requests[before + 1][1])
    script.replies = [Reply("no json"), Reply.json({"classification": "maybe"})]
    masked = await episode(control, mcp, body="never valid")
    assert (masked["verdict"], masked["error_kind"]) == ("error", "judge")
    assert "malformed judge output" in masked["reason"]


async def test_a_judge_that_is_down_is_masked_and_the_instance_keeps_serving(judged, llm, script):
    control, mcp, _ = judged
    script.replies = [Reply("overloaded", status=503)] * 3
    result = await episode(control, mcp, body="judge down")
    assert (result["verdict"], result["error_kind"]) == ("error", "judge")
    assert "503" in result["reason"]
    script.says("complete")
    assert (await episode(control, mcp, body="judge back"))["verdict"] == "complete"


async def test_an_unreachable_judge_is_masked(admin_dsn, notes_bundle):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = JudgeSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=2, timeout_s=2)
    async with LocalFleet([judge_bundle(notes_bundle)], database=Database(admin_dsn), judge=settings,
                          allow_ungated=True) as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        async with McpSession(fleet.instances[0].mcp_url) as mcp:
            result = await episode(control, mcp)
            assert (result["verdict"], result["error_kind"]) == ("error", "judge")
            assert "cannot reach" in result["reason"]
            assert (await control.reset("add_note"))["task_id"] == "add_note"  # still serving
        await control.close()


async def test_votes_majority_and_agreement(admin_dsn, notes_bundle):
    script = Script()
    with ScriptedLLM(script) as llm:
        settings = JudgeSettings(base_url=llm.base_url, model="m", votes=3)
        async with LocalFleet([judge_bundle(notes_bundle)], database=Database(admin_dsn), judge=settings,
                              allow_ungated=True) as fleet:
            control = ControlClient(fleet.instances[0].control_url)
            async with McpSession(fleet.instances[0].mcp_url) as mcp:
                script.says("complete", "incomplete", "complete")
                result = await episode(control, mcp)
            await control.close()
        assert result["verdict"] == "complete"
        assert sorted(result["judge"]["votes"]) == ["complete", "complete", "incomplete"]
        assert result["judge"]["agreement"] == pytest.approx(2 / 3, abs=1e-3)
        seeds = sorted(body["seed"] for _, body in llm.requests)
        assert seeds == [0, 1, 2] and all(body["temperature"] == 0.7 for _, body in llm.requests)


async def test_gates_are_enforced_and_a_judge_task_needs_a_judge(admin_dsn, notes_bundle, llm, script):
    bundle = judge_bundle(notes_bundle)  # add_note carries its recorded gates; groceries has none
    async with LocalFleet([bundle], database=Database(admin_dsn)) as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        with pytest.raises(ControlApiError) as refused:
            await control.reset("groceries")
        assert refused.value.status == 403 and "has not passed both gates" in str(refused.value)
        assert "no gate record for its judge verifier" in str(refused.value)
        assert (await control.reset("add_note"))["ungated"] is False
        info = await control.info()
        assert {t["id"]: (t["gated"], t["served"]) for t in info["tasks"]} == {
            "groceries": (False, False), "add_note": (True, True)}
        await control.close()
    async with LocalFleet([bundle], database=Database(admin_dsn), allow_ungated=True) as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        with pytest.raises(ControlApiError) as no_judge:
            await control.reset("groceries")
        assert no_judge.value.status == 409 and "no judge configured" in str(no_judge.value)
        await control.close()
    settings = JudgeSettings(base_url=llm.base_url, model="judge-model")
    async with LocalFleet([bundle], database=Database(admin_dsn), allow_ungated=True, judge=settings) as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        assert (await control.reset("groceries"))["ungated"] is True
        script.says("incomplete")
        assert (await control.verify(None))["ungated"] is True
        async with httpx.AsyncClient() as client:
            text = (await client.get(fleet.instances[0].control_url + "/metrics")).text
        assert "awm_ungated_episodes_total 1.0" in text
        await control.close()


def test_trajectory_budget_cuts_the_middle_and_says_so():
    steps = [Step(tool=f"tool_{i % 3}", arguments={"i": i}, result="x" * 2000) for i in range(40)]
    text, report = render_trajectory(steps, "final words", budget_tokens=1000)
    assert len(text) < 1000 * 4 + 600
    assert report["steps"] == 40 and report["steps_omitted"] and report["results_clipped"] == 40
    assert text.startswith("[1] tool_0") and "[2] tool_1" in text and "[40] tool_0" in text
    omitted = report["steps_omitted"]
    assert f"steps {omitted[0]}-{omitted[-1]} omitted ({len(omitted)} calls" in text
    assert "final words" in text
    short, untouched = render_trajectory(steps[:2], None, budget_tokens=6000)
    assert untouched["steps_omitted"] == [] and untouched["results_clipped"] == 0 and "(no final answer)" in short


def test_majority_ties_never_pay():
    assert majority(["complete", "incomplete"]) == ("incomplete", 0.5)
    assert majority(["complete", "complete", "server_error"])[0] == "complete"


async def test_judge_client_sends_the_key_and_the_deadline_holds():
    seen = []

    def answer(stage, body, index):
        return Reply.json({"reasoning": "r", "classification": "incomplete"})

    with ScriptedLLM(answer) as llm:
        async def capture(request):
            seen.append(request.headers.get("authorization"))
        judge = Judge(JudgeSettings(base_url=llm.base_url, model="m"), api_key="sk-abc")
        judge._client._http.event_hooks["request"].append(capture)
        result = await judge.judge("task", {"e": 1}, [], None)
        await judge.close()
    assert result.classification == "incomplete" and seen == ["Bearer sk-abc"]

    async def slow(request):
        await asyncio.sleep(5)
        return httpx.Response(200, json={})
    judge = Judge(JudgeSettings(base_url="http://judge.invalid/v1", model="m", deadline_s=0.5))
    judge._client._http = httpx.AsyncClient(transport=httpx.MockTransport(slow))
    result = await judge.judge("task", {}, [], None)
    assert result.classification == "judge_error" and "did not answer within 0.5 s" in result.reasoning


def test_gate_status_follows_the_served_verifier(notes_bundle):
    bundle = judge_bundle(notes_bundle)
    assert gate_status(bundle, bundle.task("groceries")) == (False, "no gate record for its judge verifier")
