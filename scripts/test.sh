#!/usr/bin/env bash
# The README's test command (`make test`, `make test-fast`): the whole suite, with a throwaway
# PostgreSQL cluster (scripts/pg-cluster.sh; Debian's server, installed with apt-get when missing)
# so the store tests run on PostgreSQL as well as SQLite. When ETUDE_TEST_POSTGRES_URL is already
# set (a server of your own), that one is used and none is started. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${ETUDE_TEST_POSTGRES_URL:-}" ]; then
  pgdir=$(mktemp -d "${TMPDIR:-/tmp}/etude-test-pg.XXXXXX")
  trap 'bash scripts/pg-cluster.sh stop "$pgdir"' EXIT
  ETUDE_TEST_POSTGRES_URL=$(bash scripts/pg-cluster.sh start "$pgdir")
  export ETUDE_TEST_POSTGRES_URL
  echo "test: PostgreSQL test cluster at $ETUDE_TEST_POSTGRES_URL"
fi
.venv/bin/python -m pytest -q "$@"
