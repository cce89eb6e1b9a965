"""Embedded server, templates and instance isolation, against a real PostgreSQL."""

import json
import time

import psycopg
from psycopg import sql
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awm.bundle import EnvBundle
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres


def _dsn(dsn: str, **changes) -> str:
    params = conninfo_to_dict(dsn)
    params.update(changes)
    return make_conninfo(**params)


def test_start_is_idempotent(pg: EmbeddedPostgres):
    assert pg.is_running()
    assert pg.start() is False
    assert int(pg.version().split(".")[0]) >= 15


def test_passwords_are_required(pg: EmbeddedPostgres, admin_dsn):
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(_dsn(admin_dsn, password=""))


def test_provisioning_waits_out_a_full_server_but_not_a_wrong_password(admin_dsn, monkeypatch):
    """Out of connection slots (a thousand pods provisioning at once) is retried until a slot
    frees; a wrong password is reported at once."""
    import threading

    attempts: list[str] = []
    real_connect = psycopg.connect

    def counting_connect(dsn, **kwargs):
        attempts.append(dsn)
        return real_connect(dsn, **kwargs)

    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS awm_test_limited")
        conn.execute("CREATE ROLE awm_test_limited LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")
        conn.execute("GRANT CONNECT ON DATABASE postgres TO awm_test_limited")
    limited = _dsn(admin_dsn, user="awm_test_limited", password="pw")
    try:
        holder = psycopg.connect(limited)
        monkeypatch.setattr(provision.psycopg, "connect", counting_connect)
        first_refused = threading.Event()

        def free_the_slot() -> None:
            while len(attempts) < 2:  # the first attempt was refused; a retry is under way
                first_refused.wait(0.05)
            holder.close()

        threading.Thread(target=free_the_slot, daemon=True).start()
        with provision._admin(limited) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("awm_test_limited",)
        assert len(attempts) >= 2
        attempts.clear()
        with pytest.raises(psycopg.OperationalError, match="password"):
            provision._admin(_dsn(admin_dsn, user="awm_test_limited", password="wrong"))
        assert len(attempts) == 1
    finally:
        monkeypatch.undo()
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("REVOKE CONNECT ON DATABASE postgres FROM awm_test_limited")
            conn.execute("DROP ROLE IF EXISTS awm_test_limited")


def test_a_server_that_never_answers_is_an_error_not_a_hang(admin_dsn, monkeypatch):
    """A Postgres address that accepts connections and then says nothing (a hung server, a
    half-open route) fails the connect after ``connect_timeout``, retried as transient until
    ``CONNECT_RETRY_S``; the DSN's own settings win over the defaults; keepalives are on."""
    import concurrent.futures
    import socket

    with provision._admin(admin_dsn) as conn:
        params = conninfo_to_dict(conn.info.dsn)
    assert (params["keepalives"], params["keepalives_idle"], params["connect_timeout"]) == ("1", "30", "10")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes the handshake; nobody ever reads or writes
    host, port = silent.getsockname()
    attempts: list[str] = []
    real_connect = psycopg.connect
    monkeypatch.setattr(provision.psycopg, "connect", lambda dsn, **kw: attempts.append(dsn) or real_connect(dsn, **kw))
    monkeypatch.setitem(provision.CONNECT_DEFAULTS, "connect_timeout", "1")
    monkeypatch.setattr(provision, "CONNECT_RETRY_S", 2.5)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            hung = pool.submit(provision._admin, f"host={host} port={port} user=u password=p dbname=d")
            with pytest.raises(psycopg.OperationalError, match="timeout"):
                hung.result(timeout=120)  # a watchdog for a hang, not a performance bound
        assert len(attempts) >= 2 and all("connect_timeout=1" in a for a in attempts), attempts
        own = _dsn(admin_dsn, connect_timeout="7")
        with provision._admin(own) as conn:
            assert conninfo_to_dict(conn.info.dsn)["connect_timeout"] == "7"
    finally:
        silent.close()


def test_a_pod_provisions_on_one_connection_without_locks_once_the_template_exists(admin_dsn, notes_bundle,
                                                                                    tmp_path, monkeypatch):
    """The first pod of an environment loads its template (the locked path); every later pod
    clones it on one admin connection and takes no advisory lock, so a fleet's pods starting
    together do not queue behind each other."""
    bundle_file = tmp_path / "notes.json"
    bundle_file.write_text(notes_bundle.model_dump_json())
    with psycopg.connect(admin_dsn, autocommit=True) as conn:  # as if no pod had run yet
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(provision.template_name(notes_bundle))))
    connects: list[str] = []
    statements: list[str] = []
    real_connect = psycopg.connect

    def counting_connect(dsn, **kw):
        conn = real_connect(dsn, **kw)
        connects.append(dsn)
        real_execute = conn.execute
        conn.execute = lambda query, *a, **k: statements.append(str(query)) or real_execute(query, *a, **k)
        return conn

    monkeypatch.setattr(provision.psycopg, "connect", counting_connect)
    names = []
    try:
        for pod in ("notes-pod-a", "notes-pod-b"):
            connects.clear()
            statements.clear()
            names.append((provision.provision_pod(str(bundle_file), pod, str(tmp_path / pod), admin_dsn, "f", "ns"),
                          tmp_path / pod))
            if pod.endswith("a"):
                assert any("pg_advisory_lock" in q for q in statements) and len(connects) > 1
        assert len(connects) == 1 and not any("advisory" in q for q in statements), (connects, statements)
        for name, dsn_file in names:  # both are working instances
            with real_connect(dsn_file.read_text()) as conn:
                assert conn.execute("SELECT current_database()").fetchone() == (name,)
    finally:
        monkeypatch.undo()
        for name, _ in names:
            provision.drop_instance(admin_dsn, name)


def test_template_is_loaded_once_and_checksummed(admin_dsn, notes_bundle):
    first = provision.ensure_template(admin_dsn, notes_bundle)
    second = provision.ensure_template(admin_dsn, notes_bundle)
    assert first == second and len(first.checksum) == 16
    with psycopg.connect(admin_dsn) as conn:
        comment, allowed = conn.execute(
            "SELECT shobj_description(oid, 'pg_database'), datallowconn FROM pg_database WHERE datname = %s",
            (first.dbname,)).fetchone()
    assert json.loads(comment)["checksum"] == first.checksum
    assert allowed is False  # nobody works in a template by accident


def test_changed_seed_gets_a_new_template(admin_dsn, notes_bundle):
    changed = EnvBundle.model_validate_json(notes_bundle.model_dump_json())
    changed.database.seed[0].rows.append({"id": 3, "name": "Linus"})
    assert provision.template_name(changed) != provision.template_name(notes_bundle)


def test_bad_seed_row_is_reported_precisely(admin_dsn, notes_bundle):
    broken = EnvBundle.model_validate_json(notes_bundle.model_dump_json())
    broken.database.seed[1].rows.append({"id": 99, "user_id": 777, "title": "orphan"})
    with pytest.raises(provision.ProvisionError, match=r"seed row 4 of table 'notes'.*foreign key"):
        provision.ensure_template(admin_dsn, broken)
    with psycopg.connect(admin_dsn) as conn:  # nothing half-loaded is left behind
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s",
                            (provision.template_name(broken),)).fetchone()[0] == 0


def _connect_once_free(dsn: str) -> psycopg.Connection:
    """The instance role may hold one connection; the previous test connection's backend may
    still be exiting (a client's close does not wait for it)."""
    import time

    deadline = time.monotonic() + 10
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError as exc:
            if "too many connections" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_instance_role_reaches_only_its_own_database(admin_dsn, notes_bundle):
    template = provision.ensure_template(admin_dsn, notes_bundle)
    a = provision.create_instance(admin_dsn, template, "awm_i_iso_a")
    b = provision.create_instance(admin_dsn, template, "awm_i_iso_b")
    try:
        with psycopg.connect(a.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 4
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE TABLE public.extra (x int)")
        for other in (b.dbname, template.dbname, "postgres", "template1"):
            with pytest.raises(psycopg.OperationalError):
                psycopg.connect(_dsn(a.dsn, dbname=other))
        with _connect_once_free(a.dsn) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SET ROLE awm")  # no way up to the admin
    finally:
        provision.drop_instance(admin_dsn, a.dbname)
        provision.drop_instance(admin_dsn, b.dbname)
    assert "awm_i_iso_a" not in provision.list_instances(admin_dsn)


def test_an_instance_role_is_hashed_with_one_scram_iteration_and_still_needs_its_password(admin_dsn, notes_bundle):
    """Its password is 24 random bytes, so SCRAM's iterations guard nothing: the provisioner
    gives the server a verifier of one iteration, made by itself, which spares the server's hash
    at creation and the env server's at each connect. libpq authenticates against it; the admin
    role and the server's default are untouched; a wrong password is still refused."""
    template = provision.ensure_template(admin_dsn, notes_bundle)
    inst = provision.create_instance(admin_dsn, template, "awm_i_scram")
    try:
        with provision._admin(admin_dsn) as conn:
            stored = dict(conn.execute("SELECT rolname, rolpassword FROM pg_authid WHERE rolname = ANY(%s)",
                                       (["awm_i_scram", "awm"],)).fetchall())
        assert stored["awm_i_scram"].startswith("SCRAM-SHA-256$1:"), stored["awm_i_scram"][:20]
        assert stored["awm"].startswith("SCRAM-SHA-256$4096:")
        with psycopg.connect(inst.dsn) as conn:
            assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 4
        password = conninfo_to_dict(inst.dsn)["password"]
        wrong = _dsn(inst.dsn, password=password[:-1] + ("y" if password.endswith("x") else "x"))
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(wrong)
    finally:
        provision.drop_instance(admin_dsn, inst.dbname)
    with pytest.raises(ValueError, match="ASCII"):
        provision.scram_verifier("pässword")


def test_primary_keys_are_each_tables_key_columns_in_key_order(admin_dsn):
    """What the reset engine reads at every connect (a switch's first connection to a new
    database): the same answer as ``information_schema``, whose views it no longer queries."""
    from awm.postgres import snapshot as snap

    name = "awm_test_primary_keys"
    with provision._admin(admin_dsn) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with provision._admin(admin_dsn, name) as db:
            db.execute("CREATE TABLE plain (id serial PRIMARY KEY, note text)")
            db.execute("CREATE TABLE pair (b int, a int, c text, PRIMARY KEY (b, a))")  # key order differs from column order
            db.execute("CREATE TABLE keyless (x int)")
            db.execute("ALTER TABLE pair DROP COLUMN c")  # dropped columns keep their attnum gaps
            db.execute("CREATE TABLE moved (z int, y int NOT NULL, UNIQUE (z))")
            db.execute("ALTER TABLE moved ADD PRIMARY KEY (y)")  # a unique index is not the key
            db.execute("CREATE SCHEMA other")
            db.execute("CREATE TABLE other.elsewhere (id int PRIMARY KEY)")
            db.execute("CREATE TABLE parted (k int, d date, PRIMARY KEY (k, d)) PARTITION BY RANGE (d)")
            db.execute("CREATE TABLE parted_2026 PARTITION OF parted FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')")
            keys = snap.primary_keys(db)
            assert keys == {"plain": ["id"], "pair": ["b", "a"], "moved": ["y"], "parted": ["k", "d"],
                            "parted_2026": ["k", "d"]}
            assert snap.primary_keys(db, "other") == {"elsewhere": ["id"]}
            reference: dict[str, list[str]] = {}
            for table, column in db.execute(
                    "SELECT tc.table_name, kcu.column_name FROM information_schema.table_constraints tc "
                    "JOIN information_schema.key_column_usage kcu ON kcu.constraint_name = tc.constraint_name "
                    " AND kcu.table_schema = tc.table_schema AND kcu.table_name = tc.table_name "
                    "WHERE tc.constraint_type = 'PRIMARY KEY' AND tc.table_schema = 'public' "
                    "ORDER BY tc.table_name, kcu.ordinal_position"):
                reference.setdefault(table, []).append(column)
            assert keys == reference
    finally:
        with provision._admin(admin_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_clones_are_wal_logged_on_a_durable_server_and_file_copied_without_fsync(admin_dsn, notes_bundle):
    """The provisioner's strategy follows the server: the embedded one runs without fsync
    (FILE_COPY); with fsync on - made so here for a moment, as the chart's shards run - a clone
    goes through the WAL (FILE_COPY's checkpoints would sync every instance's dirty buffers), and
    that clone is a whole instance: its role reads the template's rows, at the snapshot."""
    from awm.postgres import snapshot as snap

    template = provision.ensure_template(admin_dsn, notes_bundle)

    def strategy_when(fsync: str) -> str | None:
        deadline = time.monotonic() + 30
        while True:  # a reload reaches new backends at once, but do not trust that blindly
            with provision._admin(admin_dsn) as conn:
                if conn.execute("SHOW fsync").fetchone()[0] == fsync or time.monotonic() > deadline:
                    return provision.clone_strategy(conn)
            time.sleep(0.05)

    assert strategy_when("off") == "FILE_COPY"
    try:
        with provision._admin(admin_dsn) as conn:
            conn.execute("ALTER SYSTEM SET fsync = on")
            conn.execute("SELECT pg_reload_conf()")
        assert strategy_when("on") == "WAL_LOG"
        with provision._admin(admin_dsn) as conn:
            inst = provision._create_instance(conn, admin_dsn, template, "awm_i_wal_logged", {}, "WAL_LOG")
        try:
            with psycopg.connect(inst.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM notes").fetchone()[0] == 4
                assert snap.compute_checksum(conn) == snap.stored_checksum(conn)
        finally:
            provision.drop_instance(admin_dsn, inst.dbname)
    finally:
        with provision._admin(admin_dsn) as conn:
            conn.execute("ALTER SYSTEM RESET fsync")
            conn.execute("SELECT pg_reload_conf()")
    assert strategy_when("off") == "FILE_COPY"


def test_one_transaction_is_all_or_nothing_and_leaves_the_connection_usable(admin_dsn):
    """provision.one_transaction: the statements of a spare's take (or a clone's role and
    grants) in one round trip; an error rolls back every one of them."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS awm_one_tx")
        provision.one_transaction(conn, [sql.SQL("CREATE TABLE awm_one_tx (v int)"),
                                         sql.SQL("INSERT INTO awm_one_tx VALUES (1)")], synchronous=False)
        with pytest.raises(psycopg.errors.UniqueViolation):
            provision.one_transaction(conn, [sql.SQL("INSERT INTO awm_one_tx VALUES (2)"),
                                             sql.SQL("CREATE UNIQUE INDEX ON awm_one_tx (v)"),
                                             sql.SQL("INSERT INTO awm_one_tx VALUES (2)")])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert conn.execute("SELECT array_agg(v) FROM awm_one_tx").fetchone()[0] == [1]
        assert conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = 'awm_one_tx'").fetchone()[0] == 0
        conn.execute("DROP TABLE awm_one_tx")
