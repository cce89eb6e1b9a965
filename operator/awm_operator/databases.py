"""A fleet's instance databases on its Postgres (admin DSN from the fleet's Secret).

Pods create their own databases (init container ``provision``: ``python -m
awm.postgres.provision``) and record pod, fleet and namespace in the database comment; the operator
only ever drops them: those of deleted pods (a periodic sweep) and all of a deleted fleet
(its finalizer). Blocking psycopg calls: callers run these in a thread.
"""

from __future__ import annotations

from awm.postgres import provision


def fleet_databases(admin_dsn: str, namespace: str, fleet: str) -> dict[str, str]:
    """Database name -> pod name, for every instance database of this fleet."""
    return {db: str(meta.get("pod", "")) for db, meta in provision.instances_with_meta(admin_dsn).items()
            if meta.get("fleet") == fleet and meta.get("namespace") == namespace}


def drop(admin_dsn: str, names: list[str]) -> None:
    for name in names:
        provision.drop_instance(admin_dsn, name)


def drop_orphans(admin_dsn: str, namespace: str, fleet: str, live_pods: set[str]) -> list[str]:
    """Drop the databases whose pod no longer exists; return their names."""
    gone = [db for db, pod in fleet_databases(admin_dsn, namespace, fleet).items() if pod not in live_pods]
    drop(admin_dsn, gone)
    return gone
