"""The lexical half of hybrid ranking: code-aware tokens and Okapi BM25 over hashed terms.

Tokens: every identifier is kept whole (lower-cased) and also split at underscores and
camelCase humps, so `parse_expr`, `parseExpr` and "parse expression" meet; words are stemmed
with the Snowball English stemmer. A term is hashed to one of 2**20 columns (crc32, stable
across processes) so a chunk's term counts are two small integer arrays that can be stored
per file and stacked without a shared vocabulary. Collisions at this size are rare and only
ever add score to an unrelated chunk.

I score BM25 myself over a scipy CSC matrix instead of using a BM25 package because the index
is updated one file at a time: the per-file arrays are stacked in milliseconds, while the
packages I looked at (bm25s, rank-bm25) re-tokenise and rebuild the whole corpus on each change.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

N_BUCKETS = 1 << 20
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_HUMP = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# Words that occur in nearly every chunk or query and carry no meaning for search.
_STOP = frozenset(
    "a an and are as at be by do does for from has have how i if in into is it its of on or "
    "that the this to was were what when where which with def self cls return none true false "
    "pass import class not else elif".split()
)


@lru_cache(maxsize=1)
def _stemmer():
    import snowballstemmer

    return snowballstemmer.stemmer("english")


@lru_cache(maxsize=200_000)
def _terms_of(ident: str) -> tuple[str, ...]:
    """The terms one identifier contributes (cached: identifiers repeat a lot)."""
    parts = [p.lower() for p in _HUMP.findall(ident)] if not ident.isdigit() else [ident]
    whole = ident.lower()
    words = [w for w in parts if len(w) > 1 and w not in _STOP]
    stems = _stemmer().stemWords(words) if words else []
    out = list(stems)
    if len(parts) > 1 and whole not in _STOP:
        out.append(whole)  # the identifier itself, so exact names score above their parts
    return tuple(out)


def tokenize(text: str) -> list[str]:
    """Search terms of `text`, in order, with repeats."""
    out: list[str] = []
    for ident in _IDENT.findall(text):
        out.extend(_terms_of(ident))
    return out


@lru_cache(maxsize=200_000)
def term_id(term: str) -> int:
    return zlib.crc32(term.encode("utf-8")) & (N_BUCKETS - 1)


def term_counts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """(sorted term ids int32, counts uint16) of `text`: one chunk's row of the term matrix."""
    counts = Counter(term_id(t) for t in tokenize(text))
    if not counts:
        return np.zeros(0, np.int32), np.zeros(0, np.uint16)
    ids = np.fromiter(counts.keys(), np.int32, len(counts))
    cnt = np.fromiter((min(c, 65535) for c in counts.values()), np.uint16, len(counts))
    order = np.argsort(ids)
    return ids[order], cnt[order]


@dataclass(frozen=True)
class BM25:
    """Okapi BM25 over one or more (chunks x N_BUCKETS) CSC matrices of term counts.

    Several parts score as one corpus (shared N, average length and document frequencies),
    so a small matrix of recently edited files can sit beside a big one without rebuilding it.
    """

    parts: tuple[tuple[object, np.ndarray], ...]  # (scipy csc_matrix float32, [rows] terms per chunk)
    k1: float = 1.2
    b: float = 0.75

    @classmethod
    def build(cls, rows: list[tuple[np.ndarray, np.ndarray]]) -> BM25:
        from scipy.sparse import csr_matrix

        lengths = np.fromiter((len(ids) for ids, _ in rows), np.int64, len(rows))
        indptr = np.concatenate([[0], np.cumsum(lengths)])
        ids = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int32)
        cnt = np.concatenate([r[1] for r in rows]).astype(np.float32) if rows else np.zeros(0, np.float32)
        m = csr_matrix((cnt, ids, indptr), shape=(len(rows), N_BUCKETS)).tocsc()
        # NOTE: not m.sum(axis=1): on a CSC matrix that is a product with a 2**20 vector of ones.
        doc_len = np.bincount(np.repeat(np.arange(len(rows)), lengths), weights=cnt, minlength=len(rows))
        return cls(parts=((m, doc_len.astype(np.float32)),))

    def joined(self, other: BM25) -> BM25:
        return BM25(parts=self.parts + other.parts, k1=self.k1, b=self.b)

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every chunk (parts in order) for `query`; zeros where no term matches."""
        n = sum(m.shape[0] for m, _ in self.parts)
        out = [np.zeros(m.shape[0], np.float32) for m, _ in self.parts]
        if n == 0:
            return np.zeros(0, np.float32)
        avg = float(sum(d.sum() for _, d in self.parts) / n) or 1.0
        norms = [self.k1 * (1 - self.b + self.b * d / avg) for _, d in self.parts]
        for col in sorted({term_id(t) for t in tokenize(query)}):
            spans = [(m.indptr[col], m.indptr[col + 1]) for m, _ in self.parts]
            df = sum(int(hi - lo) for lo, hi in spans)
            if df == 0:
                continue
            idf = np.log1p((n - df + 0.5) / (df + 0.5))
            for (m, _), (lo, hi), norm, acc in zip(self.parts, spans, norms, out, strict=True):
                rows, tf = m.indices[lo:hi], m.data[lo:hi]
                acc[rows] += idf * tf * (self.k1 + 1) / (tf + norm[rows])
        return np.concatenate(out)
