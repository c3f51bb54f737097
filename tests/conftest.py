"""Shared test configuration. Component tests live in tests/<component>/ and may add their own conftest."""

import os

import pytest

# Tests never touch the user's real state or caches unless they say so.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def etude_home(tmp_path, monkeypatch):
    """An isolated ETUDE_HOME for a test (database, keys, registry)."""
    home = tmp_path / "etude-home"
    monkeypatch.setenv("ETUDE_HOME", str(home))
    return home

# Test folders are packages (tests/<component>/__init__.py) so equal basenames in two folders
# do not clash. tests/rewards keeps a helper module its tests import by plain name.
import sys as _sys  # noqa: E402
from pathlib import Path as _Path  # noqa: E402

_sys.path.insert(0, str(_Path(__file__).parent / "rewards"))
