#!/bin/sh
# First start: initdb into $PGDATA with the superuser password from $POSTGRES_PASSWORD (password
# auth over TCP, trust only on the local socket), as the official image does. Then the server,
# with any arguments given (the chart passes `-c max_connections=...`).
set -eu
: "${PGDATA:=/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "awm-postgres: POSTGRES_PASSWORD is not set; refusing to create a database without a password" >&2
    exit 1
  fi
  mkdir -p "$PGDATA"
  chmod 700 "$PGDATA"
  pwfile="$(mktemp)"
  printf '%s' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb --pgdata="$PGDATA" --username=postgres --pwfile="$pwfile" --encoding=UTF8 \
         --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
