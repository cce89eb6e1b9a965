"""The agent-facing MCP server: exactly the environment's tools, over streamable HTTP at /mcp.

A tools-only server needs a small part of MCP, and this module is that part as one ASGI app: the
handshake (``initialize`` gives a session id), ``tools/list``, ``tools/call``, ``ping``,
``logging/setLevel``, empty resource and prompt lists, notifications acknowledged with 202,
``DELETE`` ending a session, ``GET`` answered 405 (the server never sends a message of its own,
which the transport allows). Answers are JSON, or one SSE event with ``--sse``.

Why not an SDK server: on the 2-vCPU machines this project is measured on, fastmcp 4.1.2's stack
(its middleware, the SDK's session tasks and memory streams, pydantic models per message) cost
about 2 ms of CPU per tool call and 45 MB per env-server process, more than everything else in the
call (docs/benchmarks.md). The protocol is checked here by the official conformance suite and by
three clients (awm's lean client, fastmcp's ``Client``, the official SDK's client):
tests/test_transport_security.py, tests/test_envserver.py.

Protocol versions: every handshake-era revision (2024-11-05 to 2025-11-25). A client of the
stateless 2026-07-28 revision probes with ``server/discover``, is told there is no session, and
falls back to the handshake, as the SDKs do for any server that does not speak it.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from typing import Any, Awaitable, Callable

from awm import jsonlimits

from awm.envserver.instance import EnvInstance
from awm.envserver.tools import ToolFailure, render

log = logging.getLogger(__name__)

VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST = VERSIONS[-1]
DEFAULT_VERSION = "2025-03-26"  # what a request without MCP-Protocol-Version is taken to speak
MAX_BODY = 8 * 1024 * 1024      # one JSON-RPC message: tool arguments are small
MAX_SESSIONS = 512              # the least recently used session goes first past this
LOG_LEVELS = {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = -32700, -32600, -32601, -32602, -32603
RESOURCE_NOT_FOUND = -32002

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class RpcError(Exception):
    """A JSON-RPC error answer (``status``: the HTTP status it travels with)."""

    def __init__(self, code: int, message: str, status: int = 200) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status


class McpApp:
    """The ASGI app of one instance's MCP endpoint."""

    def __init__(self, instance: EnvInstance, path: str = "/mcp", json_response: bool = True,
                 after_call: Callable[[], None] | None = None) -> None:
        """``after_call``: run once a tool call's answer is sent (the env server forks there what
        a switch left to fork: :meth:`EnvInstance.tend_workers`)."""
        self.instance = instance
        self.after_call = after_call
        self.path = path.rstrip("/")
        self.json_response = json_response
        self.sessions: OrderedDict[str, str] = OrderedDict()  # session id -> protocol version
        self._environment()
        # A switch to another environment (late binding) ends every session: a client's next
        # request gets 404 "Session not found" and, as the transport says, initializes anew and
        # sees the new environment's tools (no server-to-client stream here to announce
        # notifications/tools/list_changed on).
        instance.on_switch.append(self._environment)

    def _environment(self) -> None:
        bundle = self.instance.bundle
        self.tools = [{"name": t.name, "description": t.description, "inputSchema": t.input_schema}
                      for t in bundle.tools]
        self.server_info = {"name": bundle.name, "version": "1"}
        self.instructions = bundle.scenario.description
        self.sessions.clear()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            return await _lifespan(receive, send)
        if scope["type"] != "http":
            return
        if scope["path"].rstrip("/") != self.path:
            return await _respond(send, 404, b"Not Found", b"text/plain")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or ()}
        method = scope["method"]
        if method == "POST":
            return await self._post(headers, receive, send)
        if method == "DELETE":
            session, problem = self._session(headers)
            if problem is not None:
                return await self._error(send, None, problem)
            self.sessions.pop(session, None)
            return await _respond(send, 200, b"", None)
        # No server-initiated messages: no standalone SSE stream (the transport allows 405).
        return await _respond(send, 405, b"Method Not Allowed", b"text/plain", [(b"allow", b"POST, DELETE")])

    async def _post(self, headers: dict[str, str], receive: Receive, send: Send) -> None:
        accept = headers.get("accept", "")
        wanted = "application/json" if self.json_response else "text/event-stream"
        if wanted not in accept and "*/*" not in accept:
            return await self._error(send, None, RpcError(INVALID_REQUEST, f"Not Acceptable: Accept must include {wanted}", 406))
        if not headers.get("content-type", "").lower().startswith("application/json"):
            return await self._error(send, None, RpcError(INVALID_REQUEST, "Unsupported Media Type: Content-Type must be application/json", 415))
        body = await _read_body(receive)
        if body is None:
            return await self._error(send, None, RpcError(INVALID_REQUEST, f"request body over {MAX_BODY} bytes", 413))
        try:
            message = jsonlimits.loads(body)
        except ValueError as exc:  # malformed, or nested deeper than jsonlimits.MAX_DEPTH
            return await self._error(send, None, RpcError(PARSE_ERROR, f"Parse error: {exc}", 400))
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            what = "batches are not supported" if isinstance(message, list) else "not a JSON-RPC 2.0 message"
            return await self._error(send, None, RpcError(INVALID_REQUEST, f"Invalid Request: {what}", 400))
        request_id, rpc = message.get("id"), message.get("method")
        if rpc == "initialize" and "id" in message:
            return await self._answer(send, request_id, *self._initialize(message.get("params")))
        session, problem = self._session(headers)
        if problem is not None:
            return await self._error(send, request_id, problem)
        if "id" not in message or not isinstance(rpc, str):  # a notification, or a client's response
            return await _respond(send, 202, b"", None)
        if not isinstance(request_id, (str, int)) or isinstance(request_id, bool):
            return await self._error(send, None, RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or a number", 400))
        try:
            result = await self._dispatch(rpc, message.get("params"))
        except RpcError as exc:
            return await self._error(send, request_id, exc)
        except Exception:  # a bug of ours: the agent gets no internals
            log.exception("MCP %s failed", rpc)
            return await self._error(send, request_id, RpcError(INTERNAL_ERROR, "Internal error"))
        await self._answer(send, request_id, result, session)
        if rpc == "tools/call" and self.after_call is not None:
            self.after_call()

    def _initialize(self, params: Any) -> tuple[dict[str, Any], str]:
        requested = params.get("protocolVersion") if isinstance(params, dict) else None
        version = requested if requested in VERSIONS else LATEST
        session = secrets.token_hex(16)
        self.sessions[session] = version
        while len(self.sessions) > MAX_SESSIONS:
            self.sessions.popitem(last=False)
        result = {"protocolVersion": version,
                  "capabilities": {"tools": {"listChanged": False}, "logging": {},
                                   "resources": {"subscribe": False, "listChanged": False},
                                   "prompts": {"listChanged": False}},
                  "serverInfo": self.server_info, "instructions": self.instructions}
        return result, session

    def _session(self, headers: dict[str, str]) -> tuple[str, RpcError | None]:
        """The request's session, or why it has none (400 without one, 404 for one we do not know)."""
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in VERSIONS:
            return "", RpcError(INVALID_REQUEST, f"Bad Request: unsupported protocol version {version[:40]!r} "
                                                 f"(supported: {', '.join(VERSIONS)})", 400)
        session = headers.get("mcp-session-id")
        if not session:
            return "", RpcError(INVALID_REQUEST, "Bad Request: Missing session ID (initialize first)", 400)
        if session not in self.sessions:
            return "", RpcError(INVALID_REQUEST, "Session not found", 404)
        self.sessions.move_to_end(session)
        return session, None

    async def _dispatch(self, rpc: str, params: Any) -> dict[str, Any]:
        if params is not None and not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        params = params or {}
        if rpc == "tools/call":
            return await self._call_tool(params)
        if rpc == "tools/list":
            return {"tools": self.tools}
        if rpc == "ping":
            return {}
        if rpc == "logging/setLevel":
            if params.get("level") not in LOG_LEVELS:
                raise RpcError(INVALID_PARAMS, f"level must be one of {', '.join(sorted(LOG_LEVELS))}")
            return {}  # nothing is ever logged to the client
        if rpc == "resources/list":
            return {"resources": []}
        if rpc == "resources/templates/list":
            return {"resourceTemplates": []}
        if rpc == "prompts/list":
            return {"prompts": []}
        if rpc == "resources/read":
            raise RpcError(RESOURCE_NOT_FOUND, f"Resource not found: {str(params.get('uri'))[:200]}")
        if rpc == "prompts/get":
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {str(params.get('name'))[:200]}")
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {rpc[:100]}")

    async def _call_tool(self, params: dict[str, Any]) -> dict[str, Any]:
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call: name must be a string")
        try:
            result = await self.instance.call_tool(name, params.get("arguments"))
        except ToolFailure as failure:
            # Errors are results (isError), not protocol errors: the agent reads and recovers.
            return {"content": [{"type": "text", "text": str(failure)}], "isError": True,
                    "_meta": {"awm_error": failure.kind}}
        structured = result if isinstance(result, dict) else {"result": result}
        return {"content": [{"type": "text", "text": render(result)}], "structuredContent": structured,
                "isError": False}

    async def _answer(self, send: Send, request_id: Any, result: dict[str, Any], session: str | None = None) -> None:
        extra = [(b"mcp-session-id", session.encode())] if session else []
        await self._message(send, 200, {"jsonrpc": "2.0", "id": request_id, "result": result}, extra)

    async def _error(self, send: Send, request_id: Any, exc: RpcError) -> None:
        body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": exc.code, "message": exc.message}}
        await self._message(send, exc.status, body, [])

    async def _message(self, send: Send, status: int, message: dict[str, Any], extra: list[tuple[bytes, bytes]]) -> None:
        data = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()
        if self.json_response or status != 200:
            return await _respond(send, status, data, b"application/json", extra)
        event = b"event: message\r\ndata: " + data + b"\r\n\r\n"
        await _respond(send, status, event, b"text/event-stream", [(b"cache-control", b"no-cache"), *extra])


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None past MAX_BODY."""
    chunks, size = [], 0
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            return b""
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not event.get("more_body"):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes, content_type: bytes | None,
                   extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-length", str(len(body)).encode())]
    if content_type:
        headers.append((b"content-type", content_type))
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
