"""The tool runtime: argument validation, the request each call sends to a worker, and the class
of every outcome.

Tool code never runs in this process: it runs in a confined worker (:mod:`awm.sandbox`), and
this module only turns a validated call into the worker's request and the worker's reply into a
result or a failure with its class (:class:`awm.errorclass.ErrorClass`: what each class means,
and whose fault it is, is defined there, once).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

import jsonschema

from awm import jsonlimits
from awm.errorclass import ErrorClass

from awm.bundle import EnvBundle, Route
from awm.envserver.dbapi import to_json_value

# SQLSTATE classes of errors caused by argument values (a constraint, a bad cast): the agent's.
_AGENT_SQLSTATES = ("22", "23")


@dataclass
class ToolFailure(Exception):
    kind: ErrorClass
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ToolRuntime:
    def __init__(self, bundle: EnvBundle) -> None:
        # Validators are built on a tool's first call: checking a schema against its metaschema
        # costs ~1 ms, and a late-binding instance that switches to an environment of 70 tools
        # would pay all of them before its first call (docs/benchmarks.md, late binding).
        self._schemas: dict[str, dict[str, Any]] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._routes: dict[str, Route] = {}
        for tool in bundle.tools:
            if tool.route is not None:
                if bundle.app is None:
                    raise ValueError(f"tool {tool.name!r} is a route, but the bundle has no app")
                self._routes[tool.name] = tool.route
            self._schemas[tool.name] = tool.input_schema
        # What every worker loads once: the code of the Python tools, and the app if any.
        self.load: dict[str, Any] = {
            "prelude": bundle.tool_prelude or "",
            "tools": [{"name": t.name, "code": t.code} for t in bundle.tools if t.route is None],
            "app": {"code": bundle.app.code, "name": bundle.name} if self._routes and bundle.app else None,
        }

    @property
    def names(self) -> list[str]:
        return list(self._schemas)

    def _validator(self, name: str) -> jsonschema.protocols.Validator:
        validator = self._validators.get(name)
        if validator is None:
            schema = self._schemas[name]
            cls = jsonschema.validators.validator_for(schema)
            try:
                cls.check_schema(schema)
            except jsonschema.SchemaError as exc:  # the bundle's fault, said as such
                raise ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: its input schema is invalid: {exc.message}") from None
            validator = self._validators[name] = cls(schema)
        return validator

    def validate(self, name: str, arguments: Any) -> dict[str, Any]:
        if name not in self._schemas:
            raise ToolFailure(ErrorClass.UNKNOWN_TOOL, f"unknown tool {name!r}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolFailure(ErrorClass.INVALID_ARGUMENTS, "arguments must be a JSON object")
        bad = jsonlimits.lone_surrogate(arguments)
        if bad is not None:
            raise ToolFailure(ErrorClass.INVALID_ARGUMENTS, f"{name}: {bad}: a lone UTF-16 surrogate is not valid Unicode")
        errors = sorted(self._validator(name).iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            detail = "; ".join(
                (f"{'.'.join(map(str, e.path))}: " if e.path else "") + e.message for e in errors[:5])
            raise ToolFailure(ErrorClass.INVALID_ARGUMENTS, f"{name}: {detail}")
        return arguments

    def request(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The worker request for one validated call."""
        route = self._routes.get(name)
        if route is None:
            return {"op": "call", "tool": name, "arguments": arguments}
        method, url, query, body = build_request(route, arguments)
        return {"op": "call", "tool": name, "request": {"method": method, "url": url, "query": query, "body": body}}

    def outcome(self, name: str, reply: dict[str, Any], timed_out: bool, rolled_back: bool) -> Any:
        """The worker's final reply as a result, or a :class:`ToolFailure` with its class."""
        if timed_out:
            raise ToolFailure(ErrorClass.TIMEOUT, f"{name}: a statement ran past the tool's time limit")
        if reply.get("op") == "failed":
            raise _failure(name, reply, route=name in self._routes)
        if reply.get("op") != "result":
            raise ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: the worker sent {reply.get('op')!r}")
        if name in self._routes:
            value = _http_result(name, reply.get("status"), reply.get("body"))
        else:
            value = to_json_value(reply.get("value"))
        if rolled_back:  # the code swallowed a database error: its writes did not survive
            raise ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: a statement failed inside the tool and its writes "
                                              "were rolled back")
        return value


def _failure(name: str, reply: dict[str, Any], route: bool) -> ToolFailure:
    kind = str(reply.get("kind", "exception"))
    reason = str(reply.get("reason", ""))[:2000]
    if kind == ErrorClass.TOOL_ERROR:
        return ToolFailure(ErrorClass.TOOL_ERROR, reason or "tool error")
    if kind == "db":
        sqlstate = str(reply.get("sqlstate") or "")
        # A Python tool's SQL error is reported to the agent with the database's message (which
        # names the offending constraint); an app's only when the request's values caused it.
        if not route or sqlstate[:2] in _AGENT_SQLSTATES:
            return ToolFailure(ErrorClass.TOOL_ERROR, f"{name}: database rejected the request: {reason}" if route
                               else f"database rejected the request: {reason}")
        return ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: {reason}")
    if kind == "timeout":
        return ToolFailure(ErrorClass.TIMEOUT, f"{name}: {reason}")
    if kind == "forbidden":
        return ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: {reason}")
    if kind == "memory":
        return ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: MemoryError: the tool ran out of its memory limit")
    return ToolFailure(ErrorClass.TOOL_CRASHED, f"{name}: {reason}")


def build_request(route: Route, arguments: dict[str, Any]) -> tuple[str, str, list[tuple[str, Any]], dict[str, Any] | None]:
    """Split validated arguments into path, query and JSON body. ``None`` means "not given":
    generated update routes use ``exclude_unset``, so an explicit null would clear a field."""
    path = route.path
    query: list[tuple[str, Any]] = []
    body: dict[str, Any] = {}
    for name, value in arguments.items():
        if value is None:
            continue
        where = route.params.get(name, "body" if route.method in ("POST", "PUT", "PATCH") else "query")
        if where == "path":
            path = path.replace("{" + name + "}", urllib.parse.quote(_scalar_text(value), safe=""))
        elif where == "query":
            for item in value if isinstance(value, list) else [value]:
                query.append((name, _scalar_text(item)))
        else:
            body[name] = value
    missing = re.findall(r"{([^}]+)}", path)
    if missing:
        raise ToolFailure(ErrorClass.INVALID_ARGUMENTS, f"missing path argument(s): {', '.join(missing)}")
    send_body = bool(body) or route.method in ("POST", "PUT", "PATCH") and "body" in route.params.values()
    return route.method, path, query, body if send_body else None


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _http_result(tool: str, status: Any, text: Any) -> Any:
    """An app's HTTP response: 2xx is the result; 4xx is the agent's (``tool_error``), 5xx ours."""
    status = int(status) if isinstance(status, int) else 500
    text = text if isinstance(text, str) else ""
    try:
        payload = json.loads(text) if text else None
    except ValueError:
        payload = text
    if status < 400:
        return to_json_value(payload)
    detail = payload.get("detail", payload) if isinstance(payload, dict) else payload
    message = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False, default=str)
    kind = ErrorClass.TOOL_ERROR if status < 500 else ErrorClass.TOOL_CRASHED
    raise ToolFailure(kind, f"{tool}: HTTP {status}: {message[:2000]}")


def render(result: Any) -> str:
    return json.dumps(result, ensure_ascii=False, default=str)
