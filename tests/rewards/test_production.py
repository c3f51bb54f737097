"""Production reward terms: they read trajectory.meta["feedback"], never crash on a malformed
signal, and are part of the default rubric `score` runs."""

from __future__ import annotations

import pytest

from etude.rewards import DEFAULT_RUBRIC, score
from etude.rewards.production import PRODUCTION_TERMS, edit_persistence_term, followup_term, latency_term
from etude.types import Message, Trajectory


def _traj(feedback: dict | None) -> Trajectory:
    return Trajectory(
        episode_id="e", task_id=None, policy_id="p", policy_version=1, turns=(), stop_reason="answer",
        messages=(Message(role="user", content="hi"), Message(role="assistant", content="Done.")),
        meta={} if feedback is None else {"feedback": feedback},
    )  # fmt: skip


def test_production_terms_read_meta_feedback() -> None:
    assert edit_persistence_term(_traj({"edit_persistence": 0.75}), None, None) == 0.5
    assert edit_persistence_term(_traj({"edit_persistence": 1.0, "reverted": True}), None, None) == -1.0
    assert followup_term(_traj({"followup": "dissatisfied"}), None, None) == -1.0
    assert followup_term(_traj({"followup_message": "thanks, works"}), None, None) == 0.5
    assert latency_term(_traj({"latency_s": 5.0, "latency_budget_s": 10}), None, None) == -0.5
    for term in (edit_persistence_term, followup_term, latency_term):
        assert term(_traj(None), None, None) is None
        # malformed signals do not apply; they never crash scoring
        bad = {"edit_persistence": "lots", "followup": 3, "latency_s": float("nan"), "latency_budget_s": "x"}
        assert term(_traj(bad), None, None) is None
    assert latency_term(_traj({"latency_s": "40", "latency_budget_s": 0}), None, None) == -1.0


def test_production_terms_plug_into_score() -> None:
    fb = {"edit_persistence": 1.0, "followup_message": "that's wrong", "latency_s": 2.0}
    b = score(_traj(fb), None, None)
    assert b.terms["edit_persistence"] == 1.0 and b.terms["followup"] == -1.0 and b.terms["latency"] == -0.1
    assert b.terms["correctness"] is None
    assert b.total == pytest.approx(sum(b.weights[n] * v for n, v in b.terms.items() if v is not None))


def test_production_terms_are_in_the_default_rubric_by_name() -> None:
    assert dict(PRODUCTION_TERMS).items() <= dict(DEFAULT_RUBRIC).items()
