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
  every relation read is one too: no catalog, statistics or lock view (``pg_locks``,
  ``pg_stat_activity``, ``pg_class.relpages``...) reports other sessions or earlier episodes;
* no system column (``ctid``, ``xmin``, ``xmax``, ``cmin``, ``cmax``, ``tableoid``), however
  reached (``t.ctid``, ``(t).xmin``, ``ctid(t)``), and no ``TABLESAMPLE``: a rollback restores rows,
  not their places or transaction ids, so these would show what an earlier episode did;
* the statement is at most :data:`MAX_STATEMENT_CHARS` long, checked before it is parsed (the
  parse costs time and, for a long operator chain, C stack in this process);
* every function called is on the allow-list (``sql_allowlist.py``): the built-in functions that
  cannot change anything outside the episode's transaction (immutable and stable ones, less the
  ones that execute SQL text or report on the server and its other sessions, plus a reviewed few
  volatile ones such as ``random`` and ``nextval``), by name, unqualified or in ``pg_catalog``; every operator is a
  built-in one. There is no list of bad functions to keep complete: an unknown name is refused.
  Functions are classified by their *implementation* (the C symbol in ``pg_proc.prosrc``; for SQL
  functions, what their bodies call), so an alias of a refused function (``txid_current_snapshot``
  is ``pg_current_snapshot``) is refused with it; an overload refused under an allowed name
  (``age(xid)`` beside ``age(timestamp)``) is in :data:`REVOKED_OVERLOADS`, which the template
  revokes from ``PUBLIC``.

The second layer is the server's: the template database revokes from PUBLIC what this list
leaves out where the admin role can (advisory locks, ``set_config``, ``ts_stat``...), and the
instance role has no DDL or TEMP privilege. The allow-list is generated from a server's catalog
(``python -m awm.envserver.sqlguard --write``; tests/test_sqlguard.py checks it is current).
"""

from __future__ import annotations

import argparse
import functools
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

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
# Statements longer than this are refused unparsed. Parsing costs 10-100 us a token in this
# process, outside any deadline (a 2.3 MB statement took 11 s, and an 11.4 MB one wedged the
# instance), and more than linearly for deep trees. 64 Ki characters hold any statement a tool or
# an ORM sends but SQLAlchemy's largest multi-row INSERT pages (refused with this reason).
MAX_STATEMENT_CHARS = 64 * 1024
# A long statement may hold at most this many runs of operator characters: a left-associative
# chain (``1+1+...``) is one tree level per operator, parsed more than linearly, and pglast builds
# its tree recursively (25,000 levels overflow an 8 MiB C stack: a segfault of the env server).
MAX_OPERATORS = 4096
_OPERATOR_RUN = re.compile(r"[-+*/<>=~!@#%^&|`?]+")
# A statement longer than CACHED_TEXT is parsed on a thread with this much stack: nesting is
# bounded by the operators above and by the parser's own 10,000-deep limit, ~400 bytes a level.
_PARSER_STACK = 64 * 1024 * 1024
SYSTEM_COLUMNS = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})


def check_statement(sql: str, with_params: bool = True) -> bool:
    """Refuse anything but one data statement that calls only allowed functions and writes only
    the instance's tables; True if it is a query that only reads (a ``SELECT``, ``VALUES`` or
    ``TABLE`` with no write anywhere in it: the caller may cap its rows with a ``LIMIT``)."""
    if len(sql) <= CACHED_TEXT:
        return _check(sql, with_params)
    _check_size(_PLACEHOLDER.sub(" ", sql) if with_params else sql)
    # parsed every time (untrusted code cannot fill the cache with big texts), on a big stack
    return _on_big_stack(_check.__wrapped__, sql, with_params)


def _check_size(sql: str) -> None:
    """Bound a long statement's parse cost before parsing it: its length and its operators
    (placeholders already taken out: a 1,000-row INSERT page holds thousands of ``%s``)."""
    if len(sql) > MAX_STATEMENT_CHARS:
        raise SqlForbidden(f"statement too long: {len(sql):,} characters (at most {MAX_STATEMENT_CHARS:,})")
    operators = sum(1 for _ in _OPERATOR_RUN.finditer(sql))
    if operators > MAX_OPERATORS:
        raise SqlForbidden(f"statement too complex: {operators:,} operators (at most {MAX_OPERATORS:,})")


_STACK_LOCK = threading.Lock()


def _on_big_stack(fn: Callable[..., bool], *args: Any) -> bool:
    """``fn(*args)`` on a thread of its own with :data:`_PARSER_STACK` of C stack: a deep tree
    from a long statement must fail or pass, never overflow the caller's stack (a segfault of the
    env server). Only for long statements, which are rare and parsed every time anyway."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(exc)

    with _STACK_LOCK:  # stack_size is process-wide: set it only for this thread's creation
        previous = threading.stack_size(_PARSER_STACK)
        try:
            thread = threading.Thread(target=run, name="awm-sqlguard-parse", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return bool(outcome[0])


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
        elif isinstance(node, ast.RangeVar):
            _check_source(node)
        elif isinstance(node, ast.FuncCall):
            _check_system_column(_names(node.funcname)[-1:])  # ctid(t) is t.ctid
            _check_function(node.funcname)
        elif isinstance(node, ast.ColumnRef):
            _check_system_column(_names(node.fields)[-1:])
        elif isinstance(node, ast.A_Indirection):
            _check_system_column(_names(node.indirection))  # (t).xmin
        elif isinstance(node, ast.RangeTableSample):
            raise SqlForbidden("TABLESAMPLE is not allowed in an environment tool (it samples the "
                               "table's physical layout, which earlier episodes changed)")
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


def _check_source(relation: Any) -> None:
    """A relation read: the instance's own tables (unqualified or ``public``), never a catalog
    or statistics view (unqualified ``pg_*`` names resolve to ``pg_catalog``, which is always
    searched first): those report other sessions, other instances and earlier episodes."""
    schema, name = relation.schemaname, relation.relname or ""
    if relation.catalogname or schema not in (None, "public") or name.startswith("pg_"):
        full = ".".join(p for p in (relation.catalogname, schema, name) if p)
        raise SqlForbidden(f"reads only the environment's own tables, not {full[:80]}")


def _check_system_column(parts: list[str]) -> None:
    """System columns show a row's physical place and transaction ids, which a rollback does not
    restore: a new row's ``ctid`` or ``xmin`` reveals rows an earlier episode inserted."""
    for part in parts:
        if part in SYSTEM_COLUMNS:
            raise SqlForbidden(f"system column {part} is not allowed in an environment tool (it "
                               "shows the table's physical layout, which earlier episodes changed)")


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
# paths, replication, backend pids, client and server addresses) rather than on the episode's
# data, or on the transaction machinery, whose counters every transaction of the cluster moves
# and a rollback does not restore (transaction ids and their ages, snapshots, multixacts, TOAST
# value ids: ``txid_current_snapshot`` shows another instance's open transaction).
# Matched against a function's name AND its implementation's symbol (``pg_proc.prosrc`` of an
# internal or C function): an alias shares the symbol, so ``txid_current`` (``pg_current_xact_id``)
# is refused with ``pg_current_xact_id`` whatever it is called.
NOT_ALLOWED = re.compile(
    r"^(query_to_xml\w*|cursor_to_xml\w*|table_to_xml\w*|schema_to_xml\w*|database_to_xml\w*|ts_stat|ts_rewrite|"
    r"inet_(client|server)_(addr|port)|x?xid_age|mxid_age|"
    r"pg_(stat_\w+|ls_\w+|show_\w+|settings_get_flags|conf_load_time|postmaster_start_time|config|cursor|"
    r"prepared_statement|listening_channels|get_replication_slots|get_publication_tables|replication_origin_oid|"
    r"tablespace_\w+|relation_filenode|relation_filepath|filenode_relation|current_logfile|event_trigger_\w+|"
    r"available_\w+|extension_update_paths|numa_available|split_walfile_name|backend_pid|current_snapshot|"
    r"current_xact_id\w*|get_backend_memory_contexts|get_shmem_allocations\w*|control_\w+|lock_status|"
    r"blocking_pids|get_wal_\w+|walfile_name\w*|column_toast_chunk_id|xact_\w+|last_committed_xact|"
    r"get_multixact_members|export_snapshot|prepared_xact|safe_snapshot_blocking_pids))$")
# Implementations whose work grows with the product of their arguments' lengths and that never
# check for a cancel, so that no deadline ends them (the statement timeout, the server's protocol
# cancel and a terminate all wait for such a check): ``translate`` and the trims with a set of
# characters compare every character of one argument with every one of the other (measured on
# PostgreSQL 18.6: translate of 100,000 characters by 20,000 ran 7.2 s past a 1 s timeout, 200,000
# by 40,000 29 s; btrim 2.5 s). Matched against the implementation's symbol only: ``btrim(text)``
# (``btrim1``, what ``TRIM(x)`` calls) stays allowed beside a refused ``btrim(text, text)``.
UNCANCELLABLE = re.compile(r"^(translate|btrim|ltrim|rtrim|byteatrim|bytealtrim|byteartrim)$")
# Volatile functions allowed all the same: they change only the episode's own data (sequences,
# which the reset restores) or nothing. Reviewed one by one. (``currval``/``lastval`` read the
# session's sequence state, which each reset discards: ``DISCARD SEQUENCES``.)
REVIEWED = frozenset({"random", "random_normal", "nextval", "currval", "setval", "lastval",
                      "clock_timestamp", "timeofday", "gen_random_uuid", "uuidv4", "uuidv7"})

# Every callable overload in pg_catalog (not those taking or returning internal/cstring/handler
# types, which SQL cannot call), with what identifies its implementation.
_CATALOG_QUERY = """
SELECT p.oid::bigint, p.proname, p.provolatile, l.lanname, coalesce(p.prosrc, ''), coalesce(p.probin, ''),
       coalesce(p.prosqlbody::text, ''), p.oid::regprocedure::text
FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'a', 'w')
  AND p.prorettype NOT IN ('internal'::regtype, 'cstring'::regtype, 'trigger'::regtype, 'event_trigger'::regtype,
                           'language_handler'::regtype, 'fdw_handler'::regtype, 'index_am_handler'::regtype,
                           'table_am_handler'::regtype, 'tsm_handler'::regtype)
  AND NOT EXISTS (SELECT 1 FROM unnest(p.proargtypes) t WHERE t IN ('internal'::regtype, 'cstring'::regtype))
"""
# The functions a SQL-standard body (BEGIN ATOMIC / RETURN) calls, in its stored node tree.
_CALLED = re.compile(r":(?:funcid|opfuncid|aggfnoid|winfnoid) (\d+)")


@dataclass(frozen=True)
class Overload:
    """One pg_proc row: its name, signature, volatility and implementation."""

    oid: int
    name: str
    volatility: str
    language: str
    symbol: str  # prosrc: the C symbol of an internal/C function, the body of a SQL one
    library: str
    sqlbody: str
    signature: str  # regprocedure text: pg_catalog-qualified when not on the search path

    def implementation(self) -> str:
        """What the server runs: the C symbol (with its library for C functions); SQL: its body."""
        if self.language == "c":
            return f"{self.library}:{self.symbol}"
        return self.symbol if self.language == "internal" else f"sql:{self.oid}"


def read_overloads(conn: Any) -> list[Overload]:
    """Every callable pg_catalog overload of the connected server."""
    return [Overload(*row) for row in conn.execute(_CATALOG_QUERY).fetchall()]


def refused_overloads(overloads: list[Overload]) -> set[int]:
    """The oids of overloads refused by what they are: a name or an implementation symbol in
    ``NOT_ALLOWED``, an implementation in ``UNCANCELLABLE``, or a SQL body that calls a refused
    overload (to a fixed point)."""
    refused = {o.oid for o in overloads
               if NOT_ALLOWED.match(o.name) or (o.language in ("internal", "c") and NOT_ALLOWED.match(o.symbol))
               or (o.language == "internal" and UNCANCELLABLE.match(o.symbol))}
    # every alias of a refused implementation, whatever its name
    refused_impls = {o.implementation() for o in overloads if o.oid in refused}
    refused |= {o.oid for o in overloads if o.implementation() in refused_impls}
    by_name: dict[str, set[int]] = {}
    for o in overloads:
        by_name.setdefault(o.name, set()).add(o.oid)
    calls = {o.oid: _calls(o, by_name) for o in overloads if o.language == "sql"}
    changed = True
    while changed:
        changed = False
        for oid, called in calls.items():
            if oid not in refused and called & refused:
                refused.add(oid)
                changed = True
    return refused


def _calls(overload: Overload, by_name: dict[str, set[int]]) -> set[int]:
    """The overloads a SQL function may call: from its stored body's node tree; for an old-style
    body (text in prosrc), every overload of every name it calls (parsed, not guessed)."""
    if overload.sqlbody:
        return {int(m) for m in _CALLED.findall(overload.sqlbody)}
    called: set[int] = set()
    try:
        tree = parse_sql(overload.symbol)
    except ParseError:
        return set(by_name.get(overload.name, ()))
    for node in _walk(tree):
        if isinstance(node, ast.FuncCall):
            called |= by_name.get((_names(node.funcname) or [""])[-1], set())
    return called


def classify(overloads: list[Overload]) -> tuple[list[str], list[str]]:
    """(allowed names, revoked overload signatures). A name is allowed when every overload is
    stable or immutable (or the name is in ``REVIEWED``) and not refused; or when its only
    overloads that are not are refused ones beside allowed ones (``age(xid)`` beside
    ``age(timestamp)``): those are revoked from PUBLIC in every template, exactly by signature."""
    refused = refused_overloads(overloads)
    groups: dict[str, list[Overload]] = {}
    for o in overloads:
        groups.setdefault(o.name, []).append(o)
    allowed, revoked = [], []
    for name, group in groups.items():
        safe = [o for o in group if o.oid not in refused and (name in REVIEWED or o.volatility in ("i", "s"))]
        bad = [o for o in group if o not in safe]
        if not safe or any(o.oid not in refused for o in bad):
            continue  # nothing safe, or a volatile overload that is not reviewed: the name is refused
        allowed.append(name)
        revoked += [o.signature for o in bad]
    return sorted(allowed), sorted(revoked)


def generate(admin_dsn: str) -> tuple[list[str], list[str], list[str], str]:
    """(functions, revoked overloads, operators, server version) from a server's catalog, by the
    rules of :func:`classify`."""
    import psycopg

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        overloads = read_overloads(conn)
        operators = sorted(r[0] for r in conn.execute(
            "SELECT DISTINCT oprname FROM pg_operator WHERE oprnamespace = 'pg_catalog'::regnamespace"))
        version = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    functions, revoked = classify(overloads)
    return functions, revoked, operators, version


def render(functions: list[str], revoked: list[str], operators: list[str], version: str) -> str:
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
            f"FUNCTIONS = frozenset({{\n{block(functions)}\n}})\n\n"
            "# Overloads refused under an allowed name: revoked from PUBLIC in every template.\n"
            f"REVOKED_OVERLOADS = (\n{block(revoked)}\n)\n\n"
            f"OPERATORS = frozenset({{\n{block(operators)}\n}})\n")


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
