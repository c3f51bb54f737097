"""`RewardConfig`: weights per term, budgets, and what each reward-hack flag does to the reward.

Loadable from a TOML file (a `[rewards]` table, or the whole file) or a plain dict; unknown keys
are an `EtudeError`, so a typo in a config never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from etude.configfile import build, load_with
from etude.errors import EtudeError

FlagAction = Literal["void", "penalise", "ignore"]
Clarification = Literal["penalise", "allow"]


def _default_weights() -> dict[str, float]:
    # Correctness dominates; behaviour terms shape, they never outweigh solving the task.
    return {
        "correctness": 1.0,
        "efficiency": 0.1,
        "parallelism": 0.05,
        "broken_calls": 0.2,
        "repeated_calls": 0.2,  # an identical call made again: a wasted turn users wait through
        "unsupported_claims": 0.3,
        "needless_clarification": 0.3,
        "verbosity": 0.05,
        # A request closed without any edit: off by default (a question about code needs none);
        # on in loops whose traffic asks for changes (configs/loop_behaviour.toml).
        "answer_without_edit": 0.0,
        # Closeness to the reference patch: reported, not counted (agentic RL may weight it).
        "patch_similarity": 0.0,
        # Production terms: None (skipped) unless trajectory.meta["feedback"] carries the signal.
        "edit_persistence": 0.5,
        "followup": 0.5,
        "accept": 0.5,
        "latency": 0.1,
    }


def _default_flag_policy() -> dict[str, FlagAction]:
    # Weaker evidence (time/random patching) only penalises; the rest void the episode.
    return {
        "test_file_edit": "void",
        "conftest_edit": "void",
        "pytest_plugin": "void",
        "sitecustomize": "void",
        "exit_call": "void",
        "skip_marker": "void",
        "eq_always_true": "void",
        "test_special_casing": "void",
        "patched_time_random": "penalise",
        "deleted_assertions": "void",
    }


@dataclass
class RewardConfig:
    """Everything `score` needs besides the episode. Every field has a safe default."""

    weights: dict[str, float] = field(default_factory=_default_weights)
    """term name -> weight; a term absent here (or weighted 0) is computed but does not count."""
    partial_credit: bool = False
    """correctness: unresolved episodes get the fraction of FAIL_TO_PASS passing (only if every
    PASS_TO_PASS still passes) instead of 0."""
    step_budget: int = 30
    """efficiency: turns an episode may take before it costs the whole efficiency term."""
    token_budget: int = 32_000
    """efficiency: prompt + completion tokens."""
    wall_budget_s: float = 600.0
    """efficiency: wall-clock seconds of the episode."""
    efficiency_requires_success: bool = True
    """efficiency applies only to resolved episodes (None without an outcome), so giving up fast
    is never rewarded; production speed is the `latency` term's job."""
    broken_call_penalty: float = 0.25
    """broken_calls: cost of each malformed or failing call (the term is -min(1, n * this))."""
    repeat_call_penalty: float = 0.25
    """repeated_calls: cost of each tool call identical (tool and arguments) to an earlier one of
    the conversation (the term is -min(1, n * this))."""
    clarification: Clarification = "penalise"
    """needless_clarification: "penalise" a question asked instead of acting, unless the task says
    it needs one (task.meta["clarification"] == "needed"); "allow" never penalises."""
    verbosity_budget_words: int = 250
    """verbosity: words in the final answer before it starts to cost."""
    flag_policy: dict[str, FlagAction] = field(default_factory=_default_flag_policy)
    """detector name -> "void" (total clamped to `void_total`, never resolved), "penalise"
    (subtract `flag_penalty` once per detector), or "ignore" (reported only)."""
    flag_penalty: float = 0.5
    void_total: float = -1.0
    """a voided episode's total is min(total, this): a hack can never beat an honest failure."""

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "rewards", *,
                  weights: dict[str, float] | None = None) -> RewardConfig:
        """Fields from a dict; `weights` and `flag_policy` are merged over the defaults. `where` names
        the table in error messages (`env.rewards` in a training config). `weights`: the default
        weights the table's merge over (a single-turn env's rubric); None: the episode rubric's."""
        kw = dict(d)
        for key in ("weights", "flag_policy"):
            if key in kw and not isinstance(kw[key], dict):
                raise EtudeError(f"{where}.{key} must be a table, not {type(kw[key]).__name__} ({kw[key]!r})")
        if "weights" in kw or weights is not None:
            given = kw.get("weights", {})
            bad = {k: v for k, v in given.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
            if bad:
                raise EtudeError(f"{where}.weights values must be numbers, got {bad}")
            base = _default_weights() if weights is None else dict(weights)
            kw["weights"] = {**base, **{k: float(v) for k, v in given.items()}}
        if "flag_policy" in kw:
            bad = {k: v for k, v in kw["flag_policy"].items() if v not in ("void", "penalise", "ignore")}
            if bad:
                raise EtudeError(f"{where}.flag_policy values must be void|penalise|ignore, got {bad}")
            kw["flag_policy"] = {**_default_flag_policy(), **kw["flag_policy"]}
        return build(cls, kw, where)

    @classmethod
    def from_toml(cls, path: str | Path, table: str = "rewards", overrides: dict[str, Any] | None = None) -> RewardConfig:
        """From a TOML file: its `[rewards]` table if present, else the top level."""
        return load_with(cls.from_dict, path, "reward config", table=table, overrides=overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
