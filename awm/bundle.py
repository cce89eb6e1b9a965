"""The environment bundle: the one schema every part of awm agrees on.

A bundle is everything needed to run one environment: the scenario, the Postgres schema and its
seed rows (the snapshot every episode starts from), the tools the agent may call, and the tasks,
each with a verifier and a reference solution. The synthesis pipeline writes bundles, the env
server serves them, the catalog validates them. The JSON Schema in ``awm/schema/`` is generated
from these models (``awm catalog schema``) and a test keeps it in sync.

Code contracts (all code in a bundle is untrusted and runs sandboxed):

* Tool: ``def <tool name>(db, **arguments)``; ``db`` has ``query/one/scalar/execute`` with
  ``%s`` placeholders; raise ``ToolError("message")`` for an error the agent should read. The
  tool's return value must be JSON-serialisable (Decimal and dates are converted).
* Verifier: ``def <entrypoint>(final, initial, answer)``; ``final`` and ``initial`` are read-only
  views (``query/one/scalar``) of the database after the episode and of the snapshot; ``answer``
  is the agent's final message or ``None``. A ``code`` verifier returns ``bool``,
  ``(bool, reason)`` or ``{"complete": bool, "reason": str}``; a ``judge`` verifier returns
  evidence (any JSON value) for the LLM judge (:mod:`awm.judge`).
* Gates: each task carries gate records (:class:`GateRecord`); only tasks whose record matches
  the verifier served and the snapshot are served, unless ungated tasks are allowed.

Imported environments (``awm catalog import``, AWM-1K format) use three optional additions:

* ``EnvBundle.app``: a FastAPI + SQLAlchemy application; a tool with a ``route`` is an HTTP
  route of it (``awm/sandbox/appshim.py`` serves it in the confined worker; its statements run
  inside the episode transaction) instead of a Python function.
* ``Verifier.inputs = "sqlite"``: the AWM verifier convention,
  ``<entrypoint>(initial_db_path, final_db_path, final_answer)``, given read-only SQLite databases
  of the snapshot and of the final state (opened in memory), built from ``Database.sqlite_ddl``.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

FORMAT_VERSION = "awm.bundle/v1"

Identifier = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Scenario(_Model):
    """What the environment simulates, in the words given to the synthesis pipeline."""

    name: Identifier = Field(description="Normalised scenario name, also the environment name.")
    description: str = Field(min_length=1)


class SeedTable(_Model):
    """Rows of one table, inserted in list order (parents before children)."""

    table: Identifier
    rows: list[dict[str, Any]]


class Database(_Model):
    """The snapshot: DDL plus seed rows. Loaded once into a checksummed template database."""

    ddl: str = Field(min_length=1, description="PostgreSQL DDL, executed as one script.")
    seed: list[SeedTable] = Field(default_factory=list)
    sqlite_ddl: str | None = Field(
        default=None, description="SQLite DDL of the same tables, for verifiers that read SQLite files.")
    awm_schema: dict[str, Any] | None = Field(
        default=None, description="Imported environments: the AWM release's `db_schema` (SQLite DDL per table) "
                                  "this snapshot was translated from; `awm catalog export --format awm` writes it back.")


class Route(_Model):
    """Where a tool lives in the bundle's app: one HTTP route, and where each argument goes."""

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
    path: str = Field(pattern=r"^/", description="Path template, e.g. /api/books/{book_id}.")
    params: dict[str, Literal["path", "query", "body"]] = Field(
        default_factory=dict, description="Argument name -> where it is sent.")
    operation_id: str | None = Field(default=None, description="The route's OpenAPI operation_id (AWM imports).")


class App(_Model):
    """An HTTP application whose routes are tools (AWM-1K environments)."""

    kind: Literal["fastapi"] = "fastapi"
    code: str = Field(min_length=1, description="Python source of one FastAPI + SQLAlchemy module.")


class Tool(_Model):
    """One MCP tool: name, description and input schema are what the agent sees."""

    name: Identifier
    description: str = Field(min_length=1)
    input_schema: dict[str, Any] = Field(description="JSON Schema (type object) of the arguments.")
    code: str = Field(default="", description="Python source defining `def <name>(db, **arguments)`.")
    route: Route | None = Field(default=None, description="Set for a route of the bundle's app; then "
                                                          "`code` is unused.")

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        if schema.get("type") != "object":
            raise ValueError("input_schema must be a JSON Schema with type 'object'")
        return schema


class ToolCall(_Model):
    """One step of a reference solution."""

    tool: Identifier
    arguments: dict[str, Any] = Field(default_factory=dict)


class Verifier(_Model):
    """How an episode is judged. ``code``: the entrypoint returns the verdict itself. ``judge``
    (the reference system's "sql" mode, its recommended one): the entrypoint returns *evidence*
    (any JSON value) gathered from the initial and final databases, and an LLM judge classifies
    the episode from the task, that evidence, the criteria below and the episode's tool calls."""

    kind: Literal["code", "judge"] = "code"
    code: str = Field(description="Python source defining the entrypoint function.")
    entrypoint: str = "verify"
    inputs: Literal["db", "sqlite"] = Field(
        default="db", description="'db': entrypoint(final, initial, answer) with query views; "
                                  "'sqlite': entrypoint(initial_db_path, final_db_path, final_answer).")
    success_criteria: str = Field(default="", description="For the judge: what a complete episode shows.")
    failure_criteria: str = Field(default="", description="For the judge: what an incomplete one shows.")

    def digest(self, prelude: str = "") -> str:
        """Content hash of what decides verdicts: a gate record holds only for this verifier."""
        payload = json.dumps([self.model_dump(mode="json"), prelude], sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class GateResult(_Model):
    """One gate run: what the verifier (or judge) said and whether that is what the gate needs."""

    passed: bool
    verdict: str = Field(description="complete | incomplete | agent_error | error ...")
    reason: str = ""
    at: str = Field(description="When it ran (ISO 8601, UTC).")


class GateRecord(_Model):
    """The two gates of one task for one verifier, against one snapshot. It holds only while
    ``snapshot`` is the bundle's database hash and ``verifier`` the digest of the verifier served."""

    verifier_kind: Literal["code", "judge"]
    verifier: str = Field(description="Verifier.digest() of the verifier the gates ran.")
    snapshot: str = Field(description="EnvBundle.database_hash() of the snapshot they ran on.")
    negative: GateResult | None = Field(default=None, description="Untouched snapshot: must not be complete.")
    positive: GateResult | None = Field(default=None, description="After the reference solution: must be complete.")

    @property
    def passed(self) -> bool:
        return bool(self.negative and self.negative.passed and self.positive and self.positive.passed)


class Task(_Model):
    id: Identifier
    instruction: str = Field(min_length=1)
    verifier: Verifier
    alt_verifier: Verifier | None = Field(
        default=None, description="A verifier of the other kind, when the task has both (AWM imports "
                                  "keep code and judge mode); served when that kind is preferred.")
    solution: list[ToolCall] = Field(
        description="Reference solution: tool calls that solve the task from the snapshot."
    )
    final_answer: str | None = Field(
        default=None, description="The answer a correct agent would end with, if the task asks for one."
    )
    gates: list[GateRecord] = Field(default_factory=list, description="Gate records, one per verifier run.")

    def verifiers(self) -> list[Verifier]:
        return [self.verifier] + ([self.alt_verifier] if self.alt_verifier else [])

    def select(self, prefer: Literal["code", "judge"] | None = None) -> Verifier:
        """The verifier served: the preferred kind when the task has it, else the primary one."""
        if prefer and self.alt_verifier is not None and self.alt_verifier.kind == prefer:
            return self.alt_verifier
        return self.verifier


class Limits(_Model):
    """Per-environment limits for untrusted code."""

    tool_timeout_s: float = Field(default=10.0, gt=0)
    verifier_timeout_s: float = Field(default=10.0, gt=0)
    verifier_memory_mb: int = Field(default=512, ge=64)


class EnvBundle(_Model):
    format: Literal["awm.bundle/v1"] = FORMAT_VERSION
    scenario: Scenario
    database: Database
    tool_prelude: str = Field(default="", description="Shared imports and helpers for tool code.")
    tools: list[Tool] = Field(min_length=1)
    app: App | None = Field(default=None, description="Application serving the tools that have a route.")
    verifier_prelude: str = Field(default="", description="Shared imports and helpers for verifiers.")
    tasks: list[Task] = Field(default_factory=list)
    limits: Limits = Field(default_factory=Limits)

    @property
    def name(self) -> str:
        return self.scenario.name

    @model_validator(mode="after")
    def _consistent(self) -> EnvBundle:
        tool_names = [t.name for t in self.tools]
        _no_duplicates("tool", tool_names)
        _no_duplicates("task", [t.id for t in self.tasks])
        for name in tool_names:
            if keyword.iskeyword(name):
                raise ValueError(f"tool name {name!r} is a Python keyword")
        for tool in self.tools:
            if tool.route is None and not tool.code:
                raise ValueError(f"tool {tool.name!r} has neither code nor a route")
            if tool.route is not None and self.app is None:
                raise ValueError(f"tool {tool.name!r} has a route but the bundle has no app")
        known = set(tool_names)
        for task in self.tasks:
            for step in task.solution:
                if step.tool not in known:
                    raise ValueError(f"task {task.id!r}: solution calls unknown tool {step.tool!r}")
            for verifier in task.verifiers():
                if not re.search(rf"\bdef\s+{re.escape(verifier.entrypoint)}\s*\(", verifier.code):
                    raise ValueError(f"task {task.id!r}: verifier code does not define {verifier.entrypoint}()")
                if verifier.inputs == "sqlite" and self.database.sqlite_ddl is None:
                    raise ValueError("verifiers with inputs 'sqlite' need database.sqlite_ddl")
            if task.alt_verifier is not None and task.alt_verifier.kind == task.verifier.kind:
                raise ValueError(f"task {task.id!r}: alt_verifier must be of the other kind")
        return self

    def tool(self, name: str) -> Tool:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)

    def task(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(task_id)

    def database_hash(self) -> str:
        """Content hash of the snapshot: names the template database, so a changed seed reloads."""
        # sqlite_ddl and awm_schema do not shape the Postgres template, so they do not name it either.
        payload = json.dumps(self.database.model_dump(mode="json", exclude={"sqlite_ddl", "awm_schema"}),
                             sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()


def _no_duplicates(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {kind} {name!r}")
        seen.add(name)


def bundle_json_schema() -> dict[str, Any]:
    schema = EnvBundle.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://awm.dev/schema/bundle-v1.json"
    return schema
