"""The fix env's edit turn, at its old address: it lives in etude.envs.fixturn (one env home)."""

from etude.envs.fixturn import FIX_RUBRIC, REWARDS, best_tier, drill_cache, edit_turn_prompts, score_edit

__all__ = ["FIX_RUBRIC", "REWARDS", "best_tier", "drill_cache", "edit_turn_prompts", "score_edit"]
