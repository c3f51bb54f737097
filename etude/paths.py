"""Where etude keeps its caches and state. Overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path


def home(create: bool = True) -> Path:
    """State: the default SQLite database, keys, registry (ETUDE_HOME, default ~/.etude); made
    unless `create` is false (a caller that only looks)."""
    p = Path(os.environ.get("ETUDE_HOME", Path.home() / ".etude"))
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def cache() -> Path:
    """Re-creatable downloads and conversions: sdists, converted models, indexes
    (ETUDE_CACHE, default ~/.cache/etude)."""
    p = Path(os.environ.get("ETUDE_CACHE", Path.home() / ".cache" / "etude"))
    p.mkdir(parents=True, exist_ok=True)
    return p
