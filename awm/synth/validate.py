"""Validation by execution, in a real PostgreSQL, for every synthesis stage.

Nothing generated is trusted because it parsed: DDL must execute, every seed row must insert
(zero tolerated failures), every tool must run once on schema-valid example arguments without
crashing, every verifier must say *not complete* on the untouched snapshot, and every reference
solution must make its verifier say *complete* when replayed through MCP. Each check returns the
list of error messages that is fed back to the model on the next attempt (empty = passed).
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any, AsyncIterator, Iterator

import jsonschema
import psycopg
from psycopg import sql

from awm.bundle import Database, EnvBundle, SeedTable, Task
from awm.client import ControlClient, McpSession
from awm.fleet import Database as FleetDatabase
from awm.fleet import LocalFleet
from awm.postgres import provision


@contextlib.contextmanager
def scratch_database(admin_dsn: str) -> Iterator[psycopg.Connection]:
    name = f"awm_synth_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(name)))
    try:
        with provision._admin(admin_dsn, name) as conn:
            yield conn
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def check_ddl(admin_dsn: str, ddl: str) -> list[str]:
    with scratch_database(admin_dsn) as conn:
        try:
            with conn.transaction():
                conn.execute(ddl)
        except psycopg.Error as exc:
            return [f"DDL failed: {_pg_message(exc)}"]
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0]
        return [] if tables else ["DDL created no tables in schema public"]


def check_seed(admin_dsn: str, ddl: str, seed: list[SeedTable]) -> list[str]:
    """Every row must insert. All failing tables are reported, each with its first bad row."""
    errors = []
    with scratch_database(admin_dsn) as conn:
        with conn.transaction():
            conn.execute(ddl)
        known = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        for table in seed:
            if table.table not in known:
                errors.append(f"table {table.table!r} does not exist (tables: {', '.join(sorted(known))})")
                continue
            try:
                with conn.transaction():
                    provision.insert_rows(conn, table.table, table.rows)
            except provision.ProvisionError as exc:
                errors.append(str(exc))
    return errors


async def check_tools(admin_dsn: str, bundle: EnvBundle, examples: dict[str, dict[str, Any]]) -> list[str]:
    """Load the tool code and call every tool once with its example arguments, in the real
    runtime; a ``ToolError`` (a refusal) is fine, a crash or a timeout is not."""
    from envserver.instance import EnvInstance
    from envserver.tools import ToolFailure, ToolRuntime

    errors = []
    try:
        ToolRuntime(bundle)
    except Exception as exc:  # noqa: BLE001 - untrusted code: every failure is feedback
        return [f"tool code does not load: {type(exc).__name__}: {exc}"]
    for tool in bundle.tools:
        args = examples.get(tool.name)
        if args is None:
            errors.append(f"{tool.name}: no example arguments given")
            continue
        problems = [e.message for e in jsonschema.validators.validator_for(tool.input_schema)(
            tool.input_schema).iter_errors(args)]
        if problems:
            errors.append(f"{tool.name}: example arguments do not match the input schema: {problems[:3]}")
    if errors:
        return errors
    async with served_in_process(admin_dsn, bundle) as instance:
        for tool in bundle.tools:
            await instance.reset(None)
            try:
                await instance.call_tool(tool.name, examples[tool.name])
            except ToolFailure as failure:
                if failure.kind not in ("tool_error",):
                    errors.append(f"{tool.name}({examples[tool.name]}): {failure}")
    return errors


@contextlib.asynccontextmanager
async def served_in_process(admin_dsn: str, bundle: EnvBundle) -> AsyncIterator[Any]:
    """A real instance (template, database, role, runtime, verifier pool) without HTTP."""
    from envserver.instance import EnvInstance

    template = provision.ensure_template(admin_dsn, bundle)
    name = f"awm_i_synth_{secrets.token_hex(3)}"
    db = provision.create_instance(admin_dsn, template, name)
    instance = EnvInstance(bundle, db.dsn, name, exit_when_wedged=False)
    try:
        await instance.start()
        yield instance
    finally:
        await instance.close()
        provision.drop_instance(admin_dsn, name)


async def check_verifiers_untouched(instance: Any, tasks: list[Task]) -> dict[str, list[str]]:
    """The negative gate, per task: on the pristine snapshot, with no answer, the verifier must
    say incomplete (complete = the task starts done; error = the verifier is broken)."""
    errors: dict[str, list[str]] = {}
    for task in tasks:
        await instance.reset(task.id)
        verdict = await instance.verify(None)
        if verdict["verdict"] == "complete":
            errors[task.id] = ["the verifier says complete on the untouched database: it must check the "
                               f"change the task asks for (reason given: {verdict['reason']})"]
        elif verdict["verdict"] == "error":
            errors[task.id] = [f"the verifier failed on the untouched database: {verdict['reason']}"]
    return errors


async def check_solutions_through_mcp(admin_dsn: str, bundle: EnvBundle) -> dict[str, list[str]]:
    """The positive gate, per task, the way an agent would do it: serve the bundle, replay each
    reference solution over MCP, verify with its final answer."""
    from awm.gates import replay

    errors: dict[str, list[str]] = {}
    fleet = LocalFleet([bundle], database=FleetDatabase(admin_dsn))
    await fleet.start()
    try:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        async with McpSession(handle.mcp_url) as mcp:
            for task in bundle.tasks:
                report = await replay(bundle.name, task, mcp, control)
                if not report.ok:
                    errors[task.id] = [f"after the reference solution the verdict is {report.verdict}: {report.reason}"]
        await control.close()
    finally:
        await fleet.stop()
    return errors


def snapshot_bundle(name: str, description: str, ddl: str, seed: list[SeedTable]) -> dict[str, Any]:
    return {"scenario": {"name": name, "description": description},
            "database": Database(ddl=ddl, seed=seed).model_dump(mode="json")}


def _pg_message(exc: psycopg.Error) -> str:
    diag = exc.diag
    parts = [diag.message_primary or str(exc)]
    if diag.message_detail:
        parts.append(diag.message_detail)
    if diag.statement_position:
        parts.append(f"at character {diag.statement_position}")
    return "; ".join(parts)
