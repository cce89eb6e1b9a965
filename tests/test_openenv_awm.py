"""OpenEnv's AWM environment protocol, served by awm (`awm openenv serve`), checked from its
documented models with a WebSocket client of this test's own: every reply must be what OpenEnv's
unmodified ``AWMEnv`` client accepts (its observation models forbid keys they do not name), and
the whole AWM-1K path runs for real (an AgentWorldModel-1K directory imported and served by a
late-binding pool, real Postgres, real confined workers, the LLM judge at a scripted endpoint).

The unmodified client and OpenEnv's example scripts were also run by hand against this server:
docs/integrations.md has the commands."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import websockets

from awm import catalog
from awm.episode.sources import PoolSource
from awm.fleet import Database, LocalFleet
from awm.importers.awm1k import import_cached, source_scenarios
from awm.integrations.openenv_awm import ProtocolServer, build_app, scenarios_from
from awm.judge import JudgeSettings

from tests.conftest import FIXTURES
from tests.llm_server import Reply, ScriptedLLM

RELEASE = FIXTURES / "awm1k"

# The fields of OpenEnv's AWM observation models (envs/agent_world_model_env/models.py, read with
# fetch): its client raises on any other key. A tool list goes to its list-tools model.
OBSERVATION_FIELDS = {"reward_type", "scenario", "task", "task_idx", "has_verifier", "num_tools", "tool_name",
                      "tool_result", "error", "warning", "verify_result", "steps_taken", "scenarios", "total",
                      "trajectory_path", "session_dir", "metadata"}
TOOLS_FIELDS = {"tools", "error", "metadata"}
TOOL_FIELDS = {"name", "description", "input_schema"}


def check_wire(reply: dict[str, Any]) -> dict[str, Any]:
    """A reply as the unmodified client parses it: an observation with only its models' keys."""
    assert reply["type"] == "observation", reply
    data = reply["data"]
    assert set(data) == {"observation", "reward", "done"}, data
    obs = data["observation"]
    if "tools" in obs:
        assert set(obs) <= TOOLS_FIELDS, set(obs) - TOOLS_FIELDS
        for tool in obs["tools"]:
            assert set(tool) <= TOOL_FIELDS and isinstance(tool["name"], str)
    else:
        assert set(obs) <= OBSERVATION_FIELDS, set(obs) - OBSERVATION_FIELDS
        for key in ("error", "warning", "task", "scenario", "reward_type"):
            assert obs.get(key) is None or isinstance(obs[key], str), (key, obs[key])
        if "has_verifier" in obs:
            assert set(obs["has_verifier"]) == {"sql", "code"}
    assert data["reward"] is None or isinstance(data["reward"], (int, float))
    assert isinstance(data["done"], bool)
    return {**obs, "reward": data["reward"], "done": data["done"]}


class Client:
    """This test's own client of the protocol: JSON messages over the WebSocket at /ws."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def send(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(message))
        return json.loads(await asyncio.wait_for(self.ws.recv(), 60))

    async def reset(self, **data: Any) -> dict[str, Any]:
        return check_wire(await self.send({"type": "reset", "data": data}))

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        return check_wire(await self.send({"type": "step", "data": {"type": "call_tool", "tool_name": tool,
                                                                     "arguments": arguments}}))

    async def list_tools(self) -> dict[str, Any]:
        return check_wire(await self.send({"type": "step", "data": {"type": "list_tools"}}))


@pytest.fixture(scope="module")
async def served(admin_dsn, tmp_path_factory):
    """The fixture release imported through the cache and served by two late-binding instances,
    with a scripted LLM judge for sql mode."""
    cache = tmp_path_factory.mktemp("catalog-cache")
    verdicts: list[str] = []

    def judge(stage: str, body: dict[str, Any], index: int) -> Reply:
        return Reply.json({"reasoning": "scripted", "classification": verdicts.pop(0) if verdicts else "incomplete"})

    with ScriptedLLM(judge) as llm:
        imported = await asyncio.to_thread(import_cached, RELEASE, cache, admin_dsn=admin_dsn)
        again = await asyncio.to_thread(import_cached, RELEASE, cache, admin_dsn=admin_dsn)
        assert imported.fresh and not again.fresh and again.catalog == imported.catalog
        bundles = catalog.load(imported.catalog)
        scenarios = scenarios_from(bundles, source_scenarios(RELEASE), imported.report)
        async with LocalFleet(bundles, 1, Database(admin_dsn), binding="late", instances=2, allow_ungated=True,
                              judge=JudgeSettings(base_url=llm.base_url, model="judge")) as fleet:
            pool = PoolSource.from_fleet(fleet, claim_timeout_s=30)
            server = ProtocolServer(pool, scenarios, idle_timeout_s=600, claim_timeout_s=30,
                                    sessions_dir=tmp_path_factory.mktemp("sessions"))
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            # pings every 0.5 s: a half-open connection (no pong) is found within about a second
            srv = uvicorn.Server(uvicorn.Config(build_app(server), host="127.0.0.1", port=port, log_level="warning",
                                                log_config=None, ws_ping_interval=0.5, ws_ping_timeout=0.5))
            task = asyncio.create_task(srv.serve())
            while not srv.started:
                await asyncio.sleep(0.02)
            yield {"url": f"ws://127.0.0.1:{port}/ws", "http": f"http://127.0.0.1:{port}", "server": server,
                   "pool": pool, "verdicts": verdicts, "port": port}
            srv.should_exit = True
            await task
            await pool.close()


async def connect(served: dict[str, Any]) -> Any:
    return websockets.connect(served["url"], max_size=None)


async def all_free(served: dict[str, Any]) -> None:
    """Every instance back in the pool (sessions ended), waited for a little."""
    pool = served["pool"]
    for _ in range(200):
        if pool.free() == pool.size:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{pool.size - pool.free()} instance(s) still held: {served['server'].stats()}")


async def test_a_whole_episode_as_the_awm_client_sees_it(served):
    async with await connect(served) as ws:
        c = Client(ws)
        listing = await c.call("__list_scenarios__")  # before any reset
        assert listing["reward_type"] == "tool_call_ok" and listing["total"] == 2
        names = {s["name"]: s for s in listing["scenarios"]}
        assert set(names) == {"library_loans_1", "pet_clinic_2"}
        assert names["library_loans_1"]["num_tasks"] == 4 and names["library_loans_1"]["tasks"][0].startswith("Borrow")

        reset = await c.reset(scenario="Library Loans 1", task_idx=0)  # the release's own spelling
        assert reset["reward_type"] == "reset_ok" and reset["scenario"] == "library_loans_1"
        assert reset["task"].startswith("Borrow a copy of 'The Hobbit'") and reset["task_idx"] == 0
        assert reset["has_verifier"] == {"sql": True, "code": True} and reset["num_tools"] == 5
        assert "ungated" in reset["warning"] and reset["reward"] is None and not reset["done"]

        tools = await c.list_tools()
        assert {t["name"] for t in tools["tools"]} == {"search_books", "get_book", "borrow_book", "return_book",
                                                       "list_my_loans"}
        assert all(t["input_schema"]["type"] == "object" for t in tools["tools"])

        found = await c.call("search_books", query="HOBBIT")
        assert found["reward_type"] == "tool_call_ok" and found["reward"] == 0.0 and found["tool_name"] == "search_books"
        assert isinstance(found["tool_result"], str) and json.loads(found["tool_result"])["books"][0]["id"] == 1

        before = await c.call("verify", verifier_mode="code")
        assert before["reward_type"] == "incomplete" and before["reward"] == 0.1 and not before["done"]
        assert before["verify_result"]["awm"]["masked"] is False

        # each failure with OpenEnv's reward type, awm's class first in the text
        unknown = await c.call("no_such_tool")
        assert (unknown["reward_type"], unknown["reward"]) == ("tool_not_found", -1.0)
        assert unknown["error"].startswith("unknown_tool: ")
        bad = await c.call("borrow_book", book_id="one")
        assert (bad["reward_type"], bad["reward"]) == ("invalid_args", -1.0) and bad["error"].startswith("invalid_arguments: ")
        missing = await c.call("get_book", book_id=999)
        assert missing["reward_type"] == "server_error" and missing["error"].startswith("tool_error: ")

        loan = await c.call("borrow_book", book_id=1)
        assert loan["reward_type"] == "tool_call_ok", loan
        after = await c.call("verify", verifier_mode="code", final_answer="Borrowed.")
        assert (after["reward_type"], after["reward"]) == ("complete", 1.0), after
        assert after["verify_result"]["verdict"] == "complete" and after["steps_taken"] == 8
        again = await c.call("verify", verifier_mode="code")  # repeatable: the episode goes on
        assert again["reward_type"] == "complete" and not again["done"]

        served["verdicts"][:] = ["complete"]
        judged = await c.call("verify", verifier_mode="sql")
        assert judged["reward_type"] == "complete" and judged["verify_result"]["verifier_kind"] == "judge"
        wrong = await c.call("verify", verifier_mode="both")
        assert wrong["reward_type"] == "invalid_args" and "verifier_mode" in wrong["error"]

        state = await c.send({"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 11

        done = await c.call("done", keep_session=True)
        assert done["done"] and (done["reward_type"], done["reward"]) == ("episode_done", 0.0)
        kept = Path(done["session_dir"])
        record = json.loads(Path(done["trajectory_path"]).read_text())
        assert record["scenario"] == "library_loans_1" and record["diff"]["tables"]["loans"]["inserted"] == 1
        assert [s["action"] for s in record["trajectory"]][:2] == ["list_tools", "call_tool"]
        assert (kept / "initial.db").read_bytes()[:15] == b"SQLite format 3" and (kept / "final.db").exists()
        assert (kept / "initial.db").read_bytes() != (kept / "final.db").read_bytes()

        over = await c.call("verify")
        assert over["done"] and over["reward_type"] == "episode_already_done" and over["reward"] is None
        await all_free(served)  # done gave the instance back while the session stays open

        # the next reset starts from the untouched database (a new episode, on any instance)
        fresh = await c.reset(scenario="library_loans_1", task_idx=0)
        assert fresh["reward_type"] == "reset_ok"
        assert (await c.call("verify"))["reward_type"] == "incomplete"


async def test_reset_errors_and_custom_tasks(served):
    async with await connect(served) as ws:
        c = Client(ws)
        assert (await c.reset())["error"] == "Parameter 'scenario' is required"
        unknown = await c.reset(scenario="no_such_scenario")
        assert unknown["reward_type"] == "reset_error" and "not found" in unknown["error"]
        out = await c.reset(scenario="pet_clinic_2", task_idx=7)
        assert out["reward_type"] == "reset_error" and out["error"] == "task_idx 7 out of range (0..1)"
        typed = await c.reset(scenario="pet_clinic_2", task_idx="first")
        assert typed["reward_type"] == "reset_error" and "task_idx" in typed["error"]
        rewards = await c.reset(scenario="pet_clinic_2", reward_config={"complete": "lots"})
        assert rewards["reward_type"] == "reset_error" and "reward_config" in rewards["error"]
        before = await c.call("list_my_pets")  # no episode after a failed reset
        assert before["reward_type"] == "server_error" and before["error"].startswith("unavailable")

        custom = await c.reset(scenario="pet_clinic_2", task="Tell me my pets' names.")
        assert custom["reward_type"] == "reset_ok" and custom["task"] == "Tell me my pets' names."
        assert "has_verifier" not in custom and "task_idx" not in custom
        assert (await c.call("list_my_pets"))["reward_type"] == "tool_call_ok"
        nothing = await c.call("verify")
        assert nothing["reward_type"] == "no_verifier" and nothing["reward"] == 0.0
        no_sql = await c.reset(scenario="pet_clinic_2", task_idx=0)
        assert no_sql["has_verifier"] == {"sql": False, "code": True}
        assert (await c.call("verify", verifier_mode="sql"))["reward_type"] == "no_verifier"


async def test_reward_config_is_the_sessions_own(served):
    async with await connect(served) as ws:
        c = Client(ws)
        config = {"complete": 2.0, "format_error": -0.5, "incomplete_code": 0.0}
        await c.reset(scenario="pet_clinic_2", task_idx=1, reward_config=config)
        assert (await c.call("nope"))["reward"] == -0.5
        unfinished = await c.call("verify")  # OpenEnv's code mode, asked for: "others", paying nothing
        assert (unfinished["reward_type"], unfinished["reward"]) == ("others", 0.0)
        listed = json.loads((await c.call("list_appointments"))["tool_result"])
        await c.call("cancel_appointment", appointment_id=listed["appointments"][0]["id"])
        assert (await c.call("verify"))["reward"] == 2.0
    async with await connect(served) as ws:  # another session: OpenEnv's defaults
        c = Client(ws)
        await c.reset(scenario="pet_clinic_2", task_idx=1)
        assert (await c.call("nope"))["reward"] == -1.0
        unfinished = await c.call("verify")
        assert (unfinished["reward_type"], unfinished["reward"]) == ("incomplete", 0.1)


async def test_environment_failures_and_flawed_tasks_are_never_paid(served):
    async with await connect(served) as ws:
        c = Client(ws)
        await c.reset(scenario="library_loans_1", task_idx=0)
        await c.call("borrow_book", book_id=1)
        crash = await c.call("return_book", loan_id=999)  # the release's code has no checks: it crashes
        assert crash["reward_type"] == "server_error" and crash["error"].startswith("tool_crashed: ")
        verdict = await c.call("verify")
        # complete by the verifier, but the agent acted on a broken environment: masked
        assert verdict["reward_type"] == "server_error" and verdict["verify_result"]["awm"]["masked"] is True
        assert verdict["verify_result"]["verdict"] == "complete"

        flawed = await c.reset(scenario="library_loans_1", task_idx=2)  # complete on the untouched database
        assert "flawed" in flawed["warning"]
        paid = await c.call("verify")
        assert paid["reward_type"] == "judge_error" and paid["reward"] == 0.0
        assert "untouched" in paid["verify_result"]["awm"]["mask_reason"]


async def test_bad_messages_get_errors_and_the_session_goes_on(served):
    async with await connect(served) as ws:
        c = Client(ws)
        await ws.send("{not json")
        assert json.loads(await ws.recv())["data"]["code"] == "INVALID_JSON"
        assert (await c.send({"type": "teleport"}))["data"]["code"] == "UNKNOWN_TYPE"
        bad = await c.send({"type": "step", "data": {"type": "call_tool", "arguments": {}}})
        assert bad["type"] == "error" and bad["data"]["code"] == "VALIDATION_ERROR"
        assert (await c.send({"type": "step", "data": ["x"]}))["data"]["code"] == "VALIDATION_ERROR"
        assert (await c.send({"type": "reset", "data": "x"}))["data"]["code"] == "VALIDATION_ERROR"
        huge = await c.reset(scenario="x" * 100_000)
        assert huge["reward_type"] == "reset_error"
        assert (await c.reset(scenario="pet_clinic_2"))["reward_type"] == "reset_ok"
    async with httpx.AsyncClient(base_url=served["http"]) as http:
        assert (await http.post("/reset", json={})).status_code == 400
        assert (await http.get("/health")).json() == {"status": "healthy"}
        assert (await http.get("/docs")).status_code == 200
        stats = (await http.get("/stats")).json()
        assert {"total_sessions", "max_idle_s", "scenarios"} <= set(stats) and stats["awm"]["instances"] == 2
    await all_free(served)


def _raw_ws(port: int) -> socket.socket:
    """A WebSocket opened by hand, which will never answer a ping: a peer that went half-open."""
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert b" 101 " in head.split(b"\r\n")[0], head
    return sock


def _frame(text: str) -> bytes:
    payload, mask = text.encode(), os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    length = len(payload)
    head = struct.pack("!BB", 0x81, 0x80 | length) if length < 126 else struct.pack("!BBH", 0x81, 0x80 | 126, length)
    return head + mask + masked


async def test_vanished_and_half_open_clients_give_their_instances_back(served):
    server, pool = served["server"], served["pool"]
    # a client that resets, then drops its TCP connection without closing the WebSocket
    ws = await websockets.connect(served["url"])
    await Client(ws).reset(scenario="pet_clinic_2", task_idx=0)
    assert pool.free() == pool.size - 1
    ws.transport.abort()
    await all_free(served)
    # a half-open peer: it reset, then went silent without a FIN (it never answers a ping)
    sock = await asyncio.to_thread(_raw_ws, served["port"])
    try:
        sock.sendall(_frame(json.dumps({"type": "reset", "data": {"scenario": "pet_clinic_2"}})))
        for _ in range(100):
            if pool.free() < pool.size:
                break
            await asyncio.sleep(0.05)
        assert pool.free() == pool.size - 1, "the half-open client's reset never claimed an instance"
        await all_free(served)  # the server's pings went unanswered: the session ended
        assert server.stats()["total_sessions"] == 0
    finally:
        sock.close()


async def test_idle_sessions_release_their_instance(served):
    server = served["server"]
    server.idle_timeout_s = 0.3
    try:
        async with await connect(served) as ws:
            c = Client(ws)
            await c.reset(scenario="pet_clinic_2", task_idx=0)
            await asyncio.sleep(0.4)
            await server.reap_idle()  # (the server's own sweep may have come first)
            await all_free(served)
            late = await c.call("list_my_pets")
            assert late["reward_type"] == "server_error" and "idle" in late["error"]
            assert (await c.reset(scenario="pet_clinic_2"))["reward_type"] == "reset_ok"  # and it goes on
    finally:
        server.idle_timeout_s = 600


async def test_a_thousand_sessions_at_once(served):
    """1,000 sessions open together (two instances between them): none wedges the server; every
    reset beyond the instances waits its turn, and every instance comes back."""
    sockets = []
    try:
        for _ in range(1000):
            sockets.append(await websockets.connect(served["url"], open_timeout=30))
        assert served["server"].stats()["total_sessions"] >= 1000
        listings = await asyncio.gather(*(Client(ws).call("__list_scenarios__") for ws in sockets[:200]))
        assert all(item["total"] == 2 for item in listings)

        async def episode(ws: Any) -> str:
            c = Client(ws)
            reset = await c.reset(scenario="pet_clinic_2", task_idx=0)
            assert reset["reward_type"] == "reset_ok", reset
            await c.call("list_my_pets")
            return (await c.call("done"))["reward_type"]

        assert await asyncio.gather(*(episode(ws) for ws in sockets[:12])) == ["episode_done"] * 12
    finally:
        await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    await all_free(served)
    for _ in range(100):
        if served["server"].stats()["total_sessions"] == 0:
            break
        await asyncio.sleep(0.05)
    assert served["server"].stats()["total_sessions"] == 0


async def test_capacity_is_a_clear_error(served):
    server = served["server"]
    server.max_sessions = len(server.sessions) + 1
    try:
        async with await connect(served) as first:
            await Client(first).call("__list_scenarios__")
            async with await connect(served) as second:
                refused = json.loads(await second.recv())
                assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
    finally:
        server.max_sessions = 10_000


async def test_the_documented_command_serves_a_release_on_demand(admin_dsn, tmp_path):
    """`awm openenv serve --awm-data DIR` as docs/integrations.md runs it: the release's scenarios
    are listed at once, one is imported to start the instances on, the other at its first reset
    (then cached: a second server imports nothing)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AWM_CATALOG_CACHE": str(tmp_path / "cache"), "AWM_DATABASE_URL": admin_dsn}
    for run in ("first", "cached"):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "awm.cli", "openenv", "serve", "--awm-data", str(RELEASE), "--instances", "2",
            "--port", str(port), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stderr is not None
            said = ""
            while "ws://" not in said:
                line = await asyncio.wait_for(proc.stderr.readline(), 300)
                assert line, f"the server ended: {said}"
                said += line.decode()
            async with httpx.AsyncClient() as http:
                before = (await http.get(f"http://127.0.0.1:{port}/stats")).json()
            # one imported to start the instances on (from the cache on the second run), one pending
            assert (before["awm"]["scenarios_imported"], before["awm"]["scenarios_pending"]) == (1, 1), before
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
                c = Client(ws)
                assert (await c.call("__list_scenarios__"))["total"] == 2
                for name, tools in (("pet_clinic_2", 4), ("library_loans_1", 5)):
                    reset = await c.reset(scenario=name, task_idx=0)
                    assert reset["reward_type"] == "reset_ok" and reset["num_tools"] == tools, reset
                    assert (await c.call("verify"))["reward_type"] == "incomplete"
            async with httpx.AsyncClient() as http:
                stats = (await http.get(f"http://127.0.0.1:{port}/stats")).json()
            assert stats["awm"]["scenarios_imported"] == 2 and stats["awm"]["scenarios_pending"] == 0
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 60)
        cached = sorted((tmp_path / "cache" / "awm1k-scenarios").iterdir())
        assert len([p for p in cached if not p.name.startswith(".")]) == 2, run
