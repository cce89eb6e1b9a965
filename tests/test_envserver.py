"""The env server as a user meets it: a real process, real MCP clients over HTTP, the control
API, Prometheus metrics, and every kind of bad input."""

import asyncio
import json

import httpx
import pytest
from fastmcp import Client
from prometheus_client.parser import text_string_to_metric_families

from awm.client import ControlApiError, ControlClient, McpSession


@pytest.fixture
async def control(notes):
    client = ControlClient(notes.control_url)
    yield client
    await client.close()


@pytest.fixture
async def mcp(notes):
    async with McpSession(notes.mcp_url) as session:
        yield session


async def test_official_fastmcp_client_sees_exactly_the_tools(notes, notes_bundle):
    async with Client(notes.mcp_url) as client:
        tools = await client.list_tools()
        assert sorted(t.name for t in tools) == sorted(t.name for t in notes_bundle.tools)
        add = next(t for t in tools if t.name == "add_note")
        assert add.input_schema["required"] == ["title"]
        result = await client.call_tool("list_notes", {}, raise_on_error=False)
        assert not result.is_error
        assert [n["title"] for n in result.structured_content["result"]] == ["todo", "ideas", "books"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_official_sdk_client_sees_exactly_the_tools(notes, notes_bundle, mode):
    """The MCP SDK's own client: in ``auto`` it first probes for the stateless 2026-07-28 revision
    (``server/discover``), is refused, and falls back to the handshake."""
    from mcp.client.client import Client as SdkClient

    async with SdkClient(notes.mcp_url, mode=mode) as client:
        tools = (await client.list_tools()).tools
        assert sorted(t.name for t in tools) == sorted(t.name for t in notes_bundle.tools)
        result = await client.call_tool("list_notes", {})
        assert not result.is_error
        assert [n["title"] for n in result.structured_content["result"]] == ["todo", "ideas", "books"]
        bad = await client.call_tool("add_note", {"title": 5})
        assert bad.is_error and "invalid_arguments" in bad.content[0].text


async def test_episode_round_trip(control, mcp):
    episode = await control.reset("add_note")
    assert episode["instruction"].startswith("Add a note")
    assert (await control.verify(None))["verdict"] == "incomplete"
    out = await mcp.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})
    assert not out.is_error and out.structured == {"id": 5, "title": "groceries"}
    assert (await control.diff())["tables"] == {"notes": {"inserted": 1, "updated": 0, "deleted": 0}}
    verdict = await control.verify(None)
    assert verdict["verdict"] == "complete" and verdict["reward"] == 1.0
    assert verdict["episode_id"] == episode["episode_id"] and verdict["tool_calls"] == 1
    # The next episode starts from the snapshot again, with the same ids.
    await control.reset("add_note")
    assert (await control.diff())["tables"] == {}
    out = await mcp.call_tool("add_note", {"title": "groceries", "body": "milk, eggs"})
    assert out.structured["id"] == 5
    assert (await control.checksum())["pristine"] is False
    assert (await control.reset(None, verify=True))["pristine"] is True


@pytest.mark.parametrize("arguments, fragment", [
    ({"title": 5}, "5 is not of type 'string'"),
    ({}, "'title' is a required property"),
    ({"title": "x", "colour": "red"}, "Additional properties are not allowed"),
    ({"title": "x", "tags": "not-a-list"}, "tags"),
])
async def test_schema_invalid_arguments_are_clear_errors(control, mcp, arguments, fragment):
    await control.reset(None)
    out = await mcp.call_tool("add_note", arguments)
    assert out.is_error and out.error_kind == "invalid_arguments" and fragment in out.text
    assert (await control.diff())["tables"] == {}


async def test_malformed_json_rpc_and_unknown_tool(notes, mcp):
    out = await mcp.call_tool("no_such_tool", {})
    assert out.is_error and "no_such_tool" in out.text
    async with httpx.AsyncClient() as client:
        response = await client.post(notes.mcp_url, content=b"{not json",
                                     headers={"Accept": "application/json, text/event-stream",
                                              "Content-Type": "application/json"})
        assert response.status_code == 400
    assert (await mcp.call_tool("list_notes", {})).is_error is False  # session still fine


@pytest.mark.parametrize("evil", [
    "x'); DROP TABLE notes; --", "'; DELETE FROM notes WHERE '1'='1", "\" OR 1=1 --", "\\'; COMMIT; --",
])
async def test_sql_injection_strings_are_just_data(control, mcp, evil):
    await control.reset(None)
    out = await mcp.call_tool("add_note", {"title": evil, "body": evil})
    assert not out.is_error
    found = await mcp.call_tool("find_note", {"title": evil})
    assert found.structured["body"] == evil
    assert (await control.diff())["tables"] == {"notes": {"inserted": 1, "updated": 0, "deleted": 0}}


async def test_raising_tool_returns_error_and_rolls_back_its_writes(control, mcp):
    await control.reset(None)
    await mcp.call_tool("archive_note", {"note_id": 2})
    out = await mcp.call_tool("add_then_crash", {"title": "ghost"})
    assert out.is_error and out.error_kind == "tool_crashed" and "ZeroDivisionError" in out.text
    missing = await mcp.call_tool("find_note", {"title": "ghost"})
    assert missing.is_error and missing.error_kind == "tool_error" and "no note titled" in missing.text
    # Only the earlier successful call's write remains.
    assert (await control.diff())["tables"] == {"notes": {"inserted": 0, "updated": 1, "deleted": 0}}


async def test_tool_cannot_end_the_episode_transaction(control, mcp):
    await control.reset(None)
    for statement in ("COMMIT", "select 1; commit", "SET ROLE awm", "select set_config('role', 'awm', false)"):
        out = await mcp.call_tool("run_sql", {"statement": statement})
        assert out.is_error, statement
    # Tool code runs in a worker that holds no connection: there is nothing to reach past.
    out = await mcp.call_tool("sneaky_commit", {"title": "escaped"})
    assert out.is_error and out.error_kind == "tool_crashed" and "_conn" in out.text
    reset = await control.reset(None)
    assert reset["strategy"] == "rollback" and reset["escaped"] is None
    assert (await control.checksum())["pristine"] is True


async def test_control_api_errors(control, notes):
    with pytest.raises(ControlApiError) as unknown:
        await control.reset("no_such_task")
    assert unknown.value.status == 404 and "no_such_task" in str(unknown.value)
    async with httpx.AsyncClient() as client:
        bad = await client.post(notes.control_url + "/reset", content=b"[1, 2")
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
        wrong = await client.post(notes.control_url + "/verify", json={"final_answer": 42})
        assert wrong.status_code in (400, 409)


async def test_verify_before_reset_is_refused(admin_dsn, notes_bundle):
    from awm.fleet import Database, LocalFleet
    async with LocalFleet([notes_bundle], database=Database(admin_dsn), allow_ungated=True) as fleet:
        control = ControlClient(fleet.instances[0].control_url)
        with pytest.raises(ControlApiError) as exc:
            await control.verify("anything")
        assert exc.value.status == 409 and "reset first" in str(exc.value)
        await control.close()


@pytest.mark.parametrize("task, kind, fragment", [
    ("loops_forever", "timeout", "timed out"),
    ("eats_memory", "memory", "memory limit"),
    ("opens_socket", "exception", "Operation not permitted"),
    ("kills_itself", "crash", "died"),
    ("tries_to_write", "query", "read-only transaction"),  # refused by the transaction, then by the role
])
async def test_misbehaving_verifiers_give_error_verdicts_and_the_server_stays_up(control, mcp, task, kind, fragment):
    await control.reset(task)
    verdict = await control.verify("done")
    assert verdict["verdict"] == "error" and verdict["error_kind"] == kind and fragment in verdict["reason"]
    assert verdict["reward"] == 0.0
    assert (await mcp.call_tool("list_notes", {})).is_error is False
    await control.reset("add_note")  # a fresh worker answers the next verification
    assert (await control.verify(None))["verdict"] == "incomplete"


async def test_no_secret_reaches_untrusted_code(control, mcp):
    await control.reset("reads_env")
    verdict = await control.verify(None)
    assert verdict["reason"] == "env="  # the verifier's environment is empty
    seen = (await mcp.call_tool("read_environment", {})).structured["keys"]
    assert "OPENAI_API_KEY" not in seen and "AWM_INSTANCE_DSN" not in seen


async def test_info_health_and_metrics(control, mcp, notes):
    info = await control.info()
    assert info["env"] == "notes" and len(info["tasks"]) == 9
    isolation = info["isolation"]
    assert isolation["strong"] is True and {"seccomp", "landlock", "rlimits"} <= set(isolation["applied"])
    await control.reset("add_note")
    await mcp.call_tool("list_notes", {})
    await mcp.call_tool("add_note", {"title": 1})
    await control.verify(None)
    async with httpx.AsyncClient() as client:
        assert (await client.get(notes.control_url + "/healthz")).status_code == 200
        assert (await client.get(notes.control_url + "/readyz")).json()["ready"] is True
        text = (await client.get(notes.control_url + "/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    env = ("env", "notes")
    assert samples[("awm_tool_calls_total", (env, ("outcome", "ok"), ("tool", "list_notes")))] >= 1
    assert samples[("awm_tool_calls_total", (env, ("outcome", "invalid_arguments"), ("tool", "add_note")))] >= 1
    assert samples[("awm_reset_seconds_count", (("strategy", "rollback"),))] >= 1
    assert samples[("awm_episodes_total", (env, ("verdict", "incomplete")))] >= 1
    assert ("awm_tool_call_seconds_bucket", (env, ("le", "0.004"), ("tool", "list_notes"))) in samples
    assert any(name == "awm_verifier_errors_total" for name, _ in samples)


async def test_the_control_listener_keeps_an_idle_connection_for_the_operator(notes):
    """The operator's connection from a pod's release serves its next claim a training step later:
    the control listener keeps an idle connection past uvicorn's default 5 s keep-alive; the
    agent's listener (MCP) does not."""
    from urllib.parse import urlsplit

    from awm.envserver import listener

    async def request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, netloc: str, path: str) -> bytes:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        return head.split(b"\r\n", 1)[0]

    control, mcp = urlsplit(notes.control_url), urlsplit(notes.mcp_url)
    c_reader, c_writer = await asyncio.open_connection(control.hostname, control.port)
    m_reader, m_writer = await asyncio.open_connection(mcp.hostname, mcp.port)
    assert (await request(c_reader, c_writer, control.netloc, "/healthz")).endswith(b"200 OK")
    m_writer.write(f"GET /nope HTTP/1.1\r\nHost: {mcp.netloc}\r\n\r\n".encode())
    await asyncio.wait_for(m_reader.readuntil(b"\r\n\r\n"), 10)
    # past uvicorn's default keep-alive (5 s) and past the head deadline, which counts from a
    # request's first byte and must not cut an idle kept connection
    await asyncio.sleep(max(6.5, listener.HEAD_TIMEOUT_S + 1.5))
    assert (await request(c_reader, c_writer, control.netloc, "/healthz")).endswith(b"200 OK")
    await asyncio.wait_for(m_reader.read(), 5)  # the rest of its answer, then the end: the MCP listener closed it
    assert m_reader.at_eof()
    for writer in (c_writer, m_writer):
        writer.close()


async def test_looping_tool_times_out_and_the_instance_keeps_serving(notes_fleet, control, mcp, notes):
    """The worker running a looping tool is killed at the time limit and replaced; the env server
    itself never stops (no restart, same process), and the next episode is pristine."""
    handle = notes_fleet.instances[0]
    pid, restarts = handle.pid, handle.restarts
    await control.reset(None)
    await mcp.call_tool("add_note", {"title": "before the loop"})
    out = await mcp.call_tool("spin", {"seconds": 30})
    assert out.is_error and out.error_kind == "timeout"
    assert not (await mcp.call_tool("list_notes", {})).is_error
    assert handle.pid == pid and handle.restarts == restarts
    reset = await control.reset(None)
    assert reset["strategy"] == "rollback" and (await control.checksum())["pristine"] is True
    async with httpx.AsyncClient() as client:
        text = (await client.get(notes.control_url + "/metrics")).text
    assert 'awm_worker_restarts_total{reason="timeout"}' in text


# --------------------------------------------------------------------------- the MCP transport, raw

_MCP_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _rpc(method: str, params: dict | None = None, id_: int | None = 1) -> dict:
    message = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if id_ is not None:
        message["id"] = id_
    return message


async def _session(client: httpx.AsyncClient, url: str) -> dict[str, str]:
    r = await client.post(url, json=_rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                        "clientInfo": {"name": "raw", "version": "1"}}),
                          headers=_MCP_HEADERS)
    assert r.status_code == 200 and r.json()["result"]["protocolVersion"] == "2025-11-25"
    assert r.json()["result"]["capabilities"]["tools"] == {"listChanged": False}
    return {**_MCP_HEADERS, "Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}


async def test_mcp_transport_answers_bad_requests_with_the_specified_status(notes):
    """Every malformed or out-of-protocol request gets a clear answer and the server goes on."""
    url = notes.mcp_url
    async with httpx.AsyncClient(timeout=30) as c:
        headers = await _session(c, url)
        # an old client's version is kept; an unknown one gets the latest
        r = await c.post(url, json=_rpc("initialize", {"protocolVersion": "2024-11-05"}), headers=_MCP_HEADERS)
        assert r.json()["result"]["protocolVersion"] == "2024-11-05"
        r = await c.post(url, json=_rpc("initialize", {"protocolVersion": "1999-01-01"}), headers=_MCP_HEADERS)
        assert r.json()["result"]["protocolVersion"] == "2025-11-25"
        cases = [
            ({**_MCP_HEADERS}, _rpc("tools/list"), 400, "Missing session"),
            ({**headers, "Mcp-Session-Id": "not-a-session"}, _rpc("tools/list"), 404, "Session not found"),
            ({**headers, "MCP-Protocol-Version": "1999-01-01"}, _rpc("tools/list"), 400, "unsupported protocol version"),
            ({**headers, "Accept": "text/html"}, _rpc("tools/list"), 406, "Not Acceptable"),
            ({**headers, "Content-Type": "text/plain"}, _rpc("tools/list"), 415, "Content-Type"),
            (headers, [_rpc("ping"), _rpc("ping", id_=2)], 400, "batches"),
            (headers, {"method": "ping", "id": 1}, 400, "JSON-RPC 2.0"),
            (headers, _rpc("ping", id_=None) | {"id": [1]}, 400, "id must be"),
        ]
        for hdrs, body, status, fragment in cases:
            r = await c.post(url, json=body, headers=hdrs)
            assert r.status_code == status and fragment in r.json()["error"]["message"], (body, r.status_code, r.text)
        r = await c.post(url, content=b"{not json", headers=headers)
        assert r.status_code == 400 and r.json()["error"]["code"] == -32700
        r = await c.post(url, content=b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "'
                         + b"a" * (9 * 1024 * 1024) + b'"}}', headers=headers)
        assert r.status_code == 413
        for method, code in [("completion/complete", -32601), ("no/such/method", -32601),
                             ("resources/read", -32002), ("prompts/get", -32602)]:
            r = await c.post(url, json=_rpc(method, {"uri": "file:///etc/passwd", "name": "x"}), headers=headers)
            assert r.status_code == 200 and r.json()["error"]["code"] == code, (method, r.text)
        r = await c.post(url, json=_rpc("tools/call", {"arguments": {}}), headers=headers)
        assert r.json()["error"]["code"] == -32602
        r = await c.post(url, json=_rpc("logging/setLevel", {"level": "loud"}), headers=headers)
        assert r.json()["error"]["code"] == -32602
        # tool errors are results the agent can read, with their class
        r = await c.post(url, json=_rpc("tools/call", {"name": "add_note", "arguments": [1, 2]}), headers=headers)
        result = r.json()["result"]
        assert result["isError"] and result["_meta"]["awm_error"] == "invalid_arguments"
        r = await c.post(url, json=_rpc("tools/call", {"name": "no_such_tool"}), headers=headers)
        assert r.json()["result"]["isError"] and "unknown tool" in r.json()["result"]["content"][0]["text"]
        # notifications and a client's responses are acknowledged; empty lists for what we do not have
        assert (await c.post(url, json=_rpc("notifications/initialized", id_=None), headers=headers)).status_code == 202
        assert (await c.post(url, json={"jsonrpc": "2.0", "id": 7, "result": {}}, headers=headers)).status_code == 202
        for method, key in [("resources/list", "resources"), ("resources/templates/list", "resourceTemplates"),
                            ("prompts/list", "prompts"), ("ping", None), ("logging/setLevel", None)]:
            r = await c.post(url, json=_rpc(method, {"level": "info"} if "logging" in method else {}), headers=headers)
            assert r.status_code == 200 and r.json()["result"] == ({key: []} if key else {}), (method, r.text)
        # no standalone SSE stream; other paths are not MCP
        r = await c.get(url, headers={**headers, "Accept": "text/event-stream"})
        assert r.status_code == 405 and "POST" in r.headers["allow"]
        assert (await c.post(url.rsplit("/", 1)[0] + "/other", json=_rpc("ping"), headers=headers)).status_code == 404
        # DELETE ends the session
        assert (await c.delete(url, headers=headers)).status_code == 200
        assert (await c.post(url, json=_rpc("ping"), headers=headers)).status_code == 404
        # and the server still serves
        fresh = await _session(c, url)
        r = await c.post(url, json=_rpc("tools/call", {"name": "list_notes", "arguments": {}}), headers=fresh)
        assert r.status_code == 200 and not r.json()["result"]["isError"]


async def test_mcp_sse_mode_frames_each_answer_as_one_event(notes_bundle):
    """``--sse``: the answer travels as one ``event: message`` (unit level: the app over ASGI)."""
    from awm.envserver.mcp import McpApp

    class Instance:
        bundle = notes_bundle
        on_switch: list = []

        async def call_tool(self, name, arguments):
            return [{"id": 1, "title": "todo"}]

    transport = httpx.ASGITransport(app=McpApp(Instance(), json_response=False))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        r = await c.post("/mcp", json=_rpc("initialize", {"protocolVersion": "2025-06-18"}), headers=_MCP_HEADERS)
        assert r.headers["content-type"] == "text/event-stream"
        headers = {**_MCP_HEADERS, "Mcp-Session-Id": r.headers["mcp-session-id"]}
        r = await c.post("/mcp", json=_rpc("tools/call", {"name": "list_notes"}, id_=3), headers=headers)
        events = [line for line in r.text.splitlines() if line.startswith("data:")]
        assert r.text.startswith("event: message") and len(events) == 1
        message = json.loads(events[0][5:])
        assert message["id"] == 3 and message["result"]["structuredContent"] == {"result": [{"id": 1, "title": "todo"}]}
        r = await c.post("/mcp", json=_rpc("tools/list"), headers={**headers, "Accept": "application/json"})
        assert r.status_code == 406  # an SSE server needs a client that takes SSE
