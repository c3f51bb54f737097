"""On-disk state of semantic search: a shared embedding cache and one index file per repository.

- `EmbeddingCache` (cache()/search/embeddings.sqlite): content-addressed, sha256 of the
  embedder id and the exact text embedded -> float16 vector. Every index on the machine reads
  and fills it, so a workspace derived from a template, or a second checkout of the same
  code, embeds nothing that was embedded before.
- `IndexDB` (cache()/search/<key>/index.sqlite): per repository root, the files seen
  (size, mtime, sha256) and their chunks (span, symbol, vector, term counts). A file's rows are
  replaced in one transaction, so a crash leaves the previous state of that file, never half.

Both are SQLite in WAL mode: several processes may read and write them at once (writers wait
up to 60 s for each other). Vectors are stored as float16: half the size, and the ranking
difference is far below what changes a top-10 (scores are computed in float32).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SCHEMA_VERSION = "1"


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=60.0, check_same_thread=False, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")  # a cache: losing the last transaction on power loss is fine
    return con


def text_key(embedder_id: str, text: str) -> bytes:
    return hashlib.sha256(embedder_id.encode() + b"\0" + text.encode("utf-8", errors="replace")).digest()


class EmbeddingCache:
    """key (sha256 bytes) -> unit vector, shared by every index using the same embedder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = _connect(path)
        self.lock = threading.Lock()  # indexes seeded from one template share this connection across threads
        self.con.execute("CREATE TABLE IF NOT EXISTS emb (key BLOB PRIMARY KEY, vec BLOB NOT NULL) WITHOUT ROWID")

    def get_many(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        found: dict[bytes, np.ndarray] = {}
        with self.lock:
            for i in range(0, len(keys), 500):  # SQLite's limit on bound parameters is 999 or more
                part = keys[i : i + 500]
                sql = f"SELECT key, vec FROM emb WHERE key IN ({','.join('?' * len(part))})"
                for key, vec in self.con.execute(sql, part):
                    found[key] = np.frombuffer(vec, np.float16).astype(np.float32)
        return found

    def put_many(self, items: Iterable[tuple[bytes, np.ndarray]]) -> None:
        rows = [(k, v.astype(np.float16).tobytes()) for k, v in items]
        with self.lock, self.con:
            self.con.execute("BEGIN")
            self.con.executemany("INSERT OR IGNORE INTO emb (key, vec) VALUES (?, ?)", rows)


@dataclass(frozen=True)
class FileRecord:
    """What the index knows about one file: its identity and its chunks' rows."""

    size: int
    mtime_ns: int
    sha256: str
    starts: np.ndarray  # [n_chunks] int32
    ends: np.ndarray  # [n_chunks] int32
    symbols: tuple[str, ...]  # [n_chunks]
    kinds: tuple[str, ...]  # [n_chunks]
    vecs: np.ndarray  # [n_chunks, dim] float32, unit rows
    terms: tuple[tuple[np.ndarray, np.ndarray], ...]  # [n_chunks] (term ids, counts)

    @property
    def n(self) -> int:
        return len(self.symbols)


class IndexDB:
    """The persisted index of one repository root."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.con = _connect(path)
        self.con.executescript(
            """
            CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, sha256 TEXT);
            CREATE TABLE IF NOT EXISTS chunks (
                path TEXT, ord INTEGER, start INTEGER, end_ INTEGER, symbol TEXT, kind TEXT,
                vec BLOB, term_ids BLOB, term_counts BLOB, PRIMARY KEY (path, ord)) WITHOUT ROWID;
            """
        )

    def meta(self) -> dict[str, str]:
        return dict(self.con.execute("SELECT k, v FROM meta"))

    def set_meta(self, values: dict[str, str]) -> None:
        with self.con:
            self.con.execute("BEGIN")
            self.con.executemany("INSERT OR REPLACE INTO meta (k, v) VALUES (?, ?)", values.items())

    def clear(self) -> None:
        with self.con:
            self.con.execute("BEGIN")
            self.con.execute("DELETE FROM files")
            self.con.execute("DELETE FROM chunks")

    def load(self, dim: int) -> Iterator[tuple[str, FileRecord]]:
        """Every file's record, in path order."""
        files = {p: (s, m, h) for p, s, m, h in self.con.execute("SELECT path, size, mtime_ns, sha256 FROM files")}
        rows: dict[str, list[tuple]] = {p: [] for p in files}
        for row in self.con.execute("SELECT path, start, end_, symbol, kind, vec, term_ids, term_counts FROM chunks ORDER BY path, ord"):
            if row[0] in rows:
                rows[row[0]].append(row[1:])
        for path in sorted(files):
            size, mtime, sha = files[path]
            yield path, _record(size, mtime, sha, rows[path], dim)

    def write(self, changed: dict[str, FileRecord], removed: Iterable[str], touched: dict[str, FileRecord]) -> None:
        """Replace the rows of `changed` files, drop `removed`, update stat fields of `touched`."""
        with self.con:
            self.con.execute("BEGIN")
            for path in [*removed, *changed]:
                self.con.execute("DELETE FROM files WHERE path = ?", (path,))
                self.con.execute("DELETE FROM chunks WHERE path = ?", (path,))
            for path, rec in {**touched, **changed}.items():
                self.con.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)", (path, rec.size, rec.mtime_ns, rec.sha256))
            for path, rec in changed.items():
                self.con.executemany("INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", _rows(path, rec))


def _rows(path: str, rec: FileRecord) -> Iterator[tuple]:
    for i in range(rec.n):
        ids, cnt = rec.terms[i]
        yield (path, i, int(rec.starts[i]), int(rec.ends[i]), rec.symbols[i], rec.kinds[i],
               rec.vecs[i].astype(np.float16).tobytes(), ids.astype(np.int32).tobytes(), cnt.astype(np.uint16).tobytes())


def _record(size: int, mtime: int, sha: str, rows: list[tuple], dim: int) -> FileRecord:
    vecs = np.frombuffer(b"".join(r[4] for r in rows), np.float16).astype(np.float32).reshape(len(rows), dim)
    return FileRecord(
        size=size, mtime_ns=mtime, sha256=sha,
        starts=np.array([r[0] for r in rows], np.int32), ends=np.array([r[1] for r in rows], np.int32),
        symbols=tuple(r[2] for r in rows), kinds=tuple(r[3] for r in rows), vecs=vecs,
        terms=tuple((np.frombuffer(r[5], np.int32), np.frombuffer(r[6], np.uint16)) for r in rows),
    )
