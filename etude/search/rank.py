"""Hybrid ranking: cosine similarity + normalised BM25 + a pin for symbols named in the query.

score = semantic_weight * cos(query, chunk) + lexical_weight * bm25 / max(bm25) + pin

`pin` (default 1.0, more than the other two terms can differ by) goes to chunks whose symbol,
or its last dotted part, is an identifier written in the query: "where is parse_requirements"
puts `parse_requirements` first even when the embedding prefers something else. So an exact
identifier is never lost. Only identifier-looking words pin (snake_case, camelCase, dotted, or a
one-word query): a plain English word like "copy" in a sentence does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from etude.search.view import DEAD, View

_CODE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass(frozen=True)
class RankConfig:
    """Weights of the hybrid score (tuned on bench/data/semantic_queries.json, see docs/search.md)."""

    semantic_weight: float = 1.0
    lexical_weight: float = 0.3
    pin: float = 1.0  # added for an exact symbol named in the query
    pool: int = 200  # candidates taken from each side before fusing


@dataclass(frozen=True)
class Hit:
    path: str
    start_line: int
    end_line: int
    symbol: str
    kind: str
    score: float
    semantic: float  # cosine similarity
    lexical: float  # BM25, normalised to the best chunk of this query

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def named_identifiers(query: str) -> set[str]:
    """Words of the query that look like code identifiers (see the module docstring)."""
    words = _CODE_WORD.findall(query)
    single = len(query.split()) == 1
    out = set()
    for w in words:
        camel = any(c.isupper() for c in w[1:]) and any(c.islower() for c in w)
        if single or "_" in w or "." in w or camel:
            out.add(w)
            out.add(w.rsplit(".", 1)[-1])
    return out


def rank(query: str, qvec: np.ndarray, view: View, k: int, cfg: RankConfig) -> list[Hit]:
    """The k best chunks of `view` for `query` (whose embedding is `qvec`)."""
    if view.n == 0:
        return []
    cos = view.cosine(qvec)
    lex = view.lexical(query)
    top_lex = float(lex.max()) if lex.size else 0.0
    lex_n = lex / top_lex if top_lex > 0 else lex
    cand = _candidates(cos, lex, cfg.pool)
    names = named_identifiers(query)
    pins = view.rows_named(names) if names else np.zeros(0, np.int64)
    cand = np.union1d(cand, pins) if pins.size else cand
    cand = cand[cos[cand] > DEAD]  # stale rows of edited files never come back
    score = cfg.semantic_weight * cos[cand] + cfg.lexical_weight * lex_n[cand]
    if pins.size:
        score = score + cfg.pin * np.isin(cand, pins)
    order = cand[np.argsort(-score, kind="stable")][:k]
    by_id = dict(zip(cand.tolist(), score.tolist(), strict=True))
    return [Hit(view.paths[i], int(view.starts[i]), int(view.ends[i]), view.symbols[i], view.kinds[i],
                round(by_id[i], 4), round(float(cos[i]), 4), round(float(lex_n[i]), 4)) for i in order.tolist()]


def _candidates(cos: np.ndarray, lex: np.ndarray, pool: int) -> np.ndarray:
    n = cos.shape[0]
    if n <= pool:
        return np.arange(n)
    sem = np.argpartition(-cos, pool - 1)[:pool]
    hits = np.flatnonzero(lex)
    if hits.size > pool:
        hits = hits[np.argpartition(-lex[hits], pool - 1)[:pool]]
    return np.union1d(sem, hits)
