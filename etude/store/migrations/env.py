"""Alembic environment for etude's store. `etude.store.open_store` runs it programmatically and
hands it an open connection (config.attributes["connection"]); there is no alembic.ini."""

from __future__ import annotations

from alembic import context

from etude.store.schema import metadata

config = context.config


def run_migrations_online() -> None:
    connection = config.attributes["connection"]
    # render_as_batch: SQLite cannot ALTER most things, batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("etude's store migrations run online only (through etude.store.open_store)")
run_migrations_online()
