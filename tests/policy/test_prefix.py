"""Prefix KV reuse across turns (etude.policy.prefix): the same tokens and log-probs as a full
prefill, the reuse actually happens, and a weight update makes old entries stale."""

from __future__ import annotations

import random

import pytest

from etude.policy.local import LocalPolicy
from etude.policy.prefix import PrefixCache, common_prefix


@pytest.fixture(scope="module")
def pair():
    with_cache = LocalPolicy.from_pretrained("tiny")
    plain = LocalPolicy(with_cache.model, with_cache.tokenizer, prefix_cache_tokens=0)
    return with_cache, plain


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 200) for _ in range(n)]


def test_next_turn_matches_a_full_prefill(pair) -> None:
    cached, plain = pair
    cached.prefix_cache.clear()
    a, b = _prompt(1, 60), _prompt(2, 45)
    first = cached.generate_ids([a, b], max_tokens=8, temperature=0)
    assert len(cached.prefix_cache) == 2 and cached.prefix_cache.hits == 0
    # turn 2 of conversation a (its reply and a tool observation appended) beside a new conversation
    # c that shares a's first 50 tokens (as every episode shares the system prompt)
    a2 = a + list(first[0].token_ids) + _prompt(3, 20)
    c = a[:50] + _prompt(4, 20)
    reused_before = cached.prefix_cache.reused_tokens
    got = cached.generate_ids([a2, c], max_tokens=8, temperature=0)
    want = plain.generate_ids([a2, c], max_tokens=8, temperature=0)
    assert cached.prefix_cache.hits == 1
    assert cached.prefix_cache.reused_tokens > reused_before
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        assert g.prompt_token_ids == w.prompt_token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_a_new_version_drops_old_entries(pair) -> None:
    cached, _ = pair
    cached.prefix_cache.clear()
    p = _prompt(5, 64)
    g = cached.generate_ids([p], max_tokens=4, temperature=0)[0]
    cached.version += 1  # what the trainer does after an in-place update
    hits = cached.prefix_cache.hits
    cached.generate_ids([p + list(g.token_ids) + _prompt(6, 10)], max_tokens=4, temperature=0)
    assert cached.prefix_cache.hits == hits  # nothing stale was reused
    cached.version -= 1


def test_budget_and_supersession() -> None:
    pc = PrefixCache(max_tokens=100)
    pc.put([1, 2, 3], 0, [])
    pc.put([1, 2, 3, 4], 0, [])  # supersedes its own prefix
    assert len(pc) == 1
    pc.put(list(range(98)), 0, [])
    assert pc.tokens() <= 100 and len(pc) == 1  # the older entry went over budget and was dropped
    entry, n = pc.lookup(list(range(50)) + [7], 0)
    assert entry is not None and n == 50
    assert common_prefix([1, 2], [1, 3]) == 1
    assert common_prefix((1, 2, 3), [1, 2, 4]) == 2 and common_prefix(range(5), (0, 1, 2, 3, 4)) == 5  # mixed kinds
