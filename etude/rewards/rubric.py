"""A rubric: the reward terms `score` runs, by name. The caller passes it; nothing registers on
import, so what scored an episode is exactly what the caller handed over.

    from etude.rewards import DEFAULT_RUBRIC, score, with_terms
    score(traj, task, outcome, cfg)                                   # DEFAULT_RUBRIC
    score(traj, task, outcome, cfg, rubric=with_terms(my_term=my_term))  # the defaults plus one

A term counts in the total with its weight in `RewardConfig.weights` (absent = 0: computed and
reported, not counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from etude.rewards.production import PRODUCTION_TERMS
from etude.rewards.terms import BUILTIN_TERMS, TermFn, check_term

Rubric = Mapping[str, TermFn]


def make_rubric(terms: Mapping[str, TermFn]) -> Rubric:
    """A read-only rubric of exactly `terms`, each checked to name only arguments `score` has."""
    for name, fn in terms.items():
        check_term(name, fn)
    return MappingProxyType(dict(terms))


DEFAULT_RUBRIC: Rubric = make_rubric({**BUILTIN_TERMS, **PRODUCTION_TERMS})


def with_terms(base: Rubric = DEFAULT_RUBRIC, **extra: TermFn) -> Rubric:
    """`base` (the default rubric) with `extra` terms added or replaced by name."""
    return make_rubric({**base, **extra})
