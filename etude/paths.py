"""Where etude keeps its caches and state (overridable by environment variables), and the digest
of a directory's files (`dir_sha256`: a model's weights, an adapter)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
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


def dir_sha256(d: str | Path, keep: Callable[[str], bool] = lambda rel: True, *, recursive: bool = True,
               sep: bytes = b"\0") -> str | None:
    """sha256 over the files of directory `d` whose relative path (posix) `keep` accepts, in path
    order: each file's relative path followed by `sep`, then its bytes. `recursive=False` reads
    only the top level. None when `d` is no directory or no file is kept."""
    root = Path(d)
    if not root.is_dir():
        return None
    found = sorted(root.rglob("*") if recursive else root.glob("*"))
    files = [(f, f.relative_to(root).as_posix()) for f in found if f.is_file()]
    files = [(f, rel) for f, rel in files if keep(rel)]
    if not files:
        return None
    h = hashlib.sha256()
    for f, rel in files:
        h.update(rel.encode() + sep)
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()
