"""Opening a database: URL resolution, SQLite pragmas for durability, alembic migrations.

Guarantees: on SQLite the database runs in WAL mode with `synchronous=FULL`, so a committed
transaction has been fsynced to the WAL before `commit()` returns — a `kill -9` (or a power
cut, if the disk honours fsync) after that loses nothing. Write transactions start with
`BEGIN IMMEDIATE`, so two writers never deadlock on a read-to-write lock upgrade; they wait up
to `busy_timeout_s` for each other instead. Migrations run on open under a file lock, so two
processes opening a fresh file at once do not race.

PostgreSQL works by URL (`postgresql+psycopg://...`, the `postgres` extra) through the same
Core statements; a committed transaction is durable as the server's `fsync` and
`synchronous_commit` settings make it (on by default). Migrations take a PostgreSQL advisory
lock, so concurrent first opens take turns there too. The store tests run on both backends
(`.ci/run` starts a throwaway cluster: scripts/pg-cluster.sh, tests/db_fixtures.py).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from etude.errors import EtudeError
from etude.paths import home

MIGRATIONS = Path(__file__).parent / "migrations"


def resolve_url(url: str | None = None) -> str:
    """`url`, else $ETUDE_DB, else sqlite:///<ETUDE_HOME>/etude.db. A bare path means SQLite."""
    url = url or os.environ.get("ETUDE_DB") or f"sqlite:///{home() / 'etude.db'}"
    if "://" not in url:
        url = f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def _sqlite_path(url: sa.URL) -> Path | None:
    db = url.database
    if url.get_backend_name() != "sqlite" or not db or db == ":memory:":
        return None
    return Path(db)


def _install_sqlite_pragmas(engine: Engine, busy_timeout_s: float) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # I take over transaction control from pysqlite (its implicit BEGIN is deferred and
        # issued lazily), so that BEGIN IMMEDIATE below is what actually opens a write.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get("etude_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def make_engine(url: str, busy_timeout_s: float = 30.0) -> Engine:
    """An engine for `url` with etude's durability settings (see module docstring)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as e:
        raise EtudeError(f"not a database URL: {url!r}") from e
    path = _sqlite_path(parsed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(parsed, connect_args={"check_same_thread": False, "timeout": busy_timeout_s})
        _install_sqlite_pragmas(engine, busy_timeout_s)
        return engine
    try:
        return sa.create_engine(parsed, pool_pre_ping=True)
    except sa.exc.NoSuchModuleError as e:
        raise EtudeError(f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql+psycopg://...") from e
    except ModuleNotFoundError as e:
        raise EtudeError(f"no driver for {parsed.get_backend_name()}: {e.name} (pip install 'etude[postgres]')") from e


_PG_MIGRATION_LOCK = 0x657475_6465  # a fixed advisory-lock key ("etude"); such locks are per database


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    path = _sqlite_path(engine.url)
    if path is None:
        if engine.url.get_backend_name() != "postgresql":
            yield
            return
        # Two processes migrating a fresh database at once would both create alembic_version
        # (one fails on its primary key): a session advisory lock makes them take turns.
        with engine.connect() as conn:
            conn.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_MIGRATION_LOCK})")
            conn.commit()
            try:
                yield
            finally:
                conn.exec_driver_sql(f"SELECT pg_advisory_unlock({_PG_MIGRATION_LOCK})")
                conn.commit()
        return
    with open(f"{path}.migrate.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _alembic_config() -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "etude/store/migrations has no revisions"
    return head


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def migrate(engine: Engine) -> None:
    """Bring the database to the newest revision (a no-op when it is there already)."""
    from alembic import command

    head = head_revision()
    if current_revision(engine) == head:
        return
    with _migration_lock(engine):
        if current_revision(engine) == head:  # someone else migrated while we waited
            return
        cfg = _alembic_config()
        with engine.connect().execution_options(etude_write=True) as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
