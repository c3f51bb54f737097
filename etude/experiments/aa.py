"""A/A checks of a readout: how often would it promote, or roll back on a guardrail, when the two
arms are the same model?

`rerandomised(rows, decide, cfg, splits=200)` takes per-user rows of real traffic (one model, or
both arms pooled), re-deals the users into two arms at the configured weights `splits` times
(seeded), runs the readout and the decision on each, and counts promotions and guardrail
rollbacks. With no true difference either is a false decision; each rate should be at most alpha.
The rows keep their time order (`ts`), so the sequential looks see the traffic as it arrived.

Not guaranteed: that real A/A traffic behaves like a re-randomisation of one window (drift between
windows is not in it); each count is binomial, so a rate of 200 splits has a ±3-point interval at 5%.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from etude.experiments.analysis import ARMS, ABConfig, analyze

Decide = Callable[[dict[str, Any]], tuple[str | None, str]]  # {"ab", "alarms", "rows"} -> (verdict, reason)


def reassign(rows: list[dict[str, Any]], rng: np.random.Generator, weights: tuple[float, float]) -> list[dict[str, Any]]:
    """`rows` with every user dealt afresh into control or treatment (a user keeps one arm)."""
    users = sorted({str(r["user_id"]) for r in rows})
    p = weights[1] / sum(weights)
    arm = {u: ARMS[int(x)] for u, x in zip(users, rng.random(len(users)) < p, strict=True)}
    return [{**r, "arm": arm[str(r["user_id"])]} for r in rows]


def rerandomised(rows: list[dict[str, Any]], decide: Decide, cfg: ABConfig, splits: int = 200,
                 seed: int = 0) -> dict[str, Any]:
    """False promotions and guardrail rollbacks of `decide` over `splits` A/A re-deals of `rows`.
    `decide(readout)` is the loop's rule on {"ab": analyze(...), "alarms": [], "rows": the re-dealt
    rows} (a caller with alarms computes them from "rows" and puts them in before deciding)."""
    rng = np.random.default_rng(seed)
    outcomes: list[dict[str, Any]] = []
    for i in range(splits):
        dealt = reassign(rows, rng, cfg.weights)
        if {r["arm"] for r in dealt} != set(ARMS):
            verdict, reason = None, "one arm got no user"
        else:
            verdict, reason = decide({"ab": analyze(dealt, cfg), "alarms": [], "rows": dealt})
        kind = ("promote" if verdict == "promote" else
                "guardrail" if verdict == "rollback" and reason.startswith("guardrail failed") else
                "alarm" if verdict == "rollback" and reason.startswith("hack alarm") else
                "other_rollback" if verdict == "rollback" else "undecided")
        outcomes.append({"split": i, "outcome": kind, "reason": reason})
    count = Counter(o["outcome"] for o in outcomes)

    def rate(k: int) -> dict[str, Any]:
        ci = stats.binomtest(k, splits).proportion_ci(0.95, method="exact")
        return {"k": k, "n": splits, "rate": k / splits, "ci95": [float(ci.low), float(ci.high)]}

    return {"splits": splits, "alpha": cfg.alpha, "users": len({str(r["user_id"]) for r in rows}),
            "false_promotion": rate(count["promote"]), "false_guardrail_rollback": rate(count["guardrail"]),
            "false_alarm_rollback": rate(count["alarm"]), "other_rollback": rate(count["other_rollback"]),
            "undecided": count["undecided"], "seed": seed, "outcomes": outcomes}
