"""Clients for one env instance: a lean MCP session and the control API.

``McpSession`` speaks MCP's streamable HTTP transport directly (JSON-RPC over one persistent
HTTP/1.1 connection and one MCP session): initialize once, then ``tools/list`` and
``tools/call``. It exists because rollouts make millions of tool calls and a full SDK client adds
milliseconds per call (docs/benchmarks.md measures both); any MCP client works against the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import ssl
from dataclasses import dataclass
from typing import Any

import httpx

from awm import errorclass, settings
from awm.errorclass import ErrorClass

PROTOCOL_VERSION = "2025-06-18"
_ACCEPT = "application/json, text/event-stream"
CLOSE_DEADLINE_S = 5.0  # ending a session on the way out: best effort, never the caller's wait


def env_deadline_s() -> float:
    """The longest a client here waits for one answer of an env server (a tool call, a reset, a
    verification, a switch...): the whole request, from connecting to the answer's last byte.
    ``AWM_ENV_DEADLINE_S``, default 60 s; read when a client is made. Past it the request fails as
    the environment's (:class:`DeadlineExceeded`, an ``httpx.TimeoutException``): a hung env
    server (SIGSTOP-ed, its host frozen) costs the episode it serves, masked, and holds its client
    no longer than this. It must stay above the servers' own limits on a call (a tool's
    ``tool_timeout_s``, 10 s by default; a verifier's ``verifier_timeout_s``)."""
    return float(settings.AWM_ENV_DEADLINE_S)


class DeadlineExceeded(httpx.TimeoutException):
    """No (complete) answer from an env server within the request's deadline."""


@contextlib.asynccontextmanager
async def _deadline(seconds: float, what: str):  # type: ignore[no-untyped-def]
    """httpx's timeouts bound each wait for a byte, not a request: this bounds the request."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise DeadlineExceeded(f"{what}: no answer within {seconds:g} s (deadline)") from None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one TLS context (certifi's CAs, as httpx's default): every client here shares it."""
    return httpx.create_ssl_context()


def http_client(timeout: float = 60.0) -> httpx.AsyncClient:
    """An HTTP client with the process's one TLS context. ``httpx.AsyncClient()`` builds its own
    (loading the CA bundle: ~19 ms of CPU, measured), and a claimed instance needs a few clients
    (its control API, its MCP session): three of them were most of a repeat claim's ~56 ms on the
    real node (docs/benchmarks.md)."""
    return httpx.AsyncClient(timeout=timeout, verify=tls_context())


class McpError(RuntimeError):
    """A JSON-RPC error or a transport failure (not a tool's own error result)."""


@dataclass
class ToolOutcome:
    is_error: bool
    text: str
    structured: Any = None
    # The class the server sent in ``_meta.awm_error`` (awm.errorclass); None from servers that
    # send none (any MCP server): then the text's first word is read, if it names a class.
    error_class: ErrorClass | None = None

    @property
    def error_kind(self) -> str | None:
        """The error's class (:class:`awm.errorclass.ErrorClass`), ``unknown`` when the server
        named none; None when the call succeeded."""
        if not self.is_error:
            return None
        return self.error_class or errorclass.parse(self.text) or "unknown"


class McpSession:
    def __init__(self, url: str, timeout: float | None = None, client: httpx.AsyncClient | None = None) -> None:
        """``timeout``: the deadline of each request (:func:`env_deadline_s` when None)."""
        self.url = url
        self.deadline_s = env_deadline_s() if timeout is None else timeout
        self._client = client or http_client(self.deadline_s)
        self._own_client = client is None
        self._ids = itertools.count(1)
        self._headers = {"Accept": _ACCEPT, "Content-Type": "application/json"}
        self.server_info: dict[str, Any] = {}

    async def __aenter__(self) -> McpSession:
        await self.initialize()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def initialize(self) -> None:
        result = await self._request("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "awm-lean-client", "version": "1"},
        })
        self.server_info = result
        self._headers["MCP-Protocol-Version"] = result.get("protocolVersion", PROTOCOL_VERSION)
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def list_tools(self) -> list[dict[str, Any]]:
        tools: list[dict[str, Any]] = []
        cursor = None
        while True:
            result = await self._request("tools/list", {"cursor": cursor} if cursor else {})
            tools += result.get("tools", [])
            cursor = result.get("nextCursor")
            if not cursor:
                return tools

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolOutcome:
        result = await self._request("tools/call", {"name": name, "arguments": arguments or {}})
        text = "\n".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
        meta = result.get("_meta")
        return ToolOutcome(bool(result.get("isError")), text, result.get("structuredContent"),
                           errorclass.parse(meta.get("awm_error")) if isinstance(meta, dict) else None)

    def forget_session(self) -> None:
        """Drop the session the server ended (a late-binding instance's switch ends every one):
        the next :meth:`initialize` opens a new one on the same connection."""
        self._headers.pop("Mcp-Session-Id", None)
        self._headers.pop("MCP-Protocol-Version", None)
        self.server_info = {}

    async def close(self) -> None:
        if "Mcp-Session-Id" in self._headers:
            try:  # a hung server must not hold up a release: its session ends with it anyway
                async with _deadline(min(CLOSE_DEADLINE_S, self.deadline_s), "DELETE session"):
                    await self._client.delete(self.url, headers=self._headers)
            except httpx.HTTPError:
                pass
        if self._own_client:
            await self._client.aclose()

    async def _request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        request_id = next(self._ids)
        message = await self._post({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        if message is None:
            raise McpError(f"{method}: empty response")
        if "error" in message:
            error = message["error"]
            raise McpError(f"{method}: {error.get('message')} (code {error.get('code')})")
        return message.get("result", {})

    async def _post(self, payload: dict[str, Any]) -> dict[str, Any] | None:
        try:
            async with _deadline(self.deadline_s, str(payload.get("method"))):
                response = await self._client.post(self.url, content=json.dumps(payload), headers=self._headers)
        except httpx.HTTPError as exc:
            raise McpError(f"{payload.get('method')}: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 202:
            return None
        if response.status_code >= 400:
            raise McpError(f"{payload.get('method')}: HTTP {response.status_code}: {response.text[:300]}")
        session = response.headers.get("mcp-session-id")
        if session:
            self._headers["Mcp-Session-Id"] = session
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return _last_sse_message(response.text, payload.get("id"))
        return response.json() if response.content else None


def _last_sse_message(body: str, request_id: Any) -> dict[str, Any] | None:
    found = None
    for line in body.splitlines():
        if line.startswith("data:"):
            message = json.loads(line[5:].strip())
            if message.get("id") == request_id:
                found = message
    return found




class ControlClient:
    """The instance's control API (reset, verify, diff, checksum, health)."""

    def __init__(self, base_url: str, timeout: float | None = None, client: httpx.AsyncClient | None = None) -> None:
        """``timeout``: the deadline of each request (:func:`env_deadline_s` when None)."""
        self.base_url = base_url.rstrip("/")
        self.deadline_s = env_deadline_s() if timeout is None else timeout
        self._client = client or http_client(self.deadline_s)
        self._own_client = client is None
        self._verify_extra_s = 0.0  # the judge's deadline, as the last reset said (verify)

    async def reset(self, task_id: str | None = None, verify: bool = False, env: str | None = None) -> dict[str, Any]:
        """A new episode; with ``env``, of that environment (a late-binding instance switches)."""
        body: dict[str, Any] = {"task_id": task_id, "verify": verify}
        if env is not None:
            body["env"] = env
        answer = await self._call("POST", "/reset", body)
        judge_s = answer.get("judge_deadline_s")
        self._verify_extra_s = float(judge_s) if isinstance(judge_s, (int, float)) and judge_s > 0 else 0.0
        return answer

    async def bind(self, env: str) -> dict[str, Any]:
        """Serve ``env`` from now on (late binding; its MCP sessions end: connect again)."""
        return await self._call("POST", "/bind", {"env": env})

    async def prepare(self, env: str) -> dict[str, Any]:
        """Make ``env`` ready without serving it (late binding): a later claim of it costs a reset."""
        return await self._call("POST", "/prepare", {"env": env})

    async def verify(self, final_answer: str | None = None, kind: str | None = None) -> dict[str, Any]:
        """The verdict (the episode goes on); ``kind``: by the task's ``code`` or ``judge``
        verifier instead of the one it is served with."""
        body: dict[str, Any] = {"final_answer": final_answer}
        if kind is not None:
            body["verifier_kind"] = kind
        # An instance with an LLM judge may take its judge's whole deadline (retries and votes)
        # on top of the verifier: its last reset said how long (``judge_deadline_s``). A verdict
        # the judge is still allowed to give is waited for, not masked as a hung server's.
        return await self._call("POST", "/verify", body, self.deadline_s + self._verify_extra_s)

    async def sqlite(self, state: str = "final") -> bytes:
        """The database as a SQLite file (AWM-1K imports): ``initial`` (the snapshot) or ``final``."""
        async with _deadline(self.deadline_s, "GET /sqlite"):
            response = await self._client.get(self.base_url + "/sqlite", params={"state": state})
        if response.status_code >= 400:
            raise ControlApiError(response.status_code, response.json().get("error", response.text))
        return response.content

    async def diff(self, rows: int = 0) -> dict[str, Any]:
        """Counts per changed table; with ``rows`` > 0 also up to that many changed rows per table
        (``rows``: inserted, deleted, updated before/after)."""
        return await self._call("GET", f"/diff?rows={rows}" if rows else "/diff")

    async def checksum(self) -> dict[str, Any]:
        return await self._call("GET", "/checksum")

    async def info(self) -> dict[str, Any]:
        return await self._call("GET", "/info")

    async def ready(self) -> bool:
        state = await self.readiness()
        return bool(state and state.get("ready"))

    async def readiness(self) -> dict[str, Any] | None:
        """``/readyz``'s answer (``ready``, ``wedged``, ``db``: its database connection is up);
        None when the instance does not answer."""
        try:
            async with _deadline(self.deadline_s, "GET /readyz"):
                response = await self._client.get(self.base_url + "/readyz")
            state = response.json()
        except (httpx.HTTPError, ValueError):
            return None
        if not isinstance(state, dict):
            return None
        state["ready"] = response.status_code == 200 and state.get("ready", True) is not False
        return state

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
                    deadline_s: float | None = None) -> dict[str, Any]:
        deadline = deadline_s or self.deadline_s
        async with _deadline(deadline, f"{method} {path}"):
            response = await self._client.request(method, self.base_url + path, json=body,
                                                  timeout=httpx.Timeout(deadline))
        data = response.json()
        if response.status_code >= 400:
            raise ControlApiError(response.status_code, data.get("error", response.text))
        return data

    async def close(self) -> None:
        if self._own_client:
            await self._client.aclose()


class ControlApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
