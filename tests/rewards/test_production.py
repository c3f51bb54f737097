"""Production reward terms: they read trajectory.meta["feedback"], never crash on a malformed
signal, and are part of the default rubric `score` runs."""

from __future__ import annotations

import pytest

from etude.rewards import DEFAULT_RUBRIC, score
from etude.rewards.production import (
    PRODUCTION_TERMS,
    accept_term,
    edit_persistence_term,
    followup_term,
    latency_term,
)
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
    assert latency_term(_traj({"latency_s": 5.0, "latency_budget_s": 10}), None, None) == pytest.approx(-1 / 3)
    assert accept_term(_traj({"accepted": True}), None, None) == 1.0
    assert accept_term(_traj({"accepted": False}), None, None) == -1.0
    for term in (edit_persistence_term, followup_term, latency_term, accept_term):
        assert term(_traj(None), None, None) is None
        # malformed signals do not apply; they never crash scoring
        bad = {"edit_persistence": "lots", "followup": 3, "latency_s": float("nan"), "latency_budget_s": "x",
               "accepted": "yes"}
        assert term(_traj(bad), None, None) is None
    assert latency_term(_traj({"latency_s": "40", "latency_budget_s": 0}), None, None) == pytest.approx(-2 / 3)


def test_latency_never_saturates_and_is_relative_to_the_reference() -> None:
    """Against the production arm's median for the same size: 0 at it, symmetric in the ratio,
    strictly inside (-1, 1) however slow, and still ordering a slow answer against a slower one."""
    lat = lambda s, ref=None: latency_term(_traj({"latency_s": s, "latency_reference_s": ref}), None, None)  # noqa: E731
    assert lat(4.0, 4.0) == 0.0
    assert lat(4.4, 4.0) == pytest.approx(-0.0952, abs=1e-3) and lat(4.0, 4.4) == pytest.approx(0.0952, abs=1e-3)
    assert -1.0 < lat(400.0, 4.0) < lat(40.0, 4.0) < lat(8.0, 4.0) < 0.0 < lat(1.0, 4.0) < 1.0
    # no reference: -lat / (lat + budget), never -1 either
    assert -1.0 < lat(1000.0) < lat(100.0) < lat(30.0) < 0.0


def test_production_terms_plug_into_score() -> None:
    fb = {"edit_persistence": 1.0, "followup_message": "that's wrong", "latency_s": 2.0}
    b = score(_traj(fb), None, None)
    assert b.terms["edit_persistence"] == 1.0 and b.terms["followup"] == -1.0
    assert b.terms["latency"] == pytest.approx(-2 / 22) and b.terms["accept"] is None
    assert b.terms["correctness"] is None
    assert b.total == pytest.approx(sum(b.weights[n] * v for n, v in b.terms.items() if v is not None))


def test_production_terms_are_in_the_default_rubric_by_name() -> None:
    assert dict(PRODUCTION_TERMS).items() <= dict(DEFAULT_RUBRIC).items()
