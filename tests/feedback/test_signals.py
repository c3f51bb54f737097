"""Feedback signals: edit persistence (4-gram survival, reverts), follow-up classification, and
the production reward terms that read trajectory.meta["feedback"]."""

from __future__ import annotations

import pytest

from etude.feedback.signals import (
    AgentEdit,
    classify_followup,
    edit_persistence,
    edit_persistence_term,
    edit_survival,
    explain_followup,
    followup_term,
    latency_term,
)
from etude.rewards import score
from etude.types import Message, Trajectory

AGENT = "def area(r):\n    return math.pi * r ** 2\n"
ORIGINAL = "def area(r):\n    return 3.14 * r * r\n"


def test_untouched_edit_persists_fully_and_a_removed_one_not_at_all() -> None:
    later = "import math\n\n" + AGENT + "\n\ndef other():\n    pass\n"
    assert edit_persistence([AGENT], later) == 1.0
    assert edit_persistence([AGENT], "import math\n\ndef other():\n    pass\n") == 0.0


def test_partial_rewrite_scores_between_and_is_weighted_by_length() -> None:
    later = "def area(r):\n    return math.pi * r * r\n"
    p = edit_persistence([AGENT], later)
    assert 0.2 < p < 0.9
    long_kept = "x = compute(alpha, beta, gamma, delta, epsilon)\n"
    short_lost = "y = 1\n"
    # 14 tokens kept, 3 lost: the long range dominates
    assert edit_persistence([long_kept, short_lost], long_kept) == pytest.approx(14 / 17)
    assert edit_survival([long_kept, short_lost], long_kept).per_range == (1.0, 0.0)


def test_revert_detected_against_the_replaced_text() -> None:
    reverted = edit_survival([AgentEdit(AGENT, replaced=ORIGINAL)], "import math\n" + ORIGINAL)
    assert reverted.reverted and reverted.score < 0.5
    kept = edit_survival([AgentEdit(AGENT, replaced=ORIGINAL)], "import math\n" + AGENT)
    assert not kept.reverted
    deleted = edit_survival([AgentEdit(AGENT, replaced=ORIGINAL)], "import math\n")
    assert not deleted.reverted and deleted.score == 0.0  # gone, but not put back


def test_empty_inputs() -> None:
    assert edit_persistence([], "anything") == 1.0
    assert edit_persistence(["ok"], "ok fine") == 1.0  # shorter than a 4-gram: one gram of all tokens


@pytest.mark.parametrize(
    ("message", "label"),
    [
        ("it still fails with the same error", "dissatisfied"),
        ("that's wrong, the function should return a list", "dissatisfied"),
        ("This doesn't work", "dissatisfied"),
        ("please undo that", "dissatisfied"),
        ("revert the last change", "dissatisfied"),
        ("thanks, but it still fails", "dissatisfied"),
        ("No, I meant the other file", "dissatisfied"),
        ("you broke the build", "dissatisfied"),
        ("thanks!", "satisfied"),
        ("perfect, works now", "satisfied"),
        ("LGTM", "satisfied"),
        ("now add a docstring to parse()", "neutral"),
        ("can you also handle empty input?", "neutral"),
        ("no problem there. next, rename the class", "neutral"),
    ],
)
def test_classify_followup(message: str, label: str) -> None:
    assert classify_followup(message) == label, explain_followup(message)


def test_repeated_request_is_a_retry() -> None:
    prev = "Fix the failing test in test_parser.py"
    assert explain_followup("fix the failing test in test_parser.py!", prev).rule == "retry"
    assert classify_followup("now add type hints to parser.py", prev) == "neutral"


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
