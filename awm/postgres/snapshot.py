"""What "pristine" means, in SQL: checksums, diffs and the restore of dirty tables.

Every environment database carries two extra schemas next to ``public`` (the agent's data):

* ``awm_snapshot``: a copy of every public table as seeded. Verifiers read it as ``initial``,
  ``diff`` compares against it and the dirty-table fallback restores from it.
* ``awm_meta``: ``sequences`` (each public sequence's snapshot ``last_value``/``is_called``) and
  ``checksums`` (per table: row count and an order-independent 64-bit row-hash sum).

The checksum covers rows *and* sequences, because ROLLBACK restores the first but not the second.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

SNAPSHOT_SCHEMA = "awm_snapshot"
META_SCHEMA = "awm_meta"


@dataclass(frozen=True)
class Sequence:
    name: str
    last_value: int
    is_called: bool


@dataclass
class Checksum:
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)
    sequences: dict[str, tuple[int, bool]] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        payload = json.dumps({"t": self.tables, "s": self.sequences}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def mismatches(self, other: Checksum) -> list[str]:
        """Names of tables and sequences whose state differs from ``other``."""
        names = set(self.tables) | set(other.tables)
        bad = [t for t in sorted(names) if self.tables.get(t) != other.tables.get(t)]
        seqs = set(self.sequences) | set(other.sequences)
        bad += [f"sequence {s}" for s in sorted(seqs) if self.sequences.get(s) != other.sequences.get(s)]
        return bad


def public_tables(conn: psycopg.Connection) -> list[str]:
    return _relations(conn, ("r", "p"))


# The public tables and sequences, as (name, relkind) rows: no parameters, so it can share a
# round trip with other statements (the simple query protocol).
RELATIONS_SQL = ("SELECT c.relname, c.relkind::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                 "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'S') ORDER BY c.relname")


def _relations(conn: psycopg.Connection, kinds: tuple[str, ...]) -> list[str]:
    return [name for name, kind in conn.execute(RELATIONS_SQL).fetchall() if kind in kinds]


def _split_relations(rows: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """(tables, sequences) of :data:`RELATIONS_SQL`'s rows."""
    return [n for n, k in rows if k in ("r", "p")], [n for n, k in rows if k == "S"]


def primary_keys_sql(schema: str = "public") -> str:
    """Each table's primary key columns in key order, as (table, column) rows: no parameters, so
    it can share a round trip with other statements. From ``pg_catalog``, not
    ``information_schema``: its views cost a new backend (an instance's first connection to the
    database of a switch) 4.2 ms p50 against 1.3 ms here, for the same answer."""
    return ("SELECT c.relname, a.attname FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
            f"WHERE i.indisprimary AND n.nspname = {_quote_literal(schema)} ORDER BY c.relname, k.ord")


def primary_keys(conn: psycopg.Connection, schema: str = "public") -> dict[str, list[str]]:
    """Each table's primary key columns, in key order."""
    return _keys(conn.execute(primary_keys_sql(schema)).fetchall())


def _keys(rows: list[tuple[str, str]]) -> dict[str, list[str]]:
    keys: dict[str, list[str]] = {}
    for table, column in rows:
        keys.setdefault(table, []).append(column)
    return keys


def compute_checksum(conn: psycopg.Connection, schema: str = "public") -> Checksum:
    """Row count and row-hash sum of every table, plus every sequence's state: two round trips
    (the relations, then every table's and sequence's state in one)."""
    tables, sequences = _split_relations(conn.execute(RELATIONS_SQL).fetchall())
    if schema != "public":  # a copy of the public tables (the snapshot's): no sequences there
        sequences = []
    statements = []
    if tables:
        statements.append(sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {name}, count(*), coalesce(sum(hashtextextended(t::text, 0)), 0)::text "
                    "FROM {schema}.{table} AS t").format(
                name=sql.Literal(t), schema=sql.Identifier(schema), table=sql.Identifier(t))
            for t in tables))
    if sequences:
        statements.append(sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {name}, last_value, is_called FROM public.{seq}").format(
                name=sql.Literal(s), seq=sql.Identifier(s))
            for s in sequences))
    checksum = Checksum()
    if not statements:
        return checksum
    cur = conn.execute(sql.SQL("; ").join(statements))  # no parameters: one round trip
    if tables:
        for name, count, total in cur.fetchall():
            checksum.tables[name] = (int(count), int(total))
        cur.nextset()
    if sequences:
        for name, last, called in cur.fetchall():
            checksum.sequences[name] = (int(last), bool(called))
    return checksum


def stored_checksum(conn: psycopg.Connection) -> Checksum:
    return read_facts(conn).expected


@dataclass
class Facts:
    """What the reset engine needs to know of an instance database. They are the template's
    (an instance database is its copy), so they are written into the template's comment once
    (:func:`awm.postgres.provision.complete_template`) and handed to the env server with each
    database; an instance reads them itself (:func:`read_facts`) only where they are not known."""

    sequences: list[Sequence]  # the snapshot's state of each sequence, by name
    expected: Checksum  # the snapshot's checksum
    tables: list[str]  # the public tables
    keys: dict[str, list[str]]  # each public table's primary key columns

    def to_json(self) -> dict[str, Any]:
        """A JSON form (row-hash sums as strings: they exceed 64 bits)."""
        return {"sequences": [[s.name, s.last_value, s.is_called] for s in self.sequences],
                "checksums": [[t, c, str(h)] for t, (c, h) in sorted(self.expected.tables.items())],
                "tables": list(self.tables), "keys": {t: list(k) for t, k in self.keys.items()}}

    @classmethod
    def from_json(cls, data: Any) -> Facts:
        """The inverse of :meth:`to_json`; ``ValueError`` for anything else."""
        try:
            sequences = [Sequence(str(n), int(v), bool(c)) for n, v, c in data["sequences"]]
            expected = Checksum({str(t): (int(c), int(h)) for t, c, h in data["checksums"]},
                                {s.name: (s.last_value, s.is_called) for s in sequences})
            tables = [str(t) for t in data["tables"]]
            keys = {str(t): [str(c) for c in cols] for t, cols in data["keys"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed snapshot facts: {type(exc).__name__}: {exc}") from None
        return cls(sequences, expected, tables, keys)


def read_facts(conn: psycopg.Connection) -> Facts:
    """:class:`Facts` in one round trip. On a switch this runs on a backend that has read
    nothing of its database yet: four statements sent at once instead of one at a time."""
    cur = conn.execute(
        f"SELECT name, last_value, is_called FROM {META_SCHEMA}.sequences ORDER BY name; "
        f"SELECT table_name, row_count, row_hash_sum FROM {META_SCHEMA}.checksums; "
        f"{RELATIONS_SQL}; {primary_keys_sql()}")
    sequences = [Sequence(r[0], int(r[1]), bool(r[2])) for r in cur.fetchall()]
    cur.nextset()
    expected = Checksum({t: (int(c), int(h)) for t, c, h in cur.fetchall()},
                        {s.name: (s.last_value, s.is_called) for s in sequences})
    cur.nextset()
    tables, _ = _split_relations(cur.fetchall())
    cur.nextset()
    return Facts(sequences, expected, tables, _keys(cur.fetchall()))


def restore_sequences_sql(sequences: list[Sequence]) -> str:
    """One statement that puts every sequence back: ROLLBACK leaves them advanced."""
    if not sequences:
        return "SELECT 1"
    calls = ", ".join(
        f"setval({_quote_literal('public.' + _quote_ident(s.name))}::regclass, {s.last_value}, "
        f"{'true' if s.is_called else 'false'})"
        for s in sequences
    )
    return f"SELECT {calls}"


def restore_tables(conn: psycopg.Connection, tables: list[str], sequences: list[Sequence]) -> None:
    """Dirty-table fallback: refill ``tables`` from the snapshot copy, in one transaction.

    Foreign-key triggers are skipped while refilling (``session_replication_role = replica``)
    because parents and children are rewritten in arbitrary order; the end state is the
    snapshot, which satisfied every constraint when it was loaded.
    """
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for table in tables:
            ident = sql.Identifier(table)
            conn.execute(sql.SQL("DELETE FROM public.{}").format(ident))
            conn.execute(sql.SQL("INSERT INTO public.{t} SELECT * FROM {s}.{t}").format(
                t=ident, s=sql.Identifier(SNAPSHOT_SCHEMA)))
        conn.execute(restore_sequences_sql(sequences))


def diff(conn: psycopg.Connection, keys: dict[str, list[str]], tables: list[str]) -> dict[str, Any]:
    """Rows inserted, updated and deleted per table since the snapshot.

    Tables with a primary key are matched by key (an update keeps its key); tables without one
    are compared as multisets of rows (a change counts as one delete plus one insert).
    """
    result: dict[str, Any] = {}
    for table in tables:
        t = sql.Identifier(table)
        s = sql.SQL("{}.{}").format(sql.Identifier(SNAPSHOT_SCHEMA), t)
        pk = keys.get(table)
        if pk:
            on = sql.SQL(" AND ").join(
                sql.SQL("a.{c} = b.{c}").format(c=sql.Identifier(c)) for c in pk)
            first = sql.Identifier(pk[0])
            query = sql.SQL(
                "SELECT count(*) FILTER (WHERE b.{f} IS NULL), "
                "count(*) FILTER (WHERE a.{f} IS NULL), "
                "count(*) FILTER (WHERE a.{f} IS NOT NULL AND b.{f} IS NOT NULL AND a::text IS DISTINCT FROM b::text) "
                "FROM public.{t} a FULL JOIN {s} b ON {on}"
            ).format(f=first, t=t, s=s, on=on)
            inserted, deleted, updated = conn.execute(query).fetchone()
        else:
            inserted = conn.execute(sql.SQL(
                "SELECT count(*) FROM (SELECT * FROM public.{t} EXCEPT ALL SELECT * FROM {s}) x"
            ).format(t=t, s=s)).fetchone()[0]
            deleted = conn.execute(sql.SQL(
                "SELECT count(*) FROM (SELECT * FROM {s} EXCEPT ALL SELECT * FROM public.{t}) x"
            ).format(t=t, s=s)).fetchone()[0]
            updated = 0
        if inserted or deleted or updated:
            result[table] = {"inserted": int(inserted), "updated": int(updated), "deleted": int(deleted)}
    return result


def written_tables(conn: psycopg.Connection) -> set[str]:
    """Public tables that the current transaction has written to (inserted, updated or deleted
    rows, rolled-back savepoints included), from PostgreSQL's own per-transaction statistics: a
    table not among them is as in the snapshot, if the episode is one transaction since the reset."""
    return {r[0] for r in conn.execute(
        "SELECT relname FROM pg_stat_xact_user_tables WHERE schemaname = 'public' "
        "AND n_tup_ins + n_tup_upd + n_tup_del > 0")}


def add_change(entry: dict[str, Any], before: dict[str, Any] | None, after: dict[str, Any] | None) -> None:
    """File one row's change under ``inserted`` (no row before), ``deleted`` (none after) or
    ``updated`` (both: kept as a before/after pair)."""
    if before is None:
        entry["inserted"].append(after)
    elif after is None:
        entry["deleted"].append(before)
    else:
        entry["updated"].append({"before": before, "after": after})


MAX_DIFF_ROWS = 10_000  # rows per table in one GET /diff?rows=N answer: bounds its size and time


def diff_rows(conn: psycopg.Connection, keys: dict[str, list[str]], tables: list[str],
              limit: int = 100) -> dict[str, Any]:
    """The rows behind :func:`diff`: per changed table the inserted and deleted rows and the
    updated ones before and after (rows as JSON objects in column order), at most ``limit`` per
    table (``truncated`` then says some are missing).

    A trainer that takes this after every tool call learns what each call did to the database
    (awm/episode/calldiff.py); the counts alone cannot tell two calls' changes apart.
    """
    result: dict[str, Any] = {}
    for table in tables:
        t = sql.Identifier(table)
        s = sql.SQL("{}.{}").format(sql.Identifier(SNAPSHOT_SCHEMA), t)
        pk = keys.get(table) or []
        entry: dict[str, Any] = {"key": pk, "inserted": [], "updated": [], "deleted": [], "truncated": False}
        if pk:
            on = sql.SQL(" AND ").join(sql.SQL("a.{c} = b.{c}").format(c=sql.Identifier(c)) for c in pk)
            first = sql.Identifier(pk[0])
            rows = conn.execute(sql.SQL(
                "SELECT CASE WHEN b.{f} IS NULL THEN NULL ELSE row_to_json(b) END, "
                "CASE WHEN a.{f} IS NULL THEN NULL ELSE row_to_json(a) END "
                "FROM public.{t} a FULL JOIN {s} b ON {on} "
                "WHERE a.{f} IS NULL OR b.{f} IS NULL OR a::text IS DISTINCT FROM b::text LIMIT {n}"
            ).format(f=first, t=t, s=s, on=on, n=sql.Literal(limit + 1))).fetchall()
            entry["truncated"] = len(rows) > limit
            for before, after in rows[:limit]:
                add_change(entry, before, after)
        else:
            for name, first_rel, second_rel in (("inserted", sql.SQL("public.{}").format(t), s),
                                                ("deleted", s, sql.SQL("public.{}").format(t))):
                rows = conn.execute(sql.SQL(
                    "SELECT row_to_json(x) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b}) x LIMIT {n}"
                ).format(a=first_rel, b=second_rel, n=sql.Literal(limit + 1))).fetchall()
                entry["truncated"] = entry["truncated"] or len(rows) > limit
                entry[name] = [r[0] for r in rows[:limit]]
        if entry["inserted"] or entry["updated"] or entry["deleted"]:
            result[table] = entry
    return result


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
