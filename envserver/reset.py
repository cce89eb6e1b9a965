"""The reset engine: the instance's one database connection and the episode transaction on it.

Strategy, chosen from measurements (docs/benchmarks.md, research on reset strategies): every
episode runs inside **one transaction**; each tool call runs inside a SAVEPOINT (so a failing
tool's partial writes roll back alone); reset is ``ROLLBACK`` plus ``setval`` of every sequence
(ROLLBACK does not rewind sequences) plus ``BEGIN``, sent as one round trip (~1 ms).

Untrusted code never holds this connection: it runs in a confined worker (:mod:`awm.sandbox`)
and sends statements, which :meth:`EpisodeDatabase.run_code` executes here, one at a time, after
the statement guard, with the transaction checked after each. Each reset also proves, in the same
round trip as its ROLLBACK, that the transaction being rolled back is the one the episode began
with (``transaction_timestamp()`` recorded at BEGIN), and releases session-level state a statement
could leave behind (advisory locks, LISTEN). The instance role may hold only this one connection.

On any doubt (a transaction that is not the episode's, a statement that ended it), the episode
is marked *escaped* and the reset takes the **dirty-table fallback**: compare per-table checksums
with the snapshot's and refill only the tables that differ from the ``awm_snapshot`` copy. The
reset response and the metrics say so. ``reset(verify=True)`` always checksums and falls back on
any mismatch, which is how pristine state is proven at runtime and in tests.

Not thread-safe on purpose: the env server runs every call on one executor thread.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import psycopg
from psycopg import pq, sql
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from awm.postgres import hostaddr, snapshot as snap
from awm.postgres.provision import READER_ROLE
from awm.sandbox.pool import WorkerPool
from awm.envserver.dbapi import ResultTooLarge, SqlForbidden, execute_untrusted, to_json_value

T = TypeVar("T")
_APP_SAVEPOINT_NAME = re.compile(r"awm_app_[0-9]{1,18}")


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
    escaped: str | None = None  # why the fast path was not trusted, when it was not


class EpisodeDatabase:
    def __init__(self, dsn: str, statement_timeout_ms: int = 10_000, facts: snap.Facts | None = None,
                 verified: bool = False) -> None:
        """``facts``: the snapshot facts of the database's template, where its source knows them
        (else each connection reads them from the database). ``verified``: the provisioner that
        made the database checksummed it as the snapshot, and no role but the admin's could reach
        it since; the first reset asked to verify takes that checksum as its own (the expected
        value it would compare against comes from the same provisioner)."""
        self._dsn = dsn
        self._facts = facts
        self._verified = verified
        self._timeout_ms = statement_timeout_ms
        self.conn: psycopg.Connection | None = None
        self.escaped = False
        self.lost = False
        self._sequences: list[snap.Sequence] = []
        self._reset_sql = ""
        self._expected: snap.Checksum | None = None
        self._tables: list[str] = []
        self._keys: dict[str, list[str]] = {}
        self._episode_tx: str | None = None  # transaction_timestamp() of the episode's BEGIN
        self.escape_reason: str | None = None
        self._deadline = _Deadline()

    # -- connection ------------------------------------------------------------------------

    def connect(self, wait_s: float = 30.0, phase: Callable[[str], None] = lambda _: None) -> None:
        """(Re)connect, retrying while the server comes back; then load the snapshot facts.
        ``phase`` is called as each part ends ("open", "snapshot_facts": a switch's account)."""
        self.close()
        for attempt in Retrying(stop=stop_after_delay(wait_s), reraise=True,
                                wait=wait_exponential(multiplier=0.05, max=1.0),
                                retry=retry_if_exception_type(psycopg.OperationalError)):
            with attempt:
                self.conn = self._open()
        phase("open")
        conn = self.conn
        assert conn is not None
        facts = self._facts or snap.read_facts(conn)
        self._sequences = facts.sequences
        # One round trip: prove which transaction ends, end it, clear session state, rewind the
        # sequences, begin the next episode and note its identity. DISCARD SEQUENCES after the
        # rewind: currval/lastval are session state that ROLLBACK keeps (the last episode's ids).
        self._reset_sql = ("SELECT transaction_timestamp()::text; ROLLBACK; RESET ALL; RESET ROLE; UNLISTEN *; "
                           "SELECT pg_advisory_unlock_all(); "
                           f"{snap.restore_sequences_sql(self._sequences)}; DISCARD SEQUENCES; BEGIN; "
                           "SELECT transaction_timestamp()::text")
        self._expected = facts.expected
        self._tables = facts.tables
        self._keys = facts.keys
        self.lost = False
        self._episode_tx = None
        phase("snapshot_facts")

    def _open(self) -> psycopg.Connection:
        """One connection attempt, to the server's address looked up once per process
        (:mod:`awm.postgres.hostaddr`: no DNS walk on a switch's claim path)."""
        try:
            dsn = hostaddr.pinned(self._dsn)
        except OSError:  # no answer from the resolver: let libpq try, and say why it failed
            dsn = self._dsn
        try:
            return psycopg.connect(
                dsn, autocommit=True, application_name="awm-envserver",
                # client_connection_check_interval: a statement whose client is gone (this
                # process killed mid-call) stops within a second instead of holding the
                # role's one connection slot until it ends.
                options=(f"-c statement_timeout={self._timeout_ms} -c search_path=public "
                         "-c client_connection_check_interval=1000"),
            )
        except psycopg.OperationalError as exc:
            if not exc.sqlstate:  # not the server's refusal (a SQLSTATE): the address did not answer
                hostaddr.forget(self._dsn)  # the server may have moved: look it up again next time
            raise

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None

    @property
    def vouched(self) -> bool:
        """The next reset may take its maker's checksum as its own (see ``verified``)."""
        return self._verified

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
        # The maker's checksum stands for this first reset only, and only on the connection that
        # has run nothing since it opened (no episode: the database is as its maker left it).
        vouched, self._verified = self._verified and self.connected and self._episode_tx is None, False
        if not self.connected:
            self.connect()
            verify = True  # after a crash or restart, prove the state instead of assuming it
        try:
            ended, began = self._guard(self._run_reset)
        except DatabaseLost:
            # The server went away between episodes (a restart, a failover): reconnect once.
            self.connect()
            verify, vouched = True, False
            ended, began = self._guard(self._run_reset)
        if self._episode_tx is not None and ended != self._episode_tx and not self.escaped:
            self._escape("the transaction rolled back was not the episode's own")
        self._episode_tx = began
        escaped = self.escape_reason if self.escaped else None
        if vouched and verify and not self.escaped:
            pristine = True
        elif self.escaped or verify:
            bad = self.mismatches()
            if bad:
                strategy, repaired = "restore", self._restore(bad)
                bad = self.mismatches()
                if bad:
                    raise NotPristine(f"state differs from the snapshot after restore: {bad}")
            pristine = True
            self.escaped = False
            self.escape_reason = None
        return ResetResult((time.perf_counter() - start) * 1000, strategy, pristine, repaired, escaped)

    def _run_reset(self, conn: psycopg.Connection) -> tuple[str | None, str | None]:
        if conn.info.transaction_status == pq.TransactionStatus.INERROR:
            self._escape("the episode transaction was left in an error state")
            conn.execute("ROLLBACK")
        cur = conn.execute(self._reset_sql)
        ended = cur.fetchone()
        began = None
        while cur.nextset():
            if cur.description is not None:
                began = cur.fetchone()
        return (ended[0] if ended else None), (began[0] if began else None)

    def _escape(self, reason: str) -> None:
        self.escaped = True
        self.escape_reason = self.escape_reason or reason

    def _restore(self, bad: list[str]) -> list[str]:
        tables = [t for t in bad if not t.startswith("sequence ")]
        assert self.conn is not None
        self.conn.execute("ROLLBACK")
        snap.restore_tables(self.conn, tables, self._sequences)
        self.conn.execute("DISCARD SEQUENCES")
        self.conn.execute("BEGIN")
        row = self.conn.execute("SELECT transaction_timestamp()::text").fetchone()
        self._episode_tx = row[0] if row else None
        return bad

    def mismatches(self) -> list[str]:
        assert self._expected is not None
        current = self._guard(snap.compute_checksum)
        return current.mismatches(self._expected)

    # -- episode work ----------------------------------------------------------------------

    def run_code(self, pool: WorkerPool, message: dict[str, Any], timeout_s: float,
                 writes: bool) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run untrusted code in a worker; answer its statements on this connection.

        ``writes``: a tool call, inside ``SAVEPOINT awm_tool`` (rolled back if the call fails);
        otherwise a verifier, whose queries run read-only (:meth:`read_query`). Returns the
        worker's final reply and what happened on the database side (``timed_out``). A worker
        failure (:class:`awm.sandbox.pool.WorkerFailure`) propagates after the rollback."""
        state: dict[str, Any] = {"timed_out": False, "failed_statement": False}
        deadline = self._deadline

        def handle(request: dict[str, Any]) -> dict[str, Any]:
            op = request.get("op")
            sql_text, params = request.get("sql"), request.get("params")
            if not isinstance(sql_text, str):
                return {"error": {"kind": "forbidden", "message": "the statement must be a string"}}
            try:
                if writes and op == "sql":
                    savepoint = request.get("savepoint")
                    with deadline.statement():
                        if savepoint is not None:  # an app's transaction begins with this statement
                            self._app_savepoint(savepoint)
                        return execute_untrusted(self.conn, sql_text, params, str(request.get("fetch", "dicts")))
                if not writes and op == "query":
                    rows = self.read_query(request.get("db") == "initial", sql_text,
                                           params if isinstance(params, list) else [])
                    return {"rows": rows}
                return {"error": {"kind": "forbidden", "message": f"{op!r} is not allowed here"}}
            except (SqlForbidden, ResultTooLarge) as exc:
                kind = "forbidden" if isinstance(exc, SqlForbidden) else "too_large"
                return {"error": {"kind": kind, "message": str(exc)}}
            except psycopg.errors.QueryCanceled as exc:
                state["timed_out"] = True
                return {"error": {"kind": "timeout", "message": _first_line(exc), "sqlstate": exc.sqlstate}}
            except psycopg.OperationalError as exc:
                if self.conn is None or self.conn.closed or self.conn.broken or _connection_gone(exc):
                    raise
                # Program limits, out of memory, a full lock table: the statement failed, the
                # database did not go away (classified by SQLSTATE, not by exception class).
                state["failed_statement"] = True
                return {"error": {"kind": "db", "message": _first_line(exc), "sqlstate": exc.sqlstate}}
            except psycopg.Error as exc:
                state["failed_statement"] = True
                return {"error": {"kind": "db", "message": _first_line(exc), "sqlstate": exc.sqlstate}}
            finally:
                self._check_transaction()

        def run(conn: psycopg.Connection) -> tuple[dict[str, Any], dict[str, Any]]:
            with deadline.call(conn, timeout_s):
                return run_within(conn)

        def run_within(conn: psycopg.Connection) -> tuple[dict[str, Any], dict[str, Any]]:
            if not writes:
                return pool.run(message, handle, timeout_s), state
            conn.execute("SAVEPOINT awm_tool")
            ok = False
            try:
                reply = pool.run(message, handle, timeout_s)
                ok = reply.get("op") == "result"
                return reply, state
            finally:
                if not conn.broken:
                    state["rolled_back"] = not self._end_call(conn, ok)

        return self._guard(run)

    def _app_savepoint(self, name: Any) -> None:
        """Open an app transaction's savepoint (:class:`awm.sandbox.appshim.PipeConnection`): sent
        with the transaction's first statement rather than as a request of its own, which spares
        every app transaction a round trip on the pipe. Only the facade's own names are taken."""
        if not isinstance(name, str) or not _APP_SAVEPOINT_NAME.fullmatch(name):
            raise SqlForbidden("not an app savepoint name")
        assert self.conn is not None
        self.conn.execute(f"SAVEPOINT {name}")

    def _check_transaction(self) -> None:
        """After every statement of untrusted code: the episode transaction must still be open."""
        conn = self.conn
        if conn is not None and not conn.broken and conn.info.transaction_status == pq.TransactionStatus.IDLE:
            self._escape("a statement ended the episode transaction")
            conn.execute("BEGIN")

    def _end_call(self, conn: psycopg.Connection, ok: bool) -> bool:
        """Keep the call's writes if it succeeded and its transaction is sound; True if kept."""
        status = conn.info.transaction_status
        if status == pq.TransactionStatus.IDLE:
            self._escape("the episode transaction ended during a tool call")
            conn.execute("BEGIN")
            return False
        if ok and status == pq.TransactionStatus.INTRANS:
            conn.execute("RELEASE SAVEPOINT awm_tool")
            return True
        conn.execute("ROLLBACK TO SAVEPOINT awm_tool")
        conn.execute("RELEASE SAVEPOINT awm_tool")
        return False

    @contextmanager
    def _read_only(self, schema: str) -> Iterator[psycopg.Connection]:
        assert self.conn is not None
        conn = self.conn
        conn.execute("SAVEPOINT awm_read")
        try:
            conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(READER_ROLE)))
            conn.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(schema)))
            # Read-only by the transaction too, not only by the role: no nextval, no writes even
            # if a verifier found a way out of its role.
            conn.execute("SET LOCAL transaction_read_only = on")
            yield conn
        finally:
            if not conn.broken:
                conn.execute("ROLLBACK TO SAVEPOINT awm_read")
                conn.execute("RELEASE SAVEPOINT awm_read")

    def read_query(self, initial: bool, query: str, params: list[Any]) -> list[dict[str, Any]]:
        """A verifier's query: read-only role, inside a savepoint that is always rolled back.
        ``initial`` reads the snapshot copy instead of the live tables."""
        schema = snap.SNAPSHOT_SCHEMA if initial else "public"

        def run(conn: psycopg.Connection) -> list[dict[str, Any]]:
            with self._read_only(schema):
                return execute_untrusted(conn, query, list(params), "dicts")["rows"]

        return self._guard(run)

    def read_tables(self, initial: bool) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
        """Every row of every table, read-only (the snapshot copy if ``initial``): the input of
        the SQLite files that AWM-style verifiers read (``awm/postgres/sqlite_export.py``)."""
        from awm.postgres.sqlite_export import read_tables

        schema = snap.SNAPSHOT_SCHEMA if initial else "public"

        def run(conn: psycopg.Connection) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
            with self._read_only(schema):
                return read_tables(conn, schema, self._tables)

        return self._guard(run)

    def diff(self, tables: list[str] | None = None) -> dict[str, Any]:
        return self._guard(lambda c: snap.diff(c, self._keys, self._tables if tables is None else tables))

    def diff_rows(self, limit: int) -> dict[str, Any]:
        """The changed rows, scanning only the tables this episode's transaction wrote to (every
        table if the episode escaped its transaction): taken after every tool call, it must not
        cost a scan of every table each time."""
        def run(conn: psycopg.Connection) -> dict[str, Any]:
            written = snap.written_tables(conn)
            tables = self._tables if self.escaped else [t for t in self._tables if t in written]
            return snap.diff_rows(conn, self._keys, tables, limit)

        return self._guard(run)

    def checksum(self) -> dict[str, Any]:
        current = self._guard(snap.compute_checksum)
        assert self._expected is not None
        bad = current.mismatches(self._expected)
        return {"pristine": not bad, "mismatches": bad, "digest": current.digest,
                "snapshot_digest": self._expected.digest}


def _connection_gone(exc: psycopg.Error) -> bool:
    """SQLSTATE classes that mean the session is over: connection exceptions (08), the server
    shutting down or terminating the backend (57P01-57P05)."""
    state = exc.sqlstate or ""
    return state == "" or state.startswith("08") or state.startswith("57P")


class _Deadline:
    """The server's own deadline for the calls on one connection: when it passes while a
    statement of the call is running, the statement is cancelled at the protocol level (a cancel
    request to the postmaster, which needs no connection slot) instead of running on until its
    statement timeout. One long-lived thread per connection that looks every ``TICK_S`` (arming
    it costs a call nothing: no thread per call, no wake-up per call)."""

    TICK_S = 0.1

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None
        self._until: float | None = None
        self._running = False
        self._thread = threading.Thread(target=self._watch, name="awm-deadline", daemon=True)
        self._thread.start()

    @contextmanager
    def call(self, conn: psycopg.Connection | None, timeout_s: float) -> Iterator["_Deadline"]:
        self._conn, self._until = conn, time.monotonic() + timeout_s
        try:
            yield self
        finally:
            self._until = None

    @contextmanager
    def statement(self) -> Iterator[None]:
        self._running = True
        try:
            yield
        finally:
            with self._lock:  # never between the watchdog's check and its cancel
                self._running = False

    def _watch(self) -> None:
        while True:
            time.sleep(self.TICK_S)
            until = self._until
            if until is None or time.monotonic() < until:
                continue
            with self._lock:
                conn = self._conn
                if self._running and self._until is not None and conn is not None and not conn.closed:
                    self._until = None
                    try:
                        conn.cancel_safe(timeout=2.0)
                    except Exception:  # noqa: BLE001 - best effort: the statement timeout still holds
                        pass


def _first_line(exc: psycopg.Error) -> str:
    return (exc.diag.message_primary or str(exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = ["EpisodeDatabase", "DatabaseLost", "NotPristine", "ResetResult", "to_json_value"]
