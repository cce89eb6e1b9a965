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
from awm.errorclass import ErrorClass
from awm.fleet import Database as FleetDatabase
from awm.fleet import FleetError, LocalFleet
from awm.judge import JudgeSettings
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
        try:
            with conn.transaction():
                conn.execute(ddl)
        except psycopg.Error as exc:  # an unvalidated schema carried on by --keep-best
            return [f"the schema these rows are for does not run: {_pg_message(exc)}"]
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
    """Serve the bundle and call every tool once with its example arguments, through MCP; a
    ``tool_error`` (a refusal) is fine, a crash, a timeout or code that does not load is not.

    The generated code runs only in the env server's confined workers: never in this process,
    which holds the LLM key and the admin DSN. A tool that loops, forks, allocates 10 GB or calls
    ``exit`` is killed there and comes back as an error for the next repair attempt."""
    errors = []
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
    try:
        async with served(admin_dsn, bundle) as (control, mcp):
            for tool in bundle.tools:
                await control.reset(None)
                outcome = await mcp.call_tool(tool.name, examples[tool.name])
                if outcome.is_error and outcome.error_kind != ErrorClass.TOOL_ERROR:
                    errors.append(f"{tool.name}({examples[tool.name]}): {outcome.text}")
    except FleetError as exc:
        return [f"tool code does not load: {_served_error(exc)}"]
    return errors


@contextlib.asynccontextmanager
async def served(admin_dsn: str, bundle: EnvBundle, judge: JudgeSettings | None = None
                 ) -> AsyncIterator[tuple[ControlClient, McpSession]]:
    """One real instance of the bundle (template, database, role, env server process with its
    confined workers, the LLM judge when its verifiers need one), and a control and an MCP client."""
    # Ungated tasks allowed: this is where their gates run.
    fleet = LocalFleet([bundle], database=FleetDatabase(admin_dsn), start_timeout_s=60.0, allow_ungated=True,
                       judge=judge)
    await fleet.start()
    try:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        try:
            async with McpSession(handle.mcp_url) as mcp:
                yield control, mcp
        finally:
            await control.close()
    finally:
        await fleet.stop()


def _served_error(exc: FleetError) -> str:
    """The env server's last words when it could not start (e.g. the tool code does not load)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1][-1500:] if lines else "the env server did not start"


async def check_verifiers_untouched(control: ControlClient, tasks: list[Task]) -> dict[str, list[str]]:
    """The negative gate, per task: on the pristine snapshot, with no answer, the verifier must
    say incomplete (complete = the task starts done; error = the verifier is broken)."""
    errors: dict[str, list[str]] = {}
    for task in tasks:
        await control.reset(task.id)
        verdict = await control.verify(None)
        if verdict["verdict"] == "complete":
            errors[task.id] = ["the verifier says complete on the untouched database: it must check the "
                               f"change the task asks for (reason given: {verdict['reason']})"]
        elif verdict["verdict"] == "error":
            errors[task.id] = [f"the verifier failed on the untouched database: {verdict['reason']}"]
    return errors


async def check_solutions_through_mcp(admin_dsn: str, bundle: EnvBundle, judge: JudgeSettings | None = None
                                      ) -> dict[str, list[str]]:
    """The positive gate, per task, the way an agent would do it: serve the bundle, replay each
    reference solution over MCP, verify with its final answer."""
    from awm.gates import replay

    errors: dict[str, list[str]] = {}
    fleet = LocalFleet([bundle], database=FleetDatabase(admin_dsn), allow_ungated=True, judge=judge)  # gates run here
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
