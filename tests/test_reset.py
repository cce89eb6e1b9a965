"""The reset engine against a real PostgreSQL: rows and sequences pristine, every path."""

import psycopg
import pytest

from awm.postgres import provision
from envserver.reset import EpisodeDatabase


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


def _write_a_lot(db: EpisodeDatabase) -> None:
    def work(h):
        for i in range(5):
            h.execute("INSERT INTO notes (user_id, title) VALUES (1, %s)", f"n{i}")
        h.execute("UPDATE notes SET body = 'changed' WHERE id = 2")
        h.execute("DELETE FROM tags WHERE note_id = 1")
        h.execute("INSERT INTO users (name) VALUES ('Mallory')")
    db.tool_call(work)


def test_reset_restores_rows_and_sequences(episode_db):
    db, _ = episode_db
    for _ in range(3):
        _write_a_lot(db)
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
        ids.add(db.tool_call(lambda h: h.scalar("INSERT INTO notes (user_id, title) VALUES (1, 'x') RETURNING id")))
        db.reset()
    assert ids == {5}


def test_failed_tool_rolls_back_only_its_own_writes(episode_db):
    db, _ = episode_db
    db.tool_call(lambda h: h.execute("UPDATE notes SET body = 'kept' WHERE id = 1"))

    def crash(h):
        h.execute("UPDATE notes SET body = 'lost' WHERE id = 2")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        db.tool_call(crash)
    assert db.diff() == {"notes": {"inserted": 0, "updated": 1, "deleted": 0}}
    assert db.tool_call(lambda h: h.scalar("SELECT body FROM notes WHERE id = 2")) == "a faster reset"


def test_escaped_commit_is_repaired_by_the_dirty_table_fallback(episode_db):
    db, _ = episode_db

    def sneaky(h):
        h.execute("DELETE FROM tags")
        h._conn.execute("COMMIT")  # reaches past the handle: the write is now durable

    db.tool_call(sneaky)
    assert db.escaped
    result = db.reset()
    assert result.strategy == "restore" and result.pristine is True
    assert result.repaired == ["tags"]
    assert db.checksum()["pristine"]


def test_changes_from_outside_are_found_by_an_on_demand_check(episode_db):
    db, instance = episode_db
    with psycopg.connect(instance.dsn, autocommit=True) as other:
        other.execute("UPDATE users SET name = 'Eve' WHERE id = 2")
        other.execute("SELECT nextval('notes_id_seq')")
    assert db.reset().pristine is None  # the fast path does not look...
    result = db.reset(verify=True)  # ...the checked one does, and repairs
    assert result.strategy == "restore"
    assert result.repaired == ["users"]  # the sequence was rewound by the fast path already
    assert db.checksum()["pristine"]


def test_verifier_reads_are_read_only_and_see_the_episode(episode_db):
    db, _ = episode_db
    db.tool_call(lambda h: h.execute("UPDATE notes SET title = 'renamed' WHERE id = 1"))
    assert db.read_query(False, "SELECT title FROM notes WHERE id = 1", []) == [{"title": "renamed"}]
    assert db.read_query(True, "SELECT title FROM notes WHERE id = 1", []) == [{"title": "todo"}]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.read_query(False, "DELETE FROM notes", [])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.read_query(False, "WITH d AS (DELETE FROM tags RETURNING *) SELECT count(*) FROM d", [])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        db.read_query(False, "SELECT nextval('notes_id_seq')", [])
    # The episode's own work survived the refused writes.
    assert db.diff() == {"notes": {"inserted": 0, "updated": 1, "deleted": 0}}
