"""Production reward terms: what real use says about an interaction, read from
`trajectory.meta["feedback"]` (filled by distillation from the store's feedback events).

- `edit_persistence`: 2 * persistence - 1 in [-1, 1]; -1 when the user reverted the edit.
- `followup`: the user's next message, -1 dissatisfied, 0 neutral, +0.5 satisfied.
- `latency`: -min(1, latency / budget).

Each is None when its signal is absent, so on sandbox episodes they simply do not count.
The signals themselves (edit survival, follow-up rules) are measured by etude.feedback.signals.
"""

from __future__ import annotations

from etude.feedback.signals import classify_followup
from etude.rewards.terms import TermFn
from etude.types import Outcome, Task, Trajectory

FOLLOWUP_REWARD = {"dissatisfied": -1.0, "neutral": 0.0, "satisfied": 0.5}
DEFAULT_LATENCY_BUDGET_S = 20.0


def _feedback(trajectory: Trajectory) -> dict:
    fb = trajectory.meta.get("feedback")
    return fb if isinstance(fb, dict) else {}


def _num(value: object) -> float | None:
    """A finite float, or None for anything else (a malformed signal does not apply; it never
    crashes scoring)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        x = float(value)
    except ValueError:
        return None
    return x if x == x and abs(x) != float("inf") else None


def edit_persistence_term(trajectory: Trajectory, task: Task | None, outcome: Outcome | None) -> float | None:
    """2 * persistence - 1 in [-1, 1]; -1 if the edit was reverted; None if not measured.
    Reads meta["feedback"]["edit_persistence"] (float) and optional ["reverted"] (bool)."""
    fb = _feedback(trajectory)
    if fb.get("reverted"):
        return -1.0
    p = _num(fb.get("edit_persistence"))
    return None if p is None else 2.0 * min(1.0, max(0.0, p)) - 1.0


def followup_term(trajectory: Trajectory, task: Task | None, outcome: Outcome | None) -> float | None:
    """-1 dissatisfied, 0 neutral, +0.5 satisfied (praise is cheaper than complaint, so it counts
    less). Reads meta["feedback"]["followup"] (a label) or ["followup_message"] (classified here)."""
    fb = _feedback(trajectory)
    label = fb.get("followup")
    if label is None and isinstance(fb.get("followup_message"), str):
        prev = fb.get("previous_request")
        label = classify_followup(fb["followup_message"], prev if isinstance(prev, str) else None)
    return FOLLOWUP_REWARD.get(label) if isinstance(label, str) else None


def latency_term(trajectory: Trajectory, task: Task | None, outcome: Outcome | None) -> float | None:
    """-min(1, latency / budget); reads meta["feedback"]["latency_s"] and optional
    ["latency_budget_s"] (default 20 s). None without a measured latency."""
    fb = _feedback(trajectory)
    lat, budget = _num(fb.get("latency_s")), _num(fb.get("latency_budget_s"))
    if lat is None:
        return None
    budget = budget if budget and budget > 0 else DEFAULT_LATENCY_BUDGET_S
    return -min(1.0, max(0.0, lat) / budget)


PRODUCTION_TERMS: dict[str, TermFn] = {
    "edit_persistence": edit_persistence_term,
    "followup": followup_term,
    "latency": latency_term,
}
