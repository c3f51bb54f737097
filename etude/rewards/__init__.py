"""Rewards: pure reward terms, their weighted composition, and reward-hack detectors.

    from etude.rewards import RewardConfig, score, detect_hacks, score_patch
    breakdown = score(trajectory, task, outcome, RewardConfig())   # RewardBreakdown (terms + flags)
    flags = detect_hacks(patch_text, task)                         # list[Flag]
    breakdown = score_patch(task, patch_text, outcome)             # for `etude grade`
    breakdown = score_reply(reply, measured, config, rubric=env_rubric)  # a single-turn env's reply

`score` runs a rubric of terms the caller passes (`DEFAULT_RUBRIC`: the built-in terms and the
production ones); add a term with `score(..., rubric=with_terms(name=fn))` and a weight in
`RewardConfig.weights`. See docs/rewards.md.
"""

from etude.rewards.config import RewardConfig
from etude.rewards.detectors import DETECTORS, detect_hacks
from etude.rewards.rubric import DEFAULT_RUBRIC, Rubric, make_rubric, with_terms
from etude.rewards.score import apply_flags, breakdown_json, score, score_patch, score_reply
from etude.types import Flag, RewardBreakdown

__all__ = [
    "DEFAULT_RUBRIC",
    "DETECTORS",
    "Flag",
    "RewardBreakdown",
    "RewardConfig",
    "Rubric",
    "apply_flags",
    "breakdown_json",
    "detect_hacks",
    "make_rubric",
    "with_terms",
    "score",
    "score_patch",
    "score_reply",
]
