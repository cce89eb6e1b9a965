"""The reset engine against a real PostgreSQL: rows and sequences pristine, every path."""

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awm.postgres import provision
from awm.sandbox.pool import WorkerPool, WorkerSpec
from awm.envserver.reset import EpisodeDatabase

# Tool code for these tests, run in a real confined worker as the env server runs it.
TOOLS = {
    "write_a_lot": """
def write_a_lot(db):
    for i in range(5):
        db.execute("INSERT INTO notes (user_id, title) VALUES (1, %s)", f"n{i}")
    db.execute("UPDATE notes SET body = 'changed' WHERE id = 2")
    db.execute("DELETE FROM tags WHERE note_id = 1")
    db.execute("INSERT INTO users (name) VALUES ('Mallory')")
""",
    "run": """
def run(db, sql, scalar=False):
    return db.scalar(sql) if scalar else db.execute(sql)
""",
    "crash": """
def crash(db):
    db.execute("UPDATE notes SET body = 'lost' WHERE id = 2")
    raise RuntimeError("boom")
""",
}


@pytest.fixture(scope="module")
def pool():
    spec = WorkerSpec(load={"prelude": "", "tools": [{"name": k, "code": v} for k, v in TOOLS.items()]})
    pool = WorkerPool(spec)
    pool.start()
    yield pool
    pool.close()


@pytest.fixture
def episode_db(admin_dsn, notes_bundle):
    template = provision.ensure_template(admin_dsn, notes_bundle)
    instance = provision.create_instance(admin_dsn, template, "awm_i_reset_test")
    db = EpisodeDatabase(instance.dsn)
    db.connect()
    db.reset(verify=True)
    yield db, instance
    db.close()
    provision.drop_instance(admin_dsn, instance.dbname)


def call(db: EpisodeDatabase, pool: WorkerPool, tool: str, **arguments):
    reply, _ = db.run_code(pool, {"op": "call", "tool": tool, "arguments": arguments}, 10, writes=True)
    return reply


def _write_a_lot(db: EpisodeDatabase, pool: WorkerPool) -> None:
    assert call(db, pool, "write_a_lot")["op"] == "result"


def test_reset_restores_rows_and_sequences(episode_db, pool):
    db, _ = episode_db
    for _ in range(3):
        _write_a_lot(db, pool)
        assert db.diff() == {
            "notes": {"inserted": 5, "updated": 1, "deleted": 0},
            "tags": {"inserted": 0, "updated": 0, "deleted": 1},
            "users": {"inserted": 1, "updated": 0, "deleted": 0},
        }
        assert not db.checksum()["pristine"]
        result = db.reset(verify=True)
        assert result.strategy == "rollback" and result.pristine is True
        assert db.diff() == {}
    # The next id handed out is the same in every episode (ROLLBACK alone would drift).
    ids = set()
    for _ in range(3):
        ids.add(call(db, pool, "run", sql="INSERT INTO notes (user_id, title) VALUES (1, 'x') RETURNING id",
                     scalar=True)["value"])
        db.reset()
    assert ids == {5}


def test_failed_tool_rolls_back_only_its_own_writes(episode_db, pool):
    db, _ = episode_db
    call(db, pool, "run", sql="UPDATE notes SET body = 'kept' WHERE id = 1")
    reply = call(db, pool, "crash")
    assert reply["op"] == "failed" and "boom" in reply["reason"]
    assert db.diff() == {"notes": {"inserted": 0, "updated": 1, "deleted": 0}}
    assert call(db, pool, "run", sql="SELECT body FROM notes WHERE id = 2", scalar=True)["value"] == "a faster reset"


def test_a_replaced_transaction_is_caught_by_the_next_plain_reset(episode_db):
    """Whatever ends the episode's transaction and starts another (here the test does it on the
    server's own connection), the next reset sees that the transaction it rolls back is not the
    episode's, and repairs from the snapshot instead of trusting the fast path."""
    db, _ = episode_db
    db.conn.execute("DELETE FROM tags")
    db.conn.execute("COMMIT")  # the delete is now durable
    db.conn.execute("BEGIN")
    result = db.reset()
    assert result.escaped and "not the episode's" in result.escaped
    assert result.strategy == "restore" and result.pristine is True and result.repaired == ["tags"]
    assert db.checksum()["pristine"]
    assert db.reset().strategy == "rollback"  # and the next episode is back on the fast path


def test_a_second_connection_as_the_instance_role_is_refused(episode_db):
    db, instance = episode_db
    with pytest.raises(psycopg.OperationalError, match="too many connections"):
        psycopg.connect(instance.dsn, autocommit=True)


def test_changes_from_outside_are_found_by_an_on_demand_check(episode_db, admin_dsn):
    db, instance = episode_db
    params = conninfo_to_dict(admin_dsn)
    params["dbname"] = instance.dbname
    with psycopg.connect(make_conninfo(**params), autocommit=True) as other:  # e.g. an operator's hands
        other.execute("UPDATE users SET name = 'Eve' WHERE id = 2")
        other.execute("SELECT nextval('notes_id_seq')")
    assert db.reset().pristine is None  # the fast path does not look...
    result = db.reset(verify=True)  # ...the checked one does, and repairs
    assert result.strategy == "restore"
    assert result.repaired == ["users"]  # the sequence was rewound by the fast path already
    assert db.checksum()["pristine"]


def test_verifier_reads_are_read_only_and_see_the_episode(episode_db, pool):
    db, _ = episode_db
    call(db, pool, "run", sql="UPDATE notes SET title = 'renamed' WHERE id = 1")
    assert db.read_query(False, "SELECT title FROM notes WHERE id = 1", []) == [{"title": "renamed"}]
    assert db.read_query(True, "SELECT title FROM notes WHERE id = 1", []) == [{"title": "todo"}]
    # Two layers refuse a write: the read-only transaction (checked first) and the role.
    refused = (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.InsufficientPrivilege)
    with pytest.raises(refused):
        db.read_query(False, "DELETE FROM notes", [])
    with pytest.raises(refused):
        db.read_query(False, "WITH d AS (DELETE FROM tags RETURNING *) SELECT count(*) FROM d", [])
    with pytest.raises(refused):
        db.read_query(False, "SELECT nextval('notes_id_seq')", [])
    # The episode's own work survived the refused writes.
    assert db.diff() == {"notes": {"inserted": 0, "updated": 1, "deleted": 0}}


class _UnixForwarder:
    """A TCP listener on ``address`` that forwards each connection to the embedded server's
    Unix socket: the TCP path (a host name, its address) that a shard's clients take."""

    def __init__(self, address: str, socket_path: str) -> None:
        import socket
        import threading

        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind((address, 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self._socket, self._path = socket, socket_path
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = self._socket.socket(self._socket.AF_UNIX, self._socket.SOCK_STREAM)
            server.connect(self._path)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(2)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def test_a_host_name_is_resolved_once_and_again_after_a_failed_connection(episode_db, monkeypatch):
    """The reset engine connects to a DSN's host by the address it looked up once
    (awm.postgres.hostaddr: no DNS walk on a switch's claim path), and a connection refused at
    a stale address makes it look the name up again, within the same connect."""
    import socket

    from awm.postgres import hostaddr

    _, instance = episode_db
    params = conninfo_to_dict(instance.dsn)
    address = socket.getaddrinfo("localhost", 5432, proto=socket.IPPROTO_TCP, type=socket.SOCK_STREAM)[0][4][0]
    forwarder = _UnixForwarder(address, f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}")
    lookups: list[str] = []
    real = socket.getaddrinfo

    def counting(host, *args, **kwargs):
        lookups.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", counting)
    monkeypatch.setattr(hostaddr, "_addresses", {})
    dsn = make_conninfo(**{**params, "host": "localhost", "port": str(forwarder.port)})
    episode_db[0].close()  # the instance role's one connection
    db = EpisodeDatabase(dsn)
    try:
        db.connect()
        assert lookups == ["localhost"]
        assert db.conn is not None and db.conn.info.hostaddr == address
        assert db.reset(verify=True).pristine
        db.close()
        db.connect()  # the second connection: no lookup
        assert lookups == ["localhost"]
        db.close()
        lookups.clear()
        key = ("localhost", str(forwarder.port))
        stale = "127.0.0.2" if "." in address else "::2"
        hostaddr._addresses[key] = (stale, hostaddr._addresses[key][1])  # the server "moved"
        db.connect(wait_s=10)
        assert lookups == ["localhost"] and db.conn.info.hostaddr == address
        assert db.reset(verify=True).pristine
    finally:
        db.close()
        forwarder.close()
    # Nothing to look up: a socket directory, an address, or hostaddr given.
    assert hostaddr.pinned(instance.dsn) == instance.dsn
    for given in ({"host": "127.0.0.1"}, {"host": "localhost", "hostaddr": "127.0.0.1"}):
        ip_dsn = make_conninfo(**{**params, **given})
        assert hostaddr.pinned(ip_dsn) == ip_dsn
