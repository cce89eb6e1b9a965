"""A scripted OpenAI-compatible endpoint (on 127.0.0.1 unless told) for the synthesis tests.

It serves ``/v1/chat/completions`` and ``/v1/embeddings`` from a script: for each request the
``answer`` callback receives the stage (from the ``[awm-stage: X]`` tag), the whole request and
the number of earlier requests of that stage, and returns a :class:`Reply`: content to send, or
an HTTP status to fail with. Every request is recorded for assertions. ``host``: the address it
listens on (a real node's address, so that pods reach it: tests/test_realnode.py).
"""

from __future__ import annotations

import asyncio

import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


@dataclass
class Reply:
    content: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] | None = None  # native OpenAI tool calls (agent tests)
    delay_s: float = 0.0  # answered this late (a slow endpoint)

    @classmethod
    def json(cls, value: Any) -> Reply:
        return cls(json.dumps(value))


Answer = Callable[[str, dict[str, Any], int], Reply]


class LocalEndpoint:
    """An OpenAI-style ``/v1`` app served by uvicorn on a thread, on a free port of ``host``; a
    context manager (started on enter, stopped on exit)."""

    def __init__(self, routes: list[Route], host: str = "127.0.0.1") -> None:
        with socket.socket() as s:
            s.bind((host, 0))
            self.port = s.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        app = Starlette(routes=routes)
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="error"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        while not self._server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(5)


class ScriptedLLM(LocalEndpoint):
    def __init__(self, answer: Answer, host: str = "127.0.0.1") -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        super().__init__([Route("/v1/chat/completions", self._chat, methods=["POST"]),
                          Route("/v1/embeddings", self._embeddings, methods=["POST"])], host)

    async def _chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        system = body["messages"][0]["content"]
        match = re.search(r"\[awm-stage: (\w+)\]", system)
        stage = match.group(1) if match else "unknown"
        with self._lock:
            index = self.counts[stage]
            self.counts[stage] += 1
            self.requests.append((stage, body))
        reply = self.answer(stage, body, index)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.status != 200:
            return JSONResponse({"error": {"message": reply.content or "scripted failure"}}, status_code=reply.status,
                                headers=reply.headers)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls is not None:
            message["tool_calls"] = reply.tool_calls
        return JSONResponse({
            "id": f"cmpl-{index}", "object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                         "message": message}],
            "usage": {"prompt_tokens": sum(len(m.get("content") or "") // 4 for m in body["messages"]),
                      "completion_tokens": len(reply.content) // 4},
        })

    async def _embeddings(self, request: Request) -> JSONResponse:
        from awm.synth.embed import HashingEmbedder

        body = await request.json()
        with self._lock:
            self.counts["embeddings"] += 1
        vectors = await HashingEmbedder(64).embed(body["input"])
        return JSONResponse({"data": [{"index": i, "embedding": v} for i, v in enumerate(vectors)],
                             "usage": {"prompt_tokens": 10, "total_tokens": 10}})


def user_text(body: dict[str, Any]) -> str:
    return "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")


def scenario_of(body: dict[str, Any]) -> str:
    match = re.search(r"Scenario (\w+)", user_text(body))
    return match.group(1) if match else ""
