"""Rewards: pure reward terms, their weighted composition, and reward-hack detectors.

    from etude.rewards import RewardConfig, score, detect_hacks, score_patch
    breakdown = score(trajectory, task, outcome, RewardConfig())   # RewardBreakdown (terms + flags)
    flags = detect_hacks(patch_text, task)                         # list[Flag]
    breakdown = score_patch(task, patch_text, outcome)             # for `etude grade`

New terms plug in with `@register_term("name")` (see etude.rewards.terms) and a weight in
`RewardConfig.weights`. See docs/rewards.md.
"""

from etude.rewards.config import RewardConfig
from etude.rewards.detectors import DETECTORS, detect_hacks
from etude.rewards.score import apply_flags, breakdown_json, score, score_patch
from etude.rewards.terms import TERMS, register_term
from etude.types import Flag, RewardBreakdown

__all__ = [
    "DETECTORS",
    "TERMS",
    "Flag",
    "RewardBreakdown",
    "RewardConfig",
    "apply_flags",
    "breakdown_json",
    "detect_hacks",
    "register_term",
    "score",
    "score_patch",
]
