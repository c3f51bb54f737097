"""Feedback signals: edit persistence (4-gram survival, reverts), follow-up classification.
(The production reward terms that read them are tested in tests/rewards/test_production.py.)"""

from __future__ import annotations

import pytest

from etude.feedback.signals import (
    AgentEdit,
    classify_followup,
    edit_persistence,
    edit_survival,
    explain_followup,
)

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
