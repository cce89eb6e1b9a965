"""The statement guard for untrusted code's SQL: Postgres' own parser and an allow-list.

Tool, verifier and app code sends statements over its pipe; before one runs on the instance's
connection, :func:`check_statement` parses it with ``pglast`` (libpg_query: the server's own
grammar, so quoting, Unicode escapes, comments and dollar quotes cannot hide anything) and walks
the whole tree:

* the statement is one data statement: ``SELECT`` (no ``INTO``), ``INSERT``, ``UPDATE``,
  ``DELETE``, ``MERGE``, ``VALUES``/``TABLE`` or ``SHOW``; everything else (transaction and session
  control, DDL, ``COPY``, ``LISTEN``, ``PREPARE``, ``DO``, ``CALL``, ...) is refused;
* every write (also one inside a ``WITH``) targets the instance's own tables: schema ``public``
  or none, never a ``pg_`` relation (``UPDATE pg_settings`` would change session settings);
* every function called is on the allow-list (``sql_allowlist.py``): the built-in functions that
  cannot change anything outside the episode's transaction (immutable and stable ones, less the
  ones that execute SQL text or report on the server and its other sessions, plus a reviewed few
  volatile ones such as ``random`` and ``nextval``), by name, unqualified or in ``pg_catalog``; every operator is a
  built-in one. There is no list of bad functions to keep complete: an unknown name is refused.

The second layer is the server's: the template database revokes from PUBLIC what this list
leaves out where the admin role can (advisory locks, ``set_config``, ``ts_stat``...), and the
instance role has no DDL or TEMP privilege. The allow-list is generated from a server's catalog
(``python -m awm.envserver.sqlguard --write``; tests/test_sqlguard.py checks it is current).
"""

from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path
from typing import Any

from pglast import ast, enums, parse_sql
from pglast.parser import ParseError, scan

from awm.envserver.sql_allowlist import FUNCTIONS, OPERATORS


class ToolError(Exception):
    """An error meant for the agent: the message is returned as the tool's error text."""


class SqlForbidden(ToolError):
    pass


_DATA = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt, ast.VariableShowStmt)
_WRITES = (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt)
# A_Expr kinds naming an operator (LIKE, BETWEEN, IN ... are keywords the parser maps to built-ins)
_OPERATOR_KINDS = (enums.A_Expr_Kind.AEXPR_OP, enums.A_Expr_Kind.AEXPR_OP_ANY, enums.A_Expr_Kind.AEXPR_OP_ALL)
# psycopg's placeholders (only when the statement has parameters, as psycopg itself does)
_PLACEHOLDER = re.compile(r"%(?:\(([^)]+)\))?(.)", re.DOTALL)
_APP_SAVEPOINT = re.compile(
    r"^\s*(SAVEPOINT|RELEASE\s+SAVEPOINT|ROLLBACK\s+TO\s+SAVEPOINT)\s+(sa_savepoint|awm_app)_\d+\s*;?\s*$",
    re.IGNORECASE)


def is_app_savepoint(sql: str) -> bool:
    """The savepoints an app's connection facade opens and closes inside the tool's savepoint."""
    return bool(_APP_SAVEPOINT.match(sql))


def _server_text(sql: str) -> str:
    """The statement as psycopg sends it when it has parameters: ``%s``, ``%(name)s`` (and ``b``,
    ``t``) become ``$n``, ``%%`` becomes ``%``; any other ``%`` sequence psycopg refuses too."""
    names: dict[str, int] = {}

    def sub(match: re.Match[str]) -> str:
        name, kind = match.group(1), match.group(2)
        if kind == "%" and name is None:
            return "%"
        if kind not in "sbt":
            raise SqlForbidden(f"only %s, %b and %t are placeholders (and %% a percent sign), not %{kind}")
        key = name if name is not None else f"#{len(names)}"
        return f"${names.setdefault(key, len(names) + 1)}"
    return _PLACEHOLDER.sub(sub, sql)


CACHED_TEXT = 8192  # statements up to this long are remembered (4,096 of them: at most 32 MiB)


def check_statement(sql: str, with_params: bool = True) -> bool:
    """Refuse anything but one data statement that calls only allowed functions and writes only
    the instance's tables; True if it is a query that only reads (a ``SELECT``, ``VALUES`` or
    ``TABLE`` with no write anywhere in it: the caller may cap its rows with a ``LIMIT``)."""
    if len(sql) > CACHED_TEXT:  # parsed every time: untrusted code cannot fill the cache with big texts
        return _check.__wrapped__(sql, with_params)
    return _check(sql, with_params)


@functools.lru_cache(maxsize=4096)  # tools send the same few statements over and over
def _check(sql: str, with_params: bool) -> bool:
    if "\x00" in sql:
        raise SqlForbidden("statement contains a NUL character")
    try:
        statements = parse_sql(_server_text(sql) if with_params else sql)
    except ParseError as exc:
        raise SqlForbidden(f"not a valid statement: {exc}") from None
    if len(statements) != 1:
        raise SqlForbidden("one statement per call" if statements else "empty statement")
    stmt = statements[0].stmt
    if not isinstance(stmt, _DATA):
        raise SqlForbidden(f"statement not allowed in an environment tool: {_first_word(sql)}")
    reads_only = isinstance(stmt, ast.SelectStmt)
    for node in _walk(stmt):
        if isinstance(node, ast.SelectStmt) and node.intoClause is not None:
            raise SqlForbidden("SELECT ... INTO (creating a table) is not allowed in an environment tool")
        elif isinstance(node, _WRITES):
            reads_only = False
            _check_target(node.relation)
        elif isinstance(node, ast.FuncCall):
            _check_function(node.funcname)
        elif isinstance(node, ast.A_Expr) and node.kind in _OPERATOR_KINDS:
            _check_operator(node.name)
    return reads_only


def _first_word(sql: str) -> str:
    """The statement's first keyword as written (``COMMIT``, ``SET``), past comments."""
    for token in scan(sql):
        if not token.name.endswith("COMMENT"):
            return sql[token.start:token.end + 1].upper()[:40]
    return "(empty)"


def _walk(node: Any) -> Any:
    """Every AST node under ``node`` (itself included), iteratively (no recursion limit)."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Node):
            yield item
            for name in item:  # a node iterates over its attribute names
                value = getattr(item, name)
                if isinstance(value, (ast.Node, tuple, list)):
                    stack.append(value)
        elif isinstance(item, (tuple, list)):
            stack.extend(item)


def _names(parts: Any) -> list[str]:
    return [p.sval for p in parts if isinstance(p, ast.String)]


def _check_target(relation: Any) -> None:
    if relation is None:
        return
    schema, name = relation.schemaname, relation.relname or ""
    if relation.catalogname or schema not in (None, "public") or name.startswith("pg_"):
        full = ".".join(p for p in (relation.catalogname, schema, name) if p)
        raise SqlForbidden(f"writes only to the environment's own tables, not {full[:80]}")


def _check_function(funcname: Any) -> None:
    parts = _names(funcname)
    name = parts[-1] if parts else ""
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "pg_catalog") or name not in FUNCTIONS:
        raise SqlForbidden(f"function not allowed in an environment tool: {'.'.join(parts)[:80]} "
                           "(only built-in functions that change nothing outside the episode)")


def _check_operator(name: Any) -> None:
    parts = _names(name)
    if not parts or (len(parts) == 2 and parts[0] != "pg_catalog") or len(parts) > 2 or parts[-1] not in OPERATORS:
        raise SqlForbidden(f"operator not allowed in an environment tool: {'.'.join(parts)[:40]}")


# --------------------------------------------------------------------------- the allow-list

# Immutable and stable functions that still may not run: they execute SQL text or read whole
# tables (the *_to_xml family runs a query string, ts_stat and ts_rewrite a query), or they report
# on the server, its files and its other sessions (activity, locks, settings' sources, file
# paths, replication, backend pids) rather than on the episode's data.
NOT_ALLOWED = re.compile(
    r"^(query_to_xml\w*|cursor_to_xml\w*|table_to_xml\w*|schema_to_xml\w*|database_to_xml\w*|ts_stat|ts_rewrite|"
    r"pg_(stat_\w+|ls_\w+|show_\w+|settings_get_flags|conf_load_time|postmaster_start_time|config|cursor|"
    r"prepared_statement|listening_channels|get_replication_slots|get_publication_tables|replication_origin_oid|"
    r"tablespace_\w+|relation_filenode|relation_filepath|filenode_relation|current_logfile|event_trigger_\w+|"
    r"available_\w+|extension_update_paths|numa_available|split_walfile_name|backend_pid|current_snapshot|"
    r"current_xact_id\w*|get_backend_memory_contexts|get_shmem_allocations\w*|control_\w+|lock_status|"
    r"blocking_pids|get_wal_\w+|walfile_name\w*))$")
# Volatile functions allowed all the same: they change only the episode's own data (sequences,
# which the reset restores) or nothing. Reviewed one by one.
REVIEWED = frozenset({"random", "random_normal", "nextval", "currval", "setval", "lastval",
                      "clock_timestamp", "timeofday", "gen_random_uuid", "uuidv4", "uuidv7"})

_CATALOG_QUERY = """
SELECT p.proname, bool_and(p.provolatile IN ('i', 's')) AS safe
FROM pg_proc p
WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'a', 'w')
  AND p.prorettype NOT IN ('internal'::regtype, 'cstring'::regtype, 'trigger'::regtype, 'event_trigger'::regtype,
                           'language_handler'::regtype, 'fdw_handler'::regtype, 'index_am_handler'::regtype,
                           'table_am_handler'::regtype, 'tsm_handler'::regtype)
  AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes) t WHERE t IN ('internal'::regtype, 'cstring'::regtype))
GROUP BY p.proname
"""


def generate(admin_dsn: str) -> tuple[list[str], list[str], str]:
    """(functions, operators, server version) from a server's catalog, by the rules above: every
    overload immutable or stable and not in ``NOT_ALLOWED``; or one of ``REVIEWED``."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        rows = conn.execute(_CATALOG_QUERY).fetchall()
        operators = sorted(r[0] for r in conn.execute(
            "SELECT DISTINCT oprname FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace"))
        version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    functions = sorted(name for name, safe in rows if name in REVIEWED or (safe and not NOT_ALLOWED.match(name)))
    return functions, operators, version


def render(functions: list[str], operators: list[str], version: str) -> str:
    def block(names: list[str]) -> str:
        lines, line = [], "   "
        for n in names:
            item = f" {n!r},"
            if len(line) + len(item) > 110:
                lines.append(line)
                line = "   "
            line += item
        return "\n".join(lines + [line])
    return (f'"""Generated by ``python -m awm.envserver.sqlguard --write`` from PostgreSQL {version}\'s catalog\n'
            f'(rules: sqlguard.generate). Do not edit: regenerate.\n"""\n\n'
            f"FUNCTIONS = frozenset({{\n{block(functions)}\n}})\n\nOPERATORS = frozenset({{\n{block(operators)}\n}})\n")


def main() -> None:
    ap = argparse.ArgumentParser(description="Write envserver/sql_allowlist.py from a server's catalog.")
    ap.add_argument("--database-url", help="admin DSN (default: the embedded server of AWM_HOME)")
    ap.add_argument("--write", action="store_true", help="write the module (else print it)")
    args = ap.parse_args()
    dsn = args.database_url
    if dsn is None:
        from awm.postgres.server import EmbeddedPostgres

        server = EmbeddedPostgres.default()
        server.start()
        dsn = server.admin_dsn()
    text = render(*generate(dsn))
    if args.write:
        Path(__file__).with_name("sql_allowlist.py").write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
