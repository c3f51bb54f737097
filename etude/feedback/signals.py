"""Production feedback signals as pure functions.

- `edit_persistence(agent_ranges, later_text)`: how much of what the agent wrote is still in the
  file later — the share of each range's token 4-grams found in the later text, weighted by
  range length. `edit_survival` adds per-range scores and a `reverted` flag: the later text is
  closer to the text the agent replaced than to what the agent wrote.
- `classify_followup(message, previous=None)`: "dissatisfied" | "neutral" | "satisfied" by the
  rule set below (documented in docs/feedback.md); a near-repeat of the previous request is a
  retry, hence dissatisfied.

The reward terms that read these signals from `trajectory.meta["feedback"]` live with the
rewards (etude.rewards.production).

Not guaranteed: tokenisation is lexical (words and punctuation), so a reformatted but equivalent
edit scores lower than it deserves; the follow-up rules are English-only keyword rules.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Literal

N = 4  # n-gram size for survival (as in edit-survival trackers)
_TOKEN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class AgentEdit:
    """One range the agent wrote, and the text it replaced (empty for a pure insertion)."""

    text: str
    replaced: str = ""


@dataclass(frozen=True)
class EditSurvival:
    score: float  # length-weighted share of the agent's 4-grams still present, in [0, 1]
    reverted: bool  # the later text is closer to what was replaced than to what the agent wrote
    per_range: tuple[float, ...] = field(default=())


def _ngrams(text: str, n: int = N) -> Counter[tuple[str, ...]]:
    toks = _TOKEN.findall(text)
    n = min(n, len(toks))  # short ranges: compare as one gram of all their tokens
    if n == 0:
        return Counter()
    return Counter(tuple(toks[i : i + n]) for i in range(len(toks) - n + 1))


def _survival(text: str, later: str) -> float:
    grams = _ngrams(text)
    if not grams:
        return 1.0
    n = len(next(iter(grams)))
    later_grams = _ngrams(later, n)
    return sum(min(c, later_grams[g]) for g, c in grams.items()) / sum(grams.values())


def edit_survival(agent_ranges: Sequence[str | AgentEdit], later_text: str) -> EditSurvival:
    edits = [AgentEdit(r) if isinstance(r, str) else r for r in agent_ranges]
    scores = tuple(_survival(e.text, later_text) for e in edits)
    lengths = [max(1, len(_TOKEN.findall(e.text))) for e in edits]
    total = sum(lengths)
    score = sum(s * n for s, n in zip(scores, lengths, strict=True)) / total if edits else 1.0
    reverted_len = sum(n for e, s, n in zip(edits, scores, lengths, strict=True) if _reverted(e, s, later_text))
    return EditSurvival(score=score, reverted=bool(edits) and reverted_len * 2 > total, per_range=scores)


def _reverted(edit: AgentEdit, survived: float, later: str) -> bool:
    if not edit.replaced.strip():
        return False
    return survived < 0.5 and _survival(edit.replaced, later) > survived


def edit_persistence(agent_ranges: Sequence[str | AgentEdit], later_text: str) -> float:
    """Length-weighted 4-gram survival of the agent's ranges in `later_text`, in [0, 1]
    (1.0 when there is nothing to measure)."""
    return edit_survival(agent_ranges, later_text).score


# --- follow-up classification ------------------------------------------------------------------

FollowupLabel = Literal["dissatisfied", "neutral", "satisfied"]

# Rules, first match wins; dissatisfaction is checked first so "thanks, but it still fails" counts.
DISSATISFIED = (
    r"\bstill\s+(fail\w*|broken|wrong|crash\w*|error\w*|not\b|doesn'?t|does\s+not|isn'?t|the\s+same)",
    r"\b(that'?s|that\s+is|this\s+is|it'?s|you'?re)\s+(wrong|incorrect|not\s+(right|correct|what))",
    r"\b(doesn'?t|does\s+not|didn'?t|did\s+not|won'?t|isn'?t|is\s+not)\s+(work|help|compile|run|fix|pass)",
    r"\bnot\s+(working|what\s+i)\b",
    r"\b(undo|revert|roll\s*back)\b",
    r"\b(you|it)\s+(broke|deleted|removed)\b|\bbroke\s+(it|the|my)\b",
    r"\btry\s+again\b|\bwrong\b|\bno[,.!]\s|^no$|^nope\b|\bstop\b|\bwtf\b|\buseless\b",
)
SATISFIED = (
    r"\b(thanks|thank\s+you|thx|ty)\b",
    r"\b(great|perfect|awesome|excellent|nice|brilliant)\b",
    r"\b(works|worked|working)\s*(now|great|fine|perfectly)?\b",
    r"\blgtm\b|\blooks\s+good\b|\bthat\s+did\s+it\b|\bexactly\b",
)


@dataclass(frozen=True)
class FollowupVerdict:
    label: FollowupLabel
    rule: str  # the pattern (or "retry") that decided; "" for neutral


def explain_followup(message: str, previous: str | None = None) -> FollowupVerdict:
    """The label and the rule that gave it."""
    text = " ".join(message.lower().split())
    if previous and len(text) > 10 and SequenceMatcher(None, text, " ".join(previous.lower().split())).ratio() >= 0.8:
        return FollowupVerdict("dissatisfied", "retry")
    for label, rules in (("dissatisfied", DISSATISFIED), ("satisfied", SATISFIED)):
        for rule in rules:
            if re.search(rule, text):
                return FollowupVerdict(label, rule)  # type: ignore[arg-type]
    return FollowupVerdict("neutral", "")


def classify_followup(message: str, previous: str | None = None) -> FollowupLabel:
    """'dissatisfied' | 'neutral' | 'satisfied' for the user's next message."""
    return explain_followup(message, previous).label
