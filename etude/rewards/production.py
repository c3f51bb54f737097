"""Production reward terms: what real use says about an interaction, read from
`trajectory.meta["feedback"]` (filled by distillation from the store's feedback events).

- `edit_persistence`: 2 * persistence - 1 in [-1, 1]; -1 when the user reverted the edit.
- `followup`: the user's next message, -1 dissatisfied, 0 neutral, +0.5 satisfied.
- `accept`: +1 the user accepted the change this turn belongs to, -1 rejected it.
- `latency`: normalised so it never saturates: -tanh(ln(latency / reference)) in (-1, 1) against
  `latency_reference_s` (distillation puts there the median latency of the production arm for
  requests of the same size), 0 at the reference, about -0.1 at 10% slower, +0.1 at 10% faster;
  without a reference -latency / (latency + budget) in (-1, 0] (half the budget scores -1/3).

Each is None when its signal is absent, so on sandbox episodes they simply do not count.
The signals themselves (edit survival, follow-up rules) are measured by etude.feedback.signals.
"""

from __future__ import annotations

import math

from etude.feedback.signals import classify_followup
from etude.rewards.terms import TermFn
from etude.types import Outcome, Task, Trajectory

FOLLOWUP_REWARD = {"dissatisfied": -1.0, "neutral": 0.0, "satisfied": 0.5}
DEFAULT_LATENCY_BUDGET_S = 20.0
ACCEPT_REWARD = {True: 1.0, False: -1.0}


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


def accept_term(trajectory: Trajectory, task: Task | None, outcome: Outcome | None) -> float | None:
    """+1 accepted, -1 rejected (the user's explicit verdict on the change this turn is part of);
    reads meta["feedback"]["accepted"] (bool). None without a verdict."""
    acc = _feedback(trajectory).get("accepted")
    return ACCEPT_REWARD[acc] if isinstance(acc, bool) else None


def normalised_latency(latency_s: float, reference_s: float) -> float:
    """-tanh(ln(latency / reference)): 0 at the reference, symmetric in the ratio, inside (-1, 1)
    for every finite positive pair (a 10x slower answer scores -0.98, not a flat -1)."""
    ratio = max(latency_s, 1e-6) / max(reference_s, 1e-6)
    return -math.tanh(math.log(ratio))


def latency_term(trajectory: Trajectory, task: Task | None, outcome: Outcome | None) -> float | None:
    """Reads meta["feedback"]["latency_s"], and `latency_reference_s` (the production arm's median
    for requests of the same size) if present: -tanh(ln(latency / reference)); else
    ["latency_budget_s"] (default 20 s): -latency / (latency + budget). Never exactly -1, so
    the term keeps ranking slow answers against slower ones. None without a measured latency."""
    fb = _feedback(trajectory)
    lat, budget, ref = _num(fb.get("latency_s")), _num(fb.get("latency_budget_s")), _num(fb.get("latency_reference_s"))
    if lat is None:
        return None
    lat = max(0.0, lat)
    if ref is not None and ref > 0:
        return normalised_latency(lat, ref)
    budget = budget if budget and budget > 0 else DEFAULT_LATENCY_BUDGET_S
    return -lat / (lat + budget)


PRODUCTION_TERMS: dict[str, TermFn] = {
    "edit_persistence": edit_persistence_term,
    "followup": followup_term,
    "accept": accept_term,
    "latency": latency_term,
}
