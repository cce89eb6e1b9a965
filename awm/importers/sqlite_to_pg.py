"""SQLite schemas and INSERT statements (as the AWM-1K release ships them) → PostgreSQL.

Two halves:

* **DDL.** Each ``CREATE TABLE`` is split into column definitions (our own splitter, so the
  *declared* type text survives: SQLite's type affinity and the verifiers' SQLite files depend on
  it) whose constraints sqlglot parses. :class:`TableSpec` renders PostgreSQL DDL: an integer
  primary key becomes an identity column (the loader moves its sequence past the seeded ids),
  ``DATETIME`` → ``TIMESTAMP``, ``BOOLEAN`` → ``BOOLEAN``, ``REAL`` → ``DOUBLE PRECISION``,
  ``VARCHAR(n)`` → ``TEXT`` (SQLite never enforced the length), foreign keys as separate
  ``ALTER TABLE`` statements (SQLite allows forward references). It also renders the relaxed
  SQLite DDL that verifier files are built from (same tables, columns and declared types).
* **Seed rows.** The statements are evaluated by SQLite itself, in an in-memory *mirror* of the
  original schema, so that defaults, sub-selects, ``INSERT OR IGNORE`` and SQLite's date
  arithmetic mean exactly what they meant to the dataset's authors, and the final rows are read
  back. sqlglot parses each statement first, to (1) repair ``\\'`` escapes (MySQL-style; SQLite
  rejects them and the reference loaders silently lose those rows), (2) pin ``'now'`` and
  ``CURRENT_TIMESTAMP`` to one reference instant, so that the snapshot is deterministic, and (3)
  split multi-row ``VALUES`` so that one bad row costs only itself. Every statement that fails
  is returned with SQLite's reason; nothing is dropped silently.
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp

IDENTIFIER = r'(?:"(?:[^"]|"")+"|`[^`]+`|\[[^\]]+\]|[A-Za-z_][A-Za-z0-9_$]*)'
_COLUMN_WORDS = {"CONSTRAINT", "PRIMARY", "NOT", "NULL", "UNIQUE", "CHECK", "DEFAULT", "COLLATE",
                 "REFERENCES", "GENERATED", "AS", "AUTOINCREMENT", "ON"}
_TABLE_CONSTRAINT = re.compile(r"^\s*(CONSTRAINT|PRIMARY\s+KEY|UNIQUE|CHECK|FOREIGN\s+KEY)\b", re.IGNORECASE)
_CREATE_TABLE = re.compile(rf"^\s*CREATE\s+(?:TEMP\w*\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<name>{IDENTIFIER})"
                           rf"(?:\s*\.\s*(?P<name2>{IDENTIFIER}))?\s*\(", re.IGNORECASE)


class DdlError(ValueError):
    """A CREATE TABLE statement we cannot translate, with the reason."""


# -- lexical helpers -------------------------------------------------------------------------


def unquote(name: str) -> str:
    name = name.strip()
    if name[:1] == '"' and name[-1:] == '"':
        return name[1:-1].replace('""', '"')
    if name[:1] in "`[" and name[-1:] in "`]":
        return name[1:-1]
    return name


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def fix_backslash_quotes(sql: str) -> tuple[str, int]:
    """Rewrite ``\\'`` inside single-quoted strings as ``''``; returns the SQL and the count."""
    out: list[str] = []
    fixed = 0
    i, n = 0, len(sql)
    in_string = False
    while i < n:
        ch = sql[i]
        if in_string:
            if ch == "\\" and i + 1 < n and sql[i + 1] == "'":
                out.append("''")
                fixed += 1
                i += 2
                continue
            if ch == "'":
                if i + 1 < n and sql[i + 1] == "'":
                    out.append("''")
                    i += 2
                    continue
                in_string = False
        elif ch == "'":
            in_string = True
        elif ch == '"':  # a quoted identifier: copy it whole
            end = sql.find('"', i + 1)
            end = n - 1 if end < 0 else end
            out.append(sql[i:end + 1])
            i = end + 1
            continue
        out.append(ch)
        i += 1
    return "".join(out), fixed


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """Split at ``separator`` outside parentheses, quotes and identifiers."""
    parts, depth, start, i, n = [], 0, 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`[":
            close = {"'": "'", '"': '"', "`": "`", "[": "]"}[ch]
            j = i + 1
            while j < n:
                if text[j] == close:
                    if close in "'\"" and j + 1 < n and text[j + 1] == close:
                        j += 2
                        continue
                    break
                j += 1
            i = j + 1
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def split_statements(sql: str) -> list[str]:
    return [s.strip() for s in split_top_level(sql, ";") if s.strip() and not s.strip().startswith("--")]


def _matching_paren(text: str, open_index: int) -> int:
    depth = 0
    i = open_index
    while i < len(text):
        ch = text[i]
        if ch in "'\"`[":
            close = {"'": "'", '"': '"', "`": "`", "[": "]"}[ch]
            i = text.find(close, i + 1)
            if i < 0:
                break
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise DdlError("unbalanced parentheses")


# -- types -----------------------------------------------------------------------------------


def sqlite_affinity(declared: str) -> str:
    """SQLite's type affinity rules (datatype3.html §3.1), in their order."""
    t = declared.upper()
    if "INT" in t:
        return "INTEGER"
    if any(w in t for w in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if not t or "BLOB" in t:
        return "BLOB"
    if any(w in t for w in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


def pg_type_for(declared: str) -> str:
    """The PostgreSQL type for a declared SQLite type: the intent, not the affinity."""
    t = declared.upper()
    if "BOOL" in t:
        return "BOOLEAN"
    if "INT" in t:
        return "BIGINT"
    if any(w in t for w in ("CHAR", "CLOB", "TEXT", "STRING", "UUID", "ENUM")):
        return "TEXT"
    if any(w in t for w in ("BLOB", "BINARY", "BYTEA")):
        return "BYTEA"
    if any(w in t for w in ("REAL", "FLOA", "DOUB")):
        return "DOUBLE PRECISION"
    if "DATETIME" in t or "TIMESTAMP" in t:
        return "TIMESTAMP"
    if t.startswith("DATE"):
        return "DATE"
    if t.startswith("TIME"):
        return "TIME"
    if any(w in t for w in ("DEC", "NUMERIC", "MONEY")):
        return "NUMERIC"
    return "TEXT"  # JSON, no type, anything else: SQLite kept what it was given


# SQLAlchemy type affinity (``type(col.type)._type_affinity.__name__``) → PostgreSQL type. The
# ORM's view wins over the DDL: psycopg binds typed parameters, so an ``Integer`` column over a
# ``BOOLEAN`` one (common in the dataset) would fail every write.
ORM_TYPES = {"Integer": "BIGINT", "Boolean": "BOOLEAN", "Float": "DOUBLE PRECISION", "Numeric": "NUMERIC",
             "String": "TEXT", "DateTime": "TIMESTAMP", "Date": "DATE", "Time": "TIME", "JSON": "JSONB",
             "LargeBinary": "BYTEA", "Interval": "INTERVAL", "Uuid": "TEXT"}


# -- tables ----------------------------------------------------------------------------------


@dataclass
class ForeignKey:
    columns: list[str]
    ref_table: str
    ref_columns: list[str]
    options: list[str] = field(default_factory=list)  # "ON DELETE CASCADE", ...


@dataclass
class ColumnSpec:
    name: str
    declared: str
    pg_type: str
    not_null: bool = False
    primary_key: bool = False
    unique: bool = False
    default: exp.Expression | None = None
    checks: list[exp.Expression] = field(default_factory=list)


@dataclass
class TableSpec:
    name: str
    columns: list[ColumnSpec]
    primary_key: list[str] = field(default_factory=list)
    uniques: list[list[str]] = field(default_factory=list)
    checks: list[exp.Expression] = field(default_factory=list)
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    source: str = ""
    notes: list[str] = field(default_factory=list)

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name.lower() == name.lower()), None)

    @property
    def identity_column(self) -> str | None:
        """A single integer primary key: SQLite assigns it when omitted, so must we."""
        if len(self.primary_key) == 1:
            col = self.column(self.primary_key[0])
            if col is not None and col.pg_type == "BIGINT":
                return col.name
        return None

    def pg_create(self, with_checks: bool = True) -> str:
        identity = self.identity_column
        lines = []
        for col in self.columns:
            parts = [quote(col.name), col.pg_type]
            if col.name == identity:
                parts.append("GENERATED BY DEFAULT AS IDENTITY")
            if col.not_null and col.name != identity:
                parts.append("NOT NULL")
            if col.unique:
                parts.append("UNIQUE")
            if col.default is not None and col.name != identity:
                default = pg_default(col.default, col.pg_type)
                if default is not None:
                    parts.append(f"DEFAULT {default}")
            if with_checks:
                parts += [f"CHECK ({pg_expression(c)})" for c in col.checks]
            lines.append(" ".join(parts))
        if self.primary_key:
            lines.append(f"PRIMARY KEY ({', '.join(map(quote, self.primary_key))})")
        for cols in self.uniques:
            lines.append(f"UNIQUE ({', '.join(map(quote, cols))})")
        if with_checks:
            lines += [f"CHECK ({pg_expression(c)})" for c in self.checks]
        return f"CREATE TABLE {quote(self.name)} (\n  " + ",\n  ".join(lines) + "\n)"

    @property
    def has_checks(self) -> bool:
        return bool(self.checks) or any(c.checks for c in self.columns)

    def pg_foreign_keys(self) -> list[str]:
        out = []
        for fk in self.foreign_keys:
            options = [o for o in fk.options if o.upper().startswith(("ON DELETE", "ON UPDATE"))]
            refs = f" ({', '.join(map(quote, fk.ref_columns))})" if fk.ref_columns else ""
            out.append(f"ALTER TABLE {quote(self.name)} ADD FOREIGN KEY ({', '.join(map(quote, fk.columns))}) "
                       f"REFERENCES {quote(fk.ref_table)}{refs}" + "".join(" " + o for o in options))
        return out

    def sqlite_create(self) -> str:
        """Relaxed SQLite DDL for verifier files: names, order and declared types (so affinities
        match the dataset's), and the rowid alias; no constraints (the data already obeyed the
        Postgres ones, and a verifier reads, it never writes)."""
        lines = []
        single_pk = self.primary_key[0] if len(self.primary_key) == 1 else None
        for col in self.columns:
            decl = f"{quote(col.name)} {col.declared}".rstrip()
            if col.name == single_pk and col.declared.upper() == "INTEGER":
                decl += " PRIMARY KEY"
            lines.append(decl)
        return f"CREATE TABLE {quote(self.name)} ({', '.join(lines)})"


def parse_table(ddl: str) -> TableSpec:
    """Parse one SQLite ``CREATE TABLE`` statement."""
    text = ddl.strip().rstrip(";").strip()
    match = _CREATE_TABLE.match(text)
    if not match:
        raise DdlError("not a CREATE TABLE statement")
    name = unquote(match.group("name2") or match.group("name"))
    open_index = match.end() - 1
    close_index = _matching_paren(text, open_index)
    table = TableSpec(name, [], source=ddl)
    for item in split_top_level(text[open_index + 1:close_index]):
        if _TABLE_CONSTRAINT.match(item):
            _table_constraint(table, item)
        else:
            table.columns.append(_column(table, item))
    if not table.columns:
        raise DdlError(f"table {name} has no columns")
    pk_columns = [c.name for c in table.columns if c.primary_key]
    if pk_columns and not table.primary_key:
        table.primary_key = pk_columns
    for col in table.columns:
        col.primary_key = False
        if col.name in table.primary_key:
            col.not_null = True
    return table


def _column(table: TableSpec, item: str) -> ColumnSpec:
    match = re.match(rf"\s*({IDENTIFIER})", item)
    if not match:
        raise DdlError(f"cannot read the column definition {item.strip()!r}")
    name = unquote(match.group(1))
    rest = item[match.end():]
    declared_words = []
    while True:
        word = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", rest)
        if not word or word.group(1).upper() in _COLUMN_WORDS:
            break
        declared_words.append(word.group(1))
        rest = rest[word.end():]
    args = re.match(r"\s*(\([^)]*\))", rest) if declared_words else None
    if args:
        declared_words[-1] += args.group(1).replace(" ", "")
        rest = rest[args.end():]
    declared = " ".join(declared_words)
    col = ColumnSpec(name, declared, pg_type_for(declared))
    try:
        parsed = sqlglot.parse_one(f"CREATE TABLE q ({quote(name)} TEXT {rest})", read="sqlite")
        coldef = parsed.this.expressions[0]
    except Exception as exc:  # noqa: BLE001 - sqlglot raises several types
        raise DdlError(f"cannot parse the constraints of column {name}: {exc}") from exc
    for constraint in coldef.args.get("constraints") or []:
        kind = constraint.args.get("kind")
        if isinstance(kind, exp.PrimaryKeyColumnConstraint):
            col.primary_key = True
        elif isinstance(kind, exp.NotNullColumnConstraint):
            col.not_null = not kind.args.get("allow_null")
        elif isinstance(kind, exp.UniqueColumnConstraint):
            col.unique = True
        elif isinstance(kind, exp.DefaultColumnConstraint):
            col.default = kind.this
        elif isinstance(kind, exp.CheckColumnConstraint):
            col.checks.append(kind.this)
        elif isinstance(kind, exp.Reference):
            table.foreign_keys.append(_reference([name], kind))
        elif isinstance(kind, exp.CollateColumnConstraint):
            table.notes.append(f"column {name}: COLLATE {kind.this.sql()} dropped (comparisons are case-sensitive)")
    return col


def _reference(columns: list[str], ref: exp.Reference) -> ForeignKey:
    target = ref.this
    if isinstance(target, exp.Schema):
        ref_table = target.this.name
        ref_columns = [e.name for e in target.expressions]
    else:
        ref_table, ref_columns = target.name, []
    return ForeignKey(columns, ref_table, ref_columns, [str(o) for o in ref.args.get("options") or []])


def _table_constraint(table: TableSpec, item: str) -> None:
    try:
        parsed = sqlglot.parse_one(f"CREATE TABLE q (awm_dummy TEXT, {item})", read="sqlite")
        node = parsed.this.expressions[-1]
    except Exception as exc:  # noqa: BLE001
        raise DdlError(f"cannot parse the table constraint {item.strip()!r}: {exc}") from exc
    nodes = node.expressions if isinstance(node, exp.Constraint) else [node]
    for node in nodes:
        if isinstance(node, exp.PrimaryKey):
            table.primary_key = [_name(e) for e in node.expressions]
        elif isinstance(node, exp.ForeignKey):
            table.foreign_keys.append(_reference([_name(e) for e in node.expressions], node.args["reference"]))
        elif isinstance(node, exp.UniqueColumnConstraint):
            schema = node.this
            table.uniques.append([_name(e) for e in (schema.expressions if schema is not None else [])])
        elif isinstance(node, exp.CheckColumnConstraint):
            table.checks.append(node.this)
        else:
            table.notes.append(f"table constraint {item.strip()!r} ignored")


def _name(node: exp.Expression) -> str:
    return node.this.name if isinstance(node, exp.Ordered) else node.name


def apply_orm_types(table: TableSpec, orm_columns: dict[str, str]) -> list[str]:
    """Let the app's ORM types decide the Postgres column types; returns what changed."""
    changed = []
    for col in table.columns:
        affinity = orm_columns.get(col.name)
        pg_type = ORM_TYPES.get(affinity or "")
        if pg_type and pg_type != col.pg_type:
            changed.append(f"{table.name}.{col.name}: {col.pg_type} -> {pg_type} (the app maps it as {affinity})")
            col.pg_type = pg_type
    return changed


# -- expressions -----------------------------------------------------------------------------


def _is_now(node: exp.Expression) -> bool:
    if isinstance(node, (exp.CurrentTimestamp, exp.CurrentDate, exp.CurrentTime)):
        return True
    if isinstance(node, exp.Paren):
        return _is_now(node.this)
    return isinstance(node, exp.Func) and any(
        isinstance(a, exp.Literal) and a.is_string and a.this.lower() == "now" for a in node.iter_expressions())


def pg_default(node: exp.Expression, pg_type: str) -> str | None:
    """A column default in PostgreSQL terms (SQLite's CURRENT_TIMESTAMP is UTC text)."""
    if _is_now(node):
        if pg_type == "TIMESTAMP":
            return "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')"
        if pg_type == "DATE":
            return "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')::date"
        if pg_type == "TIME":
            return "(CURRENT_TIMESTAMP AT TIME ZONE 'UTC')::time"
        if pg_type == "TEXT":
            return "to_char(CURRENT_TIMESTAMP AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')"
        return None
    inner = node.this if isinstance(node, exp.Paren) else node
    if pg_type == "BOOLEAN" and isinstance(inner, exp.Literal):
        text = str(inner.this).strip().lower()
        if text in ("1", "true", "t", "yes"):
            return "TRUE"
        if text in ("0", "false", "f", "no"):
            return "FALSE"
    if isinstance(inner, exp.Null):
        return "NULL"
    return pg_expression(node)


def pg_expression(node: exp.Expression) -> str:
    return node.sql(dialect="postgres", identify=True)


def translate_index(sql: str) -> str:
    """A SQLite ``CREATE [UNIQUE] INDEX`` in PostgreSQL terms (COLLATE NOCASE dropped)."""
    parsed = sqlglot.parse_one(sql.strip().rstrip(";"), read="sqlite")
    if not isinstance(parsed, exp.Create) or str(parsed.args.get("kind", "")).upper() != "INDEX":
        raise DdlError("not a CREATE INDEX statement")
    for collate in list(parsed.find_all(exp.Collate)):
        collate.replace(collate.this)
    return parsed.sql(dialect="postgres", identify=True)


# -- seed rows -------------------------------------------------------------------------------


@dataclass
class Rejected:
    """A seed statement (or one row of it) that did not load, and why."""

    table: str
    statement: int  # index among the table's insert statements
    reason: str
    sql: str


@dataclass
class Evaluated:
    """One table's statements after evaluation."""

    rows: list[dict[str, Any]]
    rejected: list[Rejected]
    escapes_fixed: int = 0


def pin_now(node: exp.Expression, now: dt.datetime) -> exp.Expression:
    """Replace ``'now'`` (as a function argument) and ``CURRENT_*`` by the reference instant."""
    stamp = now.strftime("%Y-%m-%d %H:%M:%S")

    def transform(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.CurrentTimestamp):
            return exp.Literal.string(stamp)
        if isinstance(n, exp.CurrentDate):
            return exp.Literal.string(stamp[:10])
        if isinstance(n, exp.CurrentTime):
            return exp.Literal.string(stamp[11:])
        if (isinstance(n, exp.Literal) and n.is_string and str(n.this).lower() == "now"
                and isinstance(n.parent, exp.Func)):
            return exp.Literal.string(stamp)
        return n

    return node.transform(transform)


def pin_now_text(sql: str, now: dt.datetime) -> str:
    """The same on raw text, for DDL defaults and statements sqlglot cannot parse."""
    stamp = now.strftime("%Y-%m-%d %H:%M:%S")
    sql = re.sub(r"\bCURRENT_TIMESTAMP\b", f"'{stamp}'", sql, flags=re.IGNORECASE)
    sql = re.sub(r"\bCURRENT_DATE\b", f"'{stamp[:10]}'", sql, flags=re.IGNORECASE)
    sql = re.sub(r"\bCURRENT_TIME\b", f"'{stamp[11:]}'", sql, flags=re.IGNORECASE)
    return re.sub(r"'now'", f"'{stamp}'", sql, flags=re.IGNORECASE)


class SqliteMirror:
    """The original schema in an in-memory SQLite database, where the inserts are evaluated."""

    def __init__(self, now: dt.datetime) -> None:
        self.now = now
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.execute("PRAGMA foreign_keys = ON")

    def create(self, table: TableSpec) -> None:
        """Create the table as the dataset declared it (its defaults pinned to the reference time)."""
        try:
            self.db.execute(pin_now_text(table.source.strip().rstrip(";"), self.now))
        except sqlite3.Error as exc:
            raise DdlError(f"SQLite rejects the table's own DDL: {exc}") from exc

    def run(self, table: str, statements: list[str]) -> Evaluated:
        """Execute ``statements`` (one table's inserts, in order); returns the rejects."""
        result = Evaluated([], [])
        for index, raw in enumerate(statements):
            failures: list[tuple[str, str]] = []
            for rows, fixed in _candidates(raw, self.now):
                failures = []
                for sql in rows:
                    try:
                        self.db.execute(sql)
                    except sqlite3.Error as exc:
                        failures.append((sql, f"SQLite: {exc}"))
                if len(failures) < len(rows):  # this reading worked, at least for some rows
                    result.escapes_fixed += fixed
                    break
            result.rejected += [Rejected(table, index, reason, sql[:500]) for sql, reason in failures]
        return result

    def rows(self, table: TableSpec) -> list[dict[str, Any]]:
        cur = self.db.execute(f"SELECT * FROM {quote(table.name)}")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


def _candidates(raw: str, now: dt.datetime) -> list[tuple[list[str], int]]:
    """Ways to read one INSERT statement, most likely first: with ``\\'`` repaired, then as
    written (a string may legitimately end in a backslash)."""
    out = []
    fixed_sql, fixed = fix_backslash_quotes(raw)
    variants = [(fixed_sql, fixed)] + ([(raw, 0)] if fixed else [])
    for text, count in variants:
        try:
            parsed = sqlglot.parse_one(text.strip().rstrip(";"), read="sqlite")
        except Exception:  # noqa: BLE001 - unparseable: SQLite itself has the last word
            out.append(([pin_now_text(text.strip().rstrip(";"), now)], count))
            continue
        out.append((split_insert(pin_now(parsed, now)), count))
    return out


def split_insert(statement: exp.Expression) -> list[str]:
    """One statement per VALUES row, so that a bad row is rejected alone."""
    values = statement.expression if isinstance(statement, exp.Insert) else None
    if not isinstance(values, exp.Values) or len(values.expressions) <= 1:
        return [statement.sql(dialect="sqlite")]
    out = []
    for row in values.expressions:
        single = statement.copy()
        single.set("expression", exp.Values(expressions=[row.copy()]))
        out.append(single.sql(dialect="sqlite"))
    return out


def insert_target(sql: str) -> str | None:
    """The table an INSERT statement writes to (None if it is not an INSERT)."""
    match = re.match(rf"\s*(?:INSERT|REPLACE)(?:\s+OR\s+\w+)?\s+INTO\s+({IDENTIFIER})", sql, re.IGNORECASE)
    return unquote(match.group(1)) if match else None


# -- values ----------------------------------------------------------------------------------


class ValueRejected(ValueError):
    pass


def to_pg_value(value: Any, pg_type: str) -> Any:
    """A SQLite value as a JSON value that PostgreSQL accepts for ``pg_type`` (or raise)."""
    if value is None:
        return None
    if pg_type == "BOOLEAN":
        if isinstance(value, (int, float)) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("0", "1", "true", "false", "t", "f", "yes", "no"):
            return value.strip().lower() in ("1", "true", "t", "yes")
        raise ValueRejected(f"{value!r} is not a boolean")
    if pg_type == "BIGINT" and isinstance(value, float) and value.is_integer():
        return int(value)
    if pg_type == "TEXT" and isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if pg_type in ("TIMESTAMP", "DATE", "TIME") and not isinstance(value, str):
        raise ValueRejected(f"{value!r} is not a {pg_type.lower()}")
    return value
