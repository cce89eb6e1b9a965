"""Per-call database diffs: the env server's row-level ``GET /diff?rows=N`` and the trainer's
record of what each tool call changed (trainer/calldiff.py), on a real instance."""

import httpx

from awm.client import McpSession
from tests.llm_server import Reply
from tests.test_trainer_agent import by_turn, env, episode, native  # noqa: F401  (env: fixture)
from awm.trainer.agent import AgentConfig
from awm.episode.calldiff import call_diff


def note(id_, archived=False, title="t"):
    return {"id": id_, "title": title, "archived": archived}


def test_call_diff_of_keyed_rows_is_the_calls_own_change():
    snapshot_row, once, twice = note(2), note(2, True), note(2, True, "renamed")
    first = {"notes": {"key": ["id"], "inserted": [note(5)], "updated": [{"before": snapshot_row, "after": once}],
                       "deleted": [], "truncated": False}}
    second = {"notes": {"key": ["id"], "inserted": [], "updated": [{"before": snapshot_row, "after": twice}],
                        "deleted": [note(3)], "truncated": False}}
    change = call_diff(first, second)["notes"]
    # row 2 changed again (from the first call's value, not the snapshot's), 5 came and went, 3 went
    assert change["updated"] == [{"before": once, "after": twice}]
    assert change["deleted"] == [note(3), note(5)]
    assert change["inserted"] == [] and change["truncated"] is False
    assert call_diff(second, second) == {}
    # back to the snapshot: the row is "updated" back, from the previous value
    assert call_diff(second, {})["notes"]["updated"] == [{"before": twice, "after": snapshot_row}]


def test_call_diff_of_rows_without_a_key_is_a_multiset_difference():
    tag = {"note_id": 5, "tag": "x"}
    first = {"tags": {"key": [], "inserted": [tag], "updated": [], "deleted": [], "truncated": False}}
    second = {"tags": {"key": [], "inserted": [tag, tag], "updated": [], "deleted": [], "truncated": True}}
    change = call_diff(first, second)["tags"]
    assert change["inserted"] == [tag] and change["deleted"] == [] and change["truncated"] is True


async def test_row_diff_endpoint_and_its_limits(notes):
    async with httpx.AsyncClient(base_url=notes.control_url) as client:
        await client.post("/reset", json={"task_id": None})
        assert (await client.get("/diff?rows=abc")).status_code == 400
        assert (await client.get("/diff?rows=10001")).status_code == 400
        assert (await client.get("/diff?rows=5")).json()["rows"] == {}
        assert "rows" not in (await client.get("/diff")).json()
        # the counts of a rows answer are the plain answer's, whether the rows were cut or not
        async with McpSession(notes.mcp_url) as mcp:
            for title in ("a", "b", "c"):
                await mcp.call_tool("add_note", {"title": title, "tags": ["x", "y"]})
            await mcp.call_tool("archive_note", {"note_id": 1})
            await mcp.call_tool("add_then_crash", {"title": "ghost"})  # written, then rolled back
        plain = (await client.get("/diff")).json()["tables"]
        assert plain == {"notes": {"inserted": 3, "updated": 1, "deleted": 0},
                         "tags": {"inserted": 6, "updated": 0, "deleted": 0}}
        for limit in (2, 100):
            answer = (await client.get(f"/diff?rows={limit}")).json()
            assert answer["tables"] == plain
            assert answer["rows"]["tags"]["truncated"] is (limit == 2) and len(answer["rows"]["tags"]["inserted"]) == min(6, limit)


async def test_each_tool_call_records_what_it_changed(env, tmp_path):  # noqa: F811
    traj, _ = await episode(env, by_turn(
        Reply(content="", tool_calls=[native("add_note", {"title": "groceries", "tags": ["food", "food"]})]),
        Reply(content="", tool_calls=[native("archive_note", {"note_id": 5}, "c2"),
                                      native("find_note", {"title": "nope"}, "c3")]),
        Reply(content="", tool_calls=[native("list_notes", {}, "c4")]),
        Reply("done")), "add_note", tmp_path)
    added = traj.turns[0].results[0]["diff"]
    assert [r["title"] for r in added["notes"]["inserted"]] == ["groceries"]
    assert added["notes"]["key"] == ["id"] and added["notes"]["updated"] == added["notes"]["deleted"] == []
    assert added["tags"]["inserted"] == [{"note_id": 5, "tag": "food"}] * 2 and added["tags"]["key"] == []
    archived, failed = traj.turns[1].results
    (update,) = archived["diff"]["notes"]["updated"]
    assert (update["before"]["id"], update["before"]["archived"], update["after"]["archived"]) == (5, False, True)
    assert list(archived["diff"]) == ["notes"]  # the tags rows are the first call's, not this one's
    assert failed["is_error"] and "diff" not in failed  # a failed call's writes are rolled back
    assert traj.turns[2].results[0]["diff"] == {}  # a read changes nothing
    assert traj.diff == {"notes": {"inserted": 1, "updated": 0, "deleted": 0},
                         "tags": {"inserted": 2, "updated": 0, "deleted": 0}}


async def test_call_diffs_can_be_turned_off(env, tmp_path):  # noqa: F811
    traj, _ = await episode(env, by_turn(
        Reply(content="", tool_calls=[native("add_note", {"title": "groceries"})]), Reply("done")),
        "add_note", tmp_path, cfg=AgentConfig(max_turns=3, call_diff_rows=0))
    assert "diff" not in traj.turns[0].results[0]
