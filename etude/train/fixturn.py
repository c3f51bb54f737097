"""The fix env's edit turn, at its old address: it lives in etude.envs.fixturn (one env home)."""

from etude.envs.fixturn import REWARDS, drill_cache, edit_reward, edit_turn_prompts, score_edit

__all__ = ["REWARDS", "drill_cache", "edit_reward", "edit_turn_prompts", "score_edit"]
