#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the store tests: Debian's server, listening on a unix socket
# in DIR only (no TCP port), fsync on. As root it installs the `postgresql` package with apt-get
# when the server is missing, and runs the server as the `postgres` user (PostgreSQL refuses root).
#
#   scripts/pg-cluster.sh start DIR   # DIR: a new or empty directory; prints the SQLAlchemy URL
#   scripts/pg-cluster.sh stop DIR    # stops the server and deletes DIR
#
# .ci/run exports the URL as ETUDE_TEST_POSTGRES_URL, which tests/db_fixtures.py reads.
set -euo pipefail

die() { echo "pg-cluster: $*" >&2; exit 1; }
bindir() {  # the newest installed major version's bin directory, or nothing
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | while read -r d; do
    if [ -x "$d/initdb" ]; then echo "$d"; fi
  done | tail -1
}
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start|stop DIR"

case "$cmd" in
start)
  bin=$(bindir)
  if [ -z "$bin" ]; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || die "no PostgreSQL server here; install it (Debian: apt-get install postgresql)"
    echo "pg-cluster: installing postgresql with apt-get" >&2
    apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null || die "apt-get install postgresql failed"
    bin=$(bindir)
    [ -n "$bin" ] || die "postgresql installed but no initdb under /usr/lib/postgresql/*/bin"
  fi
  mkdir -p "$dir"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "no 'postgres' user to run the server as (the postgresql package creates it)"
    chown postgres: "$dir"
  fi
  as_owner "$bin/initdb" -D "$dir/data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { tail -5 "$dir/initdb.log" >&2; die "initdb failed (log above)"; }
  as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses='' -k $dir -c fsync=on -c synchronous_commit=on -c max_connections=200" start >/dev/null \
    || { tail -5 "$dir/server.log" >&2; die "the server did not start (log above)"; }
  echo "postgresql+psycopg://postgres@/postgres?host=$dir"
  ;;
stop)
  bin=$(bindir)
  if [ -n "$bin" ] && [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null || echo "pg-cluster: stop failed" >&2
  fi
  rm -rf "$dir"
  ;;
*) die "usage: $0 start|stop DIR" ;;
esac
