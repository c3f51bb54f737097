"""Weighted composition of a rubric's terms, plus the flags' effect on the total.

`score` never drops an episode: every trajectory gets a `RewardBreakdown` whatever its stop
reason, broken calls or flags. `total = sum(weight * value)` over terms that apply (value not
None); then each "penalise" flag subtracts `flag_penalty` once per detector, and any "void" flag
clamps the total to at most `void_total` and zeroes correctness. The adjustment is reported as
the term "flags" (weight 1) so the breakdown always adds up to the total.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from etude.rewards.config import RewardConfig
from etude.rewards.detectors import detect_hacks
from etude.rewards.rubric import DEFAULT_RUBRIC, Rubric
from etude.rewards.terms import call_term
from etude.types import Flag, Outcome, RewardBreakdown, Task, Trajectory


def _compose(available: dict[str, Any], flags: list[Flag], config: RewardConfig, rubric: Rubric) -> RewardBreakdown:
    terms: dict[str, float | None] = {}
    for name, fn in rubric.items():
        terms[name] = call_term(fn, available)
    weights = {n: float(config.weights.get(n, 0.0)) for n in terms}
    voided = any(f.voids for f in flags)
    if voided and terms.get("correctness") is not None:
        terms["correctness"] = 0.0
    total = sum(weights[n] * v for n, v in terms.items() if v is not None)
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
    available = {"trajectory": trajectory, "task": task, "outcome": outcome, "config": cfg, "patch": trajectory.diff}
    return _compose(available, flags, cfg, rubric)


def score_patch(
    task: Task | None, patch_text: str, outcome: Outcome | None, config: RewardConfig | None = None,
    *, rubric: Rubric = DEFAULT_RUBRIC,
) -> RewardBreakdown:
    """For `etude grade`: a patch without a trajectory. Trajectory terms are None (do not apply)."""
    cfg = config or RewardConfig()
    flags = detect_hacks(patch_text, task, cfg)
    available = {"trajectory": None, "task": task, "outcome": outcome, "config": cfg, "patch": patch_text}
    return _compose(available, flags, cfg, rubric)


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
