"""Prefix KV reuse across the turns of a conversation, for `LocalPolicy`.

An agent's turn k+1 prompt is its turn k prompt plus the model's reply and the tools' output.
Without reuse every turn prefills the whole conversation again (an 8-turn episode prefills its
system prompt 8 times); with it a turn prefills only what is new. `PrefixCache` keeps the key and
value tensors of recent sequences (prompt + sampled tokens) and, for a batch of new prompts,
builds one left-padded cache that covers as much of every row as the rows' longest new part
allows: row r keeps `len_r - S` cached tokens, where S is the longest uncached suffix in the
batch, and every row feeds its last S tokens (pads included) to `generate`.

Entries are keyed by the token ids they cover and by the policy version they were computed
under: a weight update (a new version) makes every entry stale, and stale entries are dropped.
The cache holds at most `max_tokens` tokens over all entries, least recently used dropped first.

Not guaranteed: bit-identical logits to a full prefill (attention over cached bf16 keys rounds
differently, ~1e-3 in bf16, ~1e-6 in fp32); reuse when the chat template re-tokenises the
model's reply differently from the sampled ids (then the common prefix ends there, and the rest
is prefilled again — still correct).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MIN_REUSE = 32  # below this many reusable tokens per row a plain prefill is as cheap


@dataclass
class Entry:
    ids: tuple[int, ...]
    version: int
    layers: list[tuple[Any, Any]]  # per layer (keys, values), each [heads, tokens, head_dim]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix. Bisection over slice comparisons (done in C): `lookup` runs
    it against every entry for every prompt of every turn, with prompts of thousands of tokens.
    Slices of a tuple and a list never compare equal, so two different kinds are made tuples
    (`lookup` passes tuples: no copy there)."""
    if type(a) is not type(b):
        a, b = tuple(a), tuple(b)
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    def __init__(self, max_tokens: int = 65536, max_entries: int = 64):
        self.max_tokens = max_tokens
        self.max_entries = max_entries
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._next = 0
        self._lock = threading.Lock()
        self.hits = self.reused_tokens = self.fed_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def tokens(self) -> int:
        return sum(len(e.ids) for e in self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def lookup(self, prompt: Sequence[int], version: int) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `prompt` and that length (at most
        len(prompt) - 1: the last prompt token is always fed, it yields the first logits)."""
        best, best_n = None, 0
        prompt = tuple(prompt)  # once, like the entries' ids (see common_prefix)
        with self._lock:
            for key, e in list(self._entries.items()):
                if e.version != version:
                    del self._entries[key]
                    continue
                n = common_prefix(e.ids, prompt)
                if n > best_n:
                    best, best_n, best_key = e, n, key
            if best is not None:
                self._entries.move_to_end(best_key)
        return best, min(best_n, len(prompt) - 1)

    def put(self, ids: Sequence[int], version: int, layers: list[tuple[Any, Any]]) -> None:
        if not ids or len(ids) > self.max_tokens:
            return
        with self._lock:
            # An entry whose ids are a prefix of the new one is superseded by it.
            for key, e in list(self._entries.items()):
                if len(e.ids) <= len(ids) and tuple(ids[: len(e.ids)]) == e.ids:
                    del self._entries[key]
            self._entries[self._next] = Entry(tuple(ids), version, layers)
            self._next += 1
            while self._entries and (len(self._entries) > self.max_entries or self.tokens() > self.max_tokens):
                self._entries.popitem(last=False)


def batch_cache(config: Any, rows: list[tuple[Entry | None, int]], lengths: list[int], width: int) -> tuple[Any, int]:
    """One left-padded DynamicCache for a batch whose row r has `lengths[r]` prompt tokens, padded
    on the left to `width`, and reusable cache `rows[r] = (entry, n)`. Returns the cache and its
    length C; `generate` then feeds positions C..width-1. None when reuse would not pay."""
    from transformers import DynamicCache

    suffix = max(ln - n for (_, n), ln in zip(rows, lengths, strict=True))
    c = width - suffix
    if c < MIN_REUSE:
        return None, 0
    keep = [max(0, ln - suffix) for ln in lengths]  # cached tokens row r contributes (<= its n)
    ref = next(e for e, _ in rows if e is not None).layers
    cache = DynamicCache(config=config)
    for li, (k0, v0) in enumerate(ref):
        heads, _, dim = k0.shape
        ks = k0.new_zeros((len(rows), heads, c, dim))
        vs = v0.new_zeros((len(rows), heads, c, dim))
        for r, ((e, _), kr) in enumerate(zip(rows, keep, strict=True)):
            if kr:
                k, v = e.layers[li]
                ks[r, :, c - kr:] = k[:, :kr]
                vs[r, :, c - kr:] = v[:, :kr]
        cache.update(ks, vs, li)
    return cache, c


def row_layers(cache: Any, row: int, start: int, stop: int) -> list[tuple[Any, Any]]:
    """Row `row`'s keys and values at positions [start, stop) of a batch cache, copied out."""
    return [(layer.keys[row, :, start:stop].clone(), layer.values[row, :, start:stop].clone())
            for layer in cache.layers]


__all__ = ["MIN_REUSE", "Entry", "PrefixCache", "batch_cache", "common_prefix", "row_layers"]
