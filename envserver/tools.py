"""The tool runtime: compiles a bundle's tool code once and calls it with validated arguments.

Every failure has a class, so that a trainer can tell the agent's mistakes from ours (the
reference system scores a server bug as the agent's format error):

* ``invalid_arguments`` - the arguments do not match the tool's input schema (agent's fault);
* ``tool_error``        - the tool refused the request, e.g. an unknown id (agent's fault);
* ``tool_crashed``      - the tool's code raised something else (environment bug);
* ``timeout``           - the tool ran past its time limit (environment bug);
* ``unavailable``       - the database went away (infrastructure).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import jsonschema
import psycopg

from awm.bundle import EnvBundle
from envserver.dbapi import Db, ToolError, to_json_value

AGENT_FAULTS = {"invalid_arguments", "tool_error"}


@dataclass
class ToolFailure(Exception):
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class ToolRuntime:
    def __init__(self, bundle: EnvBundle) -> None:
        namespace: dict[str, Any] = {"ToolError": ToolError, "__name__": f"awm_tools_{bundle.name}"}
        exec(compile(bundle.tool_prelude or "", f"<{bundle.name} tool prelude>", "exec"), namespace)
        self._functions: dict[str, Callable[..., Any]] = {}
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        self._routes = {t.name: t.route for t in bundle.tools if t.route is not None}
        self._app = None
        if self._routes and bundle.app is not None:
            # Tools that are routes of the bundle's app (imported AWM environments).
            from envserver.asgi_runtime import AppRuntime  # imports FastAPI/SQLAlchemy only if needed

            self._app = AppRuntime(bundle.app, bundle.name)
        for tool in bundle.tools:
            if tool.route is not None:
                self._add_validator(tool.name, tool.input_schema)
                continue
            exec(compile(tool.code, f"<tool {tool.name}>", "exec"), namespace)
            fn = namespace.get(tool.name)
            if not callable(fn):
                raise ValueError(f"tool {tool.name!r}: its code does not define {tool.name}()")
            self._functions[tool.name] = fn
            self._add_validator(tool.name, tool.input_schema)

    def _add_validator(self, name: str, schema: dict[str, Any]) -> None:
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        self._validators[name] = cls(schema)

    @property
    def names(self) -> list[str]:
        return list(self._validators)

    def validate(self, name: str, arguments: Any) -> dict[str, Any]:
        if name not in self._validators:
            raise ToolFailure("invalid_arguments", f"unknown tool {name!r}")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolFailure("invalid_arguments", "arguments must be a JSON object")
        errors = sorted(self._validators[name].iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            detail = "; ".join(
                (f"{'.'.join(map(str, e.path))}: " if e.path else "") + e.message for e in errors[:5])
            raise ToolFailure("invalid_arguments", f"{name}: {detail}")
        return arguments

    def bind(self, name: str, arguments: dict[str, Any]) -> Callable[[Db], Any]:
        """A callable for the reset engine's ``tool_call``, translating failures into classes."""
        route = self._routes.get(name)
        if route is not None and self._app is not None:
            return self._app.bind(name, route, arguments)  # classifies its own failures
        fn = self._functions[name]

        def call(db: Db) -> Any:
            try:
                return to_json_value(fn(db, **arguments))
            except ToolError as exc:
                raise ToolFailure("tool_error", str(exc) or type(exc).__name__) from exc
            except psycopg.OperationalError:
                raise  # connection trouble: the reset engine turns it into DatabaseLost
            except psycopg.Error as exc:
                # SQL errors caused by argument values (a constraint, a bad cast) are reported to
                # the agent with the database's message, which names the offending constraint.
                first = (exc.diag.message_primary or str(exc)).strip()
                raise ToolFailure("tool_error", f"database rejected the request: {first}") from exc
            except Exception as exc:  # noqa: BLE001 - untrusted code
                raise ToolFailure("tool_crashed", f"{type(exc).__name__}: {exc}") from exc

        return call


def render(result: Any) -> str:
    return json.dumps(result, ensure_ascii=False, default=str)
