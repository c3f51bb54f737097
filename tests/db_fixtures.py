"""Databases for the store tests: a fresh SQLite file, or a fresh database on a real PostgreSQL
server named by $ETUDE_TEST_POSTGRES_URL (an SQLAlchemy URL of a database we may create other
databases from; `.ci/run` starts a throwaway cluster with scripts/pg-cluster.sh and sets it).

Without that variable the PostgreSQL cases skip, saying how to run them; under CI (CI=true) they
fail instead, so a CI run that lost its server cannot pass by skipping."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PG_ENV = "ETUDE_TEST_POSTGRES_URL"
BACKENDS = ("sqlite", "postgresql")


def postgres_server_url() -> str:
    """The server's URL, or skip (locally) / fail (CI) when there is none to test against."""
    url = os.environ.get(PG_ENV)
    if not url:
        why = f"no PostgreSQL server: set {PG_ENV} (scripts/pg-cluster.sh start DIR prints one)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}; CI must run the PostgreSQL tests (.ci/run sets it)", pytrace=False)
        pytest.skip(why)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        why = "psycopg is not installed (pip install -e '.[postgres]')"
        if os.environ.get("CI"):
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    return url


@contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server for one test; dropped afterwards."""
    import sqlalchemy as sa

    name = f"etude_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def fresh_database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, empty database of `backend` ("sqlite" or "postgresql")."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'etude.db'}"
        return
    with fresh_postgres_database(postgres_server_url()) as url:
        yield url


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The test runs once per backend, each time on a fresh database."""
    with fresh_database(request.param, tmp_path) as url:
        yield url
