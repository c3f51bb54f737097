"""Weighted composition of a rubric's terms, plus the flags' effect on the total.

`score` never drops an episode: every trajectory gets a `RewardBreakdown` whatever its stop
reason, broken calls or flags. `total = sum(weight * value)` over terms that apply (value not
None); then each "penalise" flag subtracts `flag_penalty` once per detector, and any "void" flag
clamps the total to at most `void_total` and zeroes correctness. The adjustment is reported as
the term "flags" (weight 1) so the breakdown always adds up to the total.

`score_reply` is the same weighted sum for a single-turn env's reply (etude.envs.families): the
env's rubric reads the reply and what the env measured of it; no diff, so no flags and no "flags" term.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from etude.rewards.config import RewardConfig
from etude.rewards.detectors import detect_hacks
from etude.rewards.rubric import DEFAULT_RUBRIC, Rubric
from etude.rewards.terms import call_term
from etude.types import Flag, Outcome, RewardBreakdown, Task, Trajectory


def _weighted(available: dict[str, Any], config: RewardConfig, rubric: Rubric,
              ) -> tuple[dict[str, float | None], dict[str, float]]:
    """Every term of `rubric` on `available`, and each term's weight (absent from the config: 0)."""
    terms: dict[str, float | None] = {name: call_term(fn, available) for name, fn in rubric.items()}
    return terms, {n: float(config.weights.get(n, 0.0)) for n in terms}


def _total(terms: dict[str, float | None], weights: dict[str, float]) -> float:
    return sum(weights[n] * v for n, v in terms.items() if v is not None)


def _compose(available: dict[str, Any], flags: list[Flag], config: RewardConfig, rubric: Rubric) -> RewardBreakdown:
    terms, weights = _weighted(available, config, rubric)
    voided = any(f.voids for f in flags)
    if voided and terms.get("correctness") is not None:
        terms["correctness"] = 0.0
    total = _total(terms, weights)
    penalised = {f.name for f in flags if not f.voids and config.flag_policy.get(f.name) == "penalise"}
    adjusted = total - config.flag_penalty * len(penalised)
    if voided:
        adjusted = min(adjusted, config.void_total)
    terms["flags"] = adjusted - total
    weights["flags"] = 1.0
    return RewardBreakdown(total=adjusted, terms=terms, weights=weights, flags=tuple(flags))


def score(
    trajectory: Trajectory, task: Task | None, outcome: Outcome | None, config: RewardConfig | None = None,
    *, rubric: Rubric = DEFAULT_RUBRIC,
) -> RewardBreakdown:
    """Every term of `rubric` on one episode; flags from `trajectory.diff`."""
    cfg = config or RewardConfig()
    flags = detect_hacks(trajectory.diff, task, cfg)
    available = {"trajectory": trajectory, "task": task, "outcome": outcome, "config": cfg, "patch": trajectory.diff,
                 "reply": None, "measured": None}
    return _compose(available, flags, cfg, rubric)


def score_patch(
    task: Task | None, patch_text: str, outcome: Outcome | None, config: RewardConfig | None = None,
    *, rubric: Rubric = DEFAULT_RUBRIC,
) -> RewardBreakdown:
    """For `etude grade`: a patch without a trajectory. Trajectory terms are None (do not apply)."""
    cfg = config or RewardConfig()
    flags = detect_hacks(patch_text, task, cfg)
    available = {"trajectory": None, "task": task, "outcome": outcome, "config": cfg, "patch": patch_text,
                 "reply": None, "measured": None}
    return _compose(available, flags, cfg, rubric)


def score_reply(reply: str, measured: Mapping[str, Any], config: RewardConfig, *, rubric: Rubric) -> RewardBreakdown:
    """A single-turn env's reply: every term of `rubric` (the env's) on `reply` and `measured`,
    what the env measured of it (tests passed, what an edit does to the file); total = the
    weighted sum. Episode terms in the rubric do not apply (None)."""
    available = {"trajectory": None, "task": None, "outcome": None, "config": config, "patch": None,
                 "reply": reply, "measured": measured}
    terms, weights = _weighted(available, config, rubric)
    return RewardBreakdown(total=_total(terms, weights), terms=terms, weights=weights, flags=())


def apply_flags(outcome: Outcome, flags: list[Flag] | tuple[Flag, ...]) -> Outcome:
    """The outcome to report: a voiding flag means never `resolved` (nor `partial`)."""
    if not any(f.voids for f in flags):
        return outcome
    return dataclasses.replace(outcome, resolved=False, partial=False)


def breakdown_json(b: RewardBreakdown) -> dict[str, Any]:
    """The `reward` and `flags` members of `etude grade`'s JSON."""
    return {
        "reward": {"total": b.total, "terms": dict(b.terms), "weights": dict(b.weights)},
        "flags": [{"name": f.name, "evidence": f.evidence, "voids": f.voids} for f in b.flags],
    }
