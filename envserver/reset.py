"""The reset engine: the instance's one database connection and the episode transaction on it.

Strategy, chosen from measurements (docs/benchmarks.md, research on reset strategies): every
episode runs inside **one transaction**; each tool call runs inside a SAVEPOINT (so a failing
tool's partial writes roll back alone); reset is ``ROLLBACK`` plus ``setval`` of every sequence
(ROLLBACK does not rewind sequences) plus ``BEGIN``, sent as one round trip (~1 ms).

If anything ever escapes the transaction (tool code reaching past the ``db`` handle to COMMIT,
or rows changed from outside), the episode is marked *escaped* and the next reset takes the
**dirty-table fallback**: compare per-table checksums with the snapshot's and refill only the
tables that differ from the ``awm_snapshot`` copy. ``reset(verify=True)`` always checksums and
falls back on any mismatch, which is how pristine state is proven at runtime and in tests.

Not thread-safe on purpose: the env server runs every call on one executor thread.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import psycopg
from psycopg import pq, sql
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from awm.postgres import snapshot as snap
from awm.postgres.provision import READER_ROLE
from envserver.dbapi import Db, to_json_value, check_statement

T = TypeVar("T")


class DatabaseLost(RuntimeError):
    """The connection dropped mid-episode: the episode is void, the next reset reconnects."""


class NotPristine(RuntimeError):
    pass


@dataclass
class ResetResult:
    ms: float
    strategy: str  # "rollback" or "restore"
    pristine: bool | None  # None when not checked
    repaired: list[str]


class EpisodeDatabase:
    def __init__(self, dsn: str, statement_timeout_ms: int = 10_000) -> None:
        self._dsn = dsn
        self._timeout_ms = statement_timeout_ms
        self.conn: psycopg.Connection | None = None
        self.escaped = False
        self.lost = False
        self._sequences: list[snap.Sequence] = []
        self._reset_sql = ""
        self._expected: snap.Checksum | None = None
        self._tables: list[str] = []
        self._keys: dict[str, list[str]] = {}

    # -- connection ------------------------------------------------------------------------

    def connect(self, wait_s: float = 30.0) -> None:
        """(Re)connect, retrying while the server comes back; then load the snapshot facts."""
        self.close()
        for attempt in Retrying(stop=stop_after_delay(wait_s), reraise=True,
                                wait=wait_exponential(multiplier=0.05, max=1.0),
                                retry=retry_if_exception_type(psycopg.OperationalError)):
            with attempt:
                self.conn = psycopg.connect(
                    self._dsn, autocommit=True, application_name="awm-envserver",
                    options=f"-c statement_timeout={self._timeout_ms} -c search_path=public",
                )
        conn = self.conn
        assert conn is not None
        self._sequences = snap.stored_sequences(conn)
        self._reset_sql = f"ROLLBACK; RESET ALL; RESET ROLE; {snap.restore_sequences_sql(self._sequences)}; BEGIN"
        self._expected = snap.stored_checksum(conn)
        self._tables = snap.public_tables(conn)
        self._keys = snap.primary_keys(conn)
        self.lost = False

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None

    @property
    def connected(self) -> bool:
        return self.conn is not None and not self.conn.closed and not self.lost

    def _guard(self, fn: Callable[[psycopg.Connection], T]) -> T:
        """Run ``fn`` on the connection; a dropped connection becomes :class:`DatabaseLost`."""
        if not self.connected:
            raise DatabaseLost("database connection is down; the next reset reconnects")
        assert self.conn is not None
        try:
            return fn(self.conn)
        except psycopg.OperationalError as exc:
            if self.conn.closed or self.conn.broken:
                self.lost = True
                raise DatabaseLost(f"database connection lost: {exc}".strip()) from exc
            raise

    # -- reset -----------------------------------------------------------------------------

    def reset(self, verify: bool = False) -> ResetResult:
        start = time.perf_counter()
        strategy, repaired, pristine = "rollback", [], None
        if not self.connected:
            self.connect()
            verify = True  # after a crash or restart, prove the state instead of assuming it
        try:
            self._guard(lambda c: c.execute(self._reset_sql))
        except DatabaseLost:
            # The server went away between episodes (a restart, a failover): reconnect once.
            self.connect()
            verify = True
            self._guard(lambda c: c.execute(self._reset_sql))
        if self.escaped or verify:
            bad = self.mismatches()
            if bad:
                strategy, repaired = "restore", self._restore(bad)
                bad = self.mismatches()
                if bad:
                    raise NotPristine(f"state differs from the snapshot after restore: {bad}")
            pristine = True
            self.escaped = False
        return ResetResult((time.perf_counter() - start) * 1000, strategy, pristine, repaired)

    def _restore(self, bad: list[str]) -> list[str]:
        tables = [t for t in bad if not t.startswith("sequence ")]
        assert self.conn is not None
        self.conn.execute("ROLLBACK")
        snap.restore_tables(self.conn, tables, self._sequences)
        self.conn.execute("BEGIN")
        return bad

    def mismatches(self) -> list[str]:
        assert self._expected is not None
        current = self._guard(snap.compute_checksum)
        return current.mismatches(self._expected)

    # -- episode work ----------------------------------------------------------------------

    def tool_call(self, fn: Callable[[Db], T]) -> T:
        """Run one tool's code in a savepoint: an exception rolls back its writes alone."""

        def run(conn: psycopg.Connection) -> T:
            conn.execute("SAVEPOINT awm_tool")
            try:
                result = fn(Db(conn))
            except BaseException:
                if not conn.broken:
                    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
                        self.escaped = True
                        conn.execute("BEGIN")
                    else:
                        conn.execute("ROLLBACK TO SAVEPOINT awm_tool")
                raise
            if conn.info.transaction_status == pq.TransactionStatus.IDLE:
                # The tool ended the episode transaction behind the handle's back.
                self.escaped = True
                conn.execute("BEGIN")
            else:
                conn.execute("RELEASE SAVEPOINT awm_tool")
            return result

        return self._guard(run)

    @contextmanager
    def _read_only(self, schema: str) -> Iterator[psycopg.Connection]:
        assert self.conn is not None
        conn = self.conn
        conn.execute("SAVEPOINT awm_read")
        try:
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(READER_ROLE)))
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
            yield conn
        finally:
            if not conn.broken:
                conn.execute("ROLLBACK TO SAVEPOINT awm_read")
                conn.execute("RELEASE SAVEPOINT awm_read")

    def read_query(self, initial: bool, query: str, params: list[Any]) -> list[dict[str, Any]]:
        """A verifier's query: read-only role, inside a savepoint that is always rolled back.
        ``initial`` reads the snapshot copy instead of the live tables."""
        check_statement(query)
        schema = snap.SNAPSHOT_SCHEMA if initial else "public"

        def run(conn: psycopg.Connection) -> list[dict[str, Any]]:
            with self._read_only(schema):
                return Db(conn).query(query, *params)

        return self._guard(run)

    def read_tables(self, initial: bool) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
        """Every row of every table, read-only (the snapshot copy if ``initial``): the input of
        the SQLite files that AWM-style verifiers read (``envserver/sqlite_export.py``)."""
        from envserver.sqlite_export import read_tables

        schema = snap.SNAPSHOT_SCHEMA if initial else "public"

        def run(conn: psycopg.Connection) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
            with self._read_only(schema):
                return read_tables(conn, schema, self._tables)

        return self._guard(run)

    def diff(self) -> dict[str, Any]:
        return self._guard(lambda c: snap.diff(c, self._keys, self._tables))

    def checksum(self) -> dict[str, Any]:
        current = self._guard(snap.compute_checksum)
        assert self._expected is not None
        bad = current.mismatches(self._expected)
        return {"pristine": not bad, "mismatches": bad, "digest": current.digest,
                "snapshot_digest": self._expected.digest}


__all__ = ["EpisodeDatabase", "DatabaseLost", "NotPristine", "ResetResult", "to_json_value"]
