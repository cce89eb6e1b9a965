"""The worker's end of the pipe to the server, and the errors of its requests.

Its own module so that both the worker loop (:mod:`awm.sandbox.worker`) and the AWM-1K app shim
(:mod:`awm.sandbox.appshim`) send statements through it without importing each other.
"""

from __future__ import annotations

import os
from typing import Any

from awm.sandbox import codec

MAX_REASON = 2000


class ToolError(Exception):
    """Raised by tool code for a request the agent got wrong; its message goes to the agent."""


class DatabaseError(Exception):
    """The server refused or the database rejected a statement (``sqlstate`` tells which)."""

    def __init__(self, message: str, kind: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.sqlstate = sqlstate


class VerifierQueryError(DatabaseError):
    pass


class Channel:
    def __init__(self, reader: Any, writer: Any) -> None:
        self._reader = reader
        self._writer = writer

    def send(self, message: dict[str, Any]) -> None:
        self._writer.write(codec.encode(message))
        self._writer.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self._reader.readline()
        return codec.decode(line) if line else None

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self.send(message)
        reply = self.receive()
        if reply is None:
            os._exit(0)  # the server is gone
        return reply


CHANNEL: Channel | None = None  # set once by the worker loop, before any code runs


def sql_request(sql: str, params: Any, **extra: Any) -> dict[str, Any]:
    """One statement through the server; raises :class:`DatabaseError` with the server's reason."""
    assert CHANNEL is not None
    reply = CHANNEL.request({"op": "sql", "sql": sql, "params": params, **extra})
    error = reply.get("error")
    if error:
        raise DatabaseError(str(error.get("message", "")), str(error.get("kind", "db")), error.get("sqlstate"))
    return reply


def load_sources(message: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, filename) of the code a ``load`` request executes."""
    sources = [(message.get("prelude") or "", "<tool prelude>")]
    sources += [(tool["code"], f"<tool {tool['name']}>") for tool in message.get("tools") or []
                if isinstance(tool, dict) and isinstance(tool.get("code"), str)]
    return sources
