"""The optional model for follow-up classification: nearest labelled prototype by embedding.

The documented rules (`etude.feedback.signals.explain_followup`) decide first; the model only
labels messages the rules call neutral (no rule matched), which is where keyword rules miss
paraphrases ("ugh, the output is garbage", "nope, same traceback as before"). A message gets
the label of its most similar prototype when that similarity beats the best prototype of every
other label by `margin`, else "neutral".

```python
clf = EmbeddingFollowupClassifier("minilm")        # any etude.search embedder spec
label, source = classify(message, previous, model=clf)   # source "rules" or "model:minilm"
```

Not guaranteed: the prototypes are a small hand-written English set; the model is an
embedding similarity, not a trained classifier, and its labels are marked as such
(`label_source = "model:<spec>"`) so analyses can keep or drop them.
"""

from __future__ import annotations

from typing import Any

from etude.feedback.signals import explain_followup
from etude.search import get_embedder

PROTOTYPES: dict[str, tuple[str, ...]] = {
    "dissatisfied": (
        "this is garbage", "that did not work at all", "same error as before", "you made it worse",
        "the tests are still red", "why did you change that file", "this is not what I asked for",
        "now nothing compiles", "ugh, it crashes again", "please put it back the way it was",
    ),
    "satisfied": (
        "that works, thank you", "all tests pass now", "great job", "exactly what I needed",
        "looks good to me, merging", "perfect, that fixed it",
    ),
    "neutral": (
        "now add a test for it", "can you also update the README", "what does this function do",
        "next, rename the module", "let's move on to the parser", "show me the diff",
    ),
}


class EmbeddingFollowupClassifier:
    def __init__(self, embedder: str = "minilm", margin: float = 0.05):
        self.spec, self.margin = embedder, margin
        self.embedder = get_embedder(embedder)
        self.labels = [label for label, texts in PROTOTYPES.items() for _ in texts]
        self.vectors = self.embedder.embed([t for texts in PROTOTYPES.values() for t in texts])

    def classify(self, message: str) -> tuple[str, float]:
        """(label, similarity of the winning prototype)."""
        sims = self.vectors @ self.embedder.embed([message], query=True)[0]
        best: dict[str, float] = {}
        for label, sim in zip(self.labels, sims.tolist(), strict=True):
            best[label] = max(best.get(label, -1.0), sim)
        ranked = sorted(best.items(), key=lambda kv: -kv[1])
        (top, s1), (_, s2) = ranked[0], ranked[1]
        return (top if s1 - s2 >= self.margin else "neutral"), s1


def classify(message: str, previous: str | None = None, model: Any = None) -> tuple[str, str]:
    """(label, source): the rules' verdict if a rule matched, else the model's (if given)."""
    verdict = explain_followup(message, previous)
    if verdict.label != "neutral" or verdict.rule or model is None:
        return verdict.label, "rules"
    label, _ = model.classify(message)
    return label, f"model:{model.spec}"
