"""The store tests run on both backends: SQLite, and PostgreSQL when a server is given (see tests/db_fixtures.py)."""

from tests.db_fixtures import db_url  # noqa: F401
