"""`compare(A, B)`: two runs on the same suite, metric by metric, paired by task. The gate.

A is the baseline (the checkpoint in production), B the candidate. A suite smaller than
`min_tasks` (default 30) is refused with an error: on a handful of tasks no interval can exclude
harm. For each metric: the per-task value (mean over samples) in both runs, `delta` = mean(B − A)
over tasks where both have a value (resolved/partial: every task of the suite, a missing or errored
episode counting as 0), an interval of that difference and a paired test:
- 0/1 values (resolved with one sample per task): Tango's score interval of p_B − p_A, the exact
  McNemar test (binomial on the discordant tasks) as `p_value`, and `ni_p_value`, the exact
  unconditional non-inferiority test of H0: "B is worse by the margin or more"
  (etude.evals.stats.noninferiority_p);
- other values: a percentile bootstrap interval over tasks and the Wilcoxon signed-rank test.

A gated metric (one with a margin δ, the largest tolerated worsening) gets one verdict:
- **failed** (`regression`): B is worse by more than δ and — rule "ci", the default — the harm
  is significant (0/1 values: exact McNemar p < 1 − confidence with more losses than gains;
  others: the whole interval on the worse side of zero); rule "point": the point estimate alone;
- **passed**: the interval's bad end is within δ (and, for 0/1 values, the exact
  non-inferiority test rejects harm at (1 − confidence)/2);
- **inconclusive** otherwise: the suite cannot exclude harm, and the gate does not pass;
- **no baseline**: production has no value on any task of the suite (a metric of edits, such as
  adherence, when production's model made no edit), so there is nothing the candidate could lose
  on it; reported, it neither passes nor blocks the gate (the other metrics decide). A candidate
  with no value where production has one stays inconclusive.
`gate` is "failed" if any gated metric failed, else "inconclusive" if any is, else "passed";
`gate_passed` = (gate == "passed"). What this does not guarantee: control of the family-wise
error over many metrics (each is tested on its own), or anything about tasks outside the suite.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.records import read_records
from etude.evals.stats import bootstrap_ci, discordant, is_binary, noninferiority_p, paired_test, tango_ci
from etude.evals.summary import EFFICIENCY, getters, task_mean
from etude.tasks import seal

# metric -> True when higher is better
DIRECTION: dict[str, bool] = {"resolved": True, "partial": True, "adherence": True, "reward": True,
                              **dict.fromkeys(EFFICIENCY, False)}  # fmt: skip
_ZERO_IF_MISSING = {"resolved", "partial"}


def _default_margins() -> dict[str, float]:
    # What the real-time loop must not lose: correctness (more than 5 points of resolved rate, the
    # non-inferiority margin), adherence, reward and tool-call hygiene. Cost metrics are reported,
    # not gated, by default.
    return {"resolved": 0.05, "adherence": 0.05, "reward": 0.1, "broken_calls": 0.5}


MIN_TASKS = 30


@dataclass
class CompareConfig:
    margins: dict[str, float] = field(default_factory=_default_margins)
    """metric -> largest tolerated worsening (in the metric's units); metrics not here are not gated."""
    rule: str = "ci"
    """"ci": fail only on significant harm; "point": fail when the point estimate is worse than the
    margin. Either way a pass needs the interval's bad end within the margin."""
    confidence: float = 0.95
    bootstrap: int = 2000
    seed: int = 0
    min_tasks: int = MIN_TASKS
    """suites with fewer tasks are refused (an error): they cannot exclude harm."""

    def __post_init__(self) -> None:
        if self.rule not in ("ci", "point"):
            raise EtudeError(f"rule must be 'ci' or 'point', not {self.rule!r}")
        unknown = set(self.margins) - set(DIRECTION)
        if unknown:
            raise EtudeError(
                f"unknown metric(s) in margins: {', '.join(sorted(unknown))}; known: {', '.join(DIRECTION)}"
            )
        negative = [m for m, v in self.margins.items() if not v >= 0]
        if negative:
            raise EtudeError(f"margins must be >= 0 (the tolerated worsening): {', '.join(sorted(negative))}")
        if self.min_tasks < 1:
            raise EtudeError(f"min_tasks must be >= 1, got {self.min_tasks}")
        if not 0.5 <= self.confidence < 1:
            raise EtudeError(f"confidence must be in [0.5, 1), not {self.confidence}")


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(run.json, records grouped by instance id) of an `etude eval` output folder."""
    d = Path(run_dir)
    manifest_path = d / "run.json"
    if not manifest_path.is_file():
        raise EtudeError(f"{d} is not an etude eval output folder (no run.json)")
    manifest = json.loads(manifest_path.read_text())
    groups: dict[str, list[dict[str, Any]]] = {i: [] for i in manifest["instance_ids"]}
    for rec in read_records(d / "results.jsonl").values():
        if rec["instance_id"] in groups:
            groups[rec["instance_id"]].append(rec)
    return manifest, groups


def _values(groups: dict[str, list[dict[str, Any]]], metric: str) -> dict[str, float | None]:
    get = getters()[metric]
    missing = 0.0 if metric in _ZERO_IF_MISSING else None
    return {i: (task_mean(rs, get) if rs else missing) for i, rs in groups.items()}


def compare_metric(
    a: dict[str, float | None], b: dict[str, float | None], metric: str, cfg: CompareConfig
) -> dict[str, Any]:
    ids = [i for i in a if a[i] is not None and b.get(i) is not None]
    xa, xb = [float(a[i]) for i in ids], [float(b[i]) for i in ids]  # type: ignore[arg-type]
    higher, margin = DIRECTION[metric], cfg.margins.get(metric)
    out: dict[str, Any] = {"n": len(ids), "higher_is_better": higher, "margin": margin, "gated": margin is not None}
    if not ids:
        # No task has a value in both runs. A metric that production never had a value for (adherence
        # when production's model makes no edit at all, e.g. the embedded default before its warm
        # start) has nothing the candidate could lose: "no baseline", reported, not blocking. When
        # production has values and the candidate none where it does, the harm cannot be excluded.
        has_a = any(v is not None for v in a.values())
        verdict = "not gated" if margin is None else "inconclusive" if has_a else "no baseline"
        return {**out, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None, "interval": None,
                "p_value": None, "test": None, "ni_p_value": None, "verdict": verdict, "regression": False,
                "improvement": False}  # fmt: skip
    diffs = [y - x for x, y in zip(xa, xb, strict=True)]
    delta = sum(diffs) / len(diffs)
    p, test = paired_test(xa, xb)
    alpha = 1 - cfg.confidence
    sign = 1 if higher else -1  # a gain = sign * delta
    ni_p = None
    if is_binary(xa) and is_binary(xb):
        losses, gains = discordant(xa, xb)  # losses: A 1, B 0 (B worse when higher is better)
        low, high = tango_ci(losses, gains, len(ids), cfg.confidence)
        interval = "tango-score"
        worse_n, better_n = (losses, gains) if higher else (gains, losses)
        sure_worse = p < alpha and worse_n > better_n
        sure_better = p < alpha and better_n > worse_n
        if margin is not None and margin < 1:
            ni_p = noninferiority_p(worse_n, better_n, len(ids), margin)
    else:
        low, high = bootstrap_ci(diffs, resamples=cfg.bootstrap, confidence=cfg.confidence, seed=cfg.seed)
        interval = "bootstrap"
        sure_worse = sign * (high if higher else low) < 0
        sure_better = sign * (low if higher else high) > 0
    worst_gain = sign * (low if higher else high)  # the interval's bad end, as a gain
    worse_by = -sign * delta
    regression = margin is not None and worse_by > margin and (cfg.rule == "point" or sure_worse)
    if margin is None:
        verdict = "not gated"
    elif regression:
        verdict = "failed"
    elif worst_gain > -margin and (ni_p is None or ni_p < alpha / 2):
        verdict = "passed"
    else:
        verdict = "inconclusive"
    return {**out, "a": sum(xa) / len(xa), "b": sum(xb) / len(xb), "delta": delta, "ci_low": low, "ci_high": high,
            "interval": interval, "p_value": p, "test": test, "ni_p_value": ni_p, "verdict": verdict,
            "regression": bool(regression), "improvement": bool(sure_better)}  # fmt: skip


def compare(
    run_a: str | Path,
    run_b: str | Path,
    config: CompareConfig | None = None,
    *,
    margins: dict[str, float] | None = None,
    use: str = "gate",
) -> dict[str, Any]:
    """Per-metric deltas (B - A) with intervals, paired p-values, regressions and `gate_passed`.
    `margins` (shorthand) replaces the config's margins. `use` is "gate" (a release or selection
    decision: runs that read the sealed test split are refused, etude.tasks.seal) or "final" (the
    final figure of a run, read once)."""
    cfg = config or CompareConfig()
    if margins is not None:
        cfg = CompareConfig(margins=dict(margins), rule=cfg.rule, confidence=cfg.confidence, bootstrap=cfg.bootstrap,
                            seed=cfg.seed, min_tasks=cfg.min_tasks)  # fmt: skip
    ma, ga = load_run(run_a)
    mb, gb = load_run(run_b)
    if use not in ("gate", "final"):
        raise ValueError(f"use must be gate or final, not {use!r}")
    sealed = sorted(set(ma.get("sealed_read") or ()) | set(mb.get("sealed_read") or ()))
    if use == "gate" and sealed and not seal.override_active():
        raise EtudeError(f"{run_a} / {run_b} read the sealed test split ({', '.join(sealed)}): a gate cannot decide "
                         "on it; it is read once, for final figures (etude eval compare --final)")
    if ma["suite_sha256"] != mb["suite_sha256"]:
        raise EtudeError(
            f"the runs are on different suites ({ma['suite_sha256']} vs {mb['suite_sha256']}); compare needs the same suite"
        )
    if len(ga) < cfg.min_tasks:
        raise EtudeError(f"the eval gate needs at least {cfg.min_tasks} tasks and the suite has {len(ga)}: "
                         f"a suite this small cannot exclude harm (lower min_tasks explicitly to run it anyway)")
    metrics = {m: compare_metric(_values(ga, m), _values(gb, m), m, cfg) for m in DIRECTION}
    regressions = [m for m, r in metrics.items() if r["regression"]]
    inconclusive = [m for m, r in metrics.items() if r["verdict"] == "inconclusive"]
    gate = "failed" if regressions else "inconclusive" if inconclusive else "passed"
    return {
        "a": {"dir": str(run_a), "model": ma["model"]},
        "b": {"dir": str(run_b), "model": mb["model"]},
        "suite_sha256": ma["suite_sha256"],
        "tasks": len(ga),
        "use": use,
        "sealed_read": sealed,
        "contaminated": bool(sealed) and use == "gate",
        "min_tasks": cfg.min_tasks,
        "rule": cfg.rule,
        "confidence": cfg.confidence,
        "metrics": metrics,
        "regressions": regressions,
        "inconclusive": inconclusive,
        "improvements": [m for m, r in metrics.items() if r["improvement"]],
        "gate": gate,
        "gate_passed": gate == "passed",
    }
