"""`compare(A, B)`: two runs on the same suite, metric by metric, paired by task. The gate.

A is the baseline (the checkpoint in production), B the candidate. For each metric: the per-task
value (mean over samples) in both runs, `delta` = mean(B - A) over tasks where both have a value
(resolved/partial: every task of the suite, a missing or errored episode counting as 0), a
bootstrap interval of that mean difference, and a paired p-value (exact McNemar for 0/1 values,
Wilcoxon signed-rank otherwise).

A gated metric (one with a margin) *regresses* when B is worse than A by more than its margin
and, under the default rule "ci", the whole confidence interval is on the worse side of zero (so
noise on a small suite does not block a release, and a real drop does); under rule "point" the
point estimate alone decides (strict, for tiny suites). `gate_passed` = no gated metric
regresses. What this does not guarantee: control of the family-wise error over many metrics (each
is tested on its own), or anything about tasks outside the suite.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.records import read_records
from etude.evals.stats import bootstrap_ci, paired_test
from etude.evals.summary import EFFICIENCY, getters, task_mean

# metric -> True when higher is better
DIRECTION: dict[str, bool] = {"resolved": True, "partial": True, "adherence": True, "reward": True,
                              **dict.fromkeys(EFFICIENCY, False)}  # fmt: skip
_ZERO_IF_MISSING = {"resolved", "partial"}


def _default_margins() -> dict[str, float]:
    # What the real-time loop must not lose: correctness (any significant drop), adherence, reward
    # and tool-call hygiene. Cost metrics are reported, not gated, by default.
    return {"resolved": 0.0, "adherence": 0.05, "reward": 0.1, "broken_calls": 0.5}


@dataclass
class CompareConfig:
    margins: dict[str, float] = field(default_factory=_default_margins)
    """metric -> largest tolerated worsening (in the metric's units); metrics not here are not gated."""
    rule: str = "ci"
    """"ci": regress only if the interval is entirely worse than 0; "point": the point estimate decides."""
    confidence: float = 0.95
    bootstrap: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rule not in ("ci", "point"):
            raise EtudeError(f"rule must be 'ci' or 'point', not {self.rule!r}")
        unknown = set(self.margins) - set(DIRECTION)
        if unknown:
            raise EtudeError(
                f"unknown metric(s) in margins: {', '.join(sorted(unknown))}; known: {', '.join(DIRECTION)}"
            )


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
        return {**out, "a": None, "b": None, "delta": None, "ci_low": None, "ci_high": None, "p_value": None,
                "test": None, "regression": False, "improvement": False}  # fmt: skip
    diffs = [y - x for x, y in zip(xa, xb, strict=True)]
    delta = sum(diffs) / len(diffs)
    low, high = bootstrap_ci(diffs, resamples=cfg.bootstrap, confidence=cfg.confidence, seed=cfg.seed)
    p, test = paired_test(xa, xb)
    sign = 1 if higher else -1  # worse = -sign * delta
    sure_worse = (sign * high < 0) if higher else (sign * low < 0)
    sure_better = (sign * low > 0) if higher else (sign * high > 0)
    worse_by = -sign * delta
    regression = margin is not None and worse_by > margin and (cfg.rule == "point" or sure_worse)
    return {**out, "a": sum(xa) / len(xa), "b": sum(xb) / len(xb), "delta": delta, "ci_low": low, "ci_high": high,
            "p_value": p, "test": test, "regression": bool(regression), "improvement": bool(sure_better)}  # fmt: skip


def compare(
    run_a: str | Path,
    run_b: str | Path,
    config: CompareConfig | None = None,
    *,
    margins: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Per-metric deltas (B - A) with intervals, paired p-values, regressions and `gate_passed`.
    `margins` (shorthand) replaces the config's margins."""
    cfg = config or CompareConfig()
    if margins is not None:
        cfg = CompareConfig(margins=dict(margins), rule=cfg.rule, confidence=cfg.confidence, bootstrap=cfg.bootstrap,
                            seed=cfg.seed)  # fmt: skip
    ma, ga = load_run(run_a)
    mb, gb = load_run(run_b)
    if ma["suite_sha256"] != mb["suite_sha256"]:
        raise EtudeError(
            f"the runs are on different suites ({ma['suite_sha256']} vs {mb['suite_sha256']}); compare needs the same suite"
        )
    metrics = {m: compare_metric(_values(ga, m), _values(gb, m), m, cfg) for m in DIRECTION}
    regressions = [m for m, r in metrics.items() if r["regression"]]
    return {
        "a": {"dir": str(run_a), "model": ma["model"]},
        "b": {"dir": str(run_b), "model": mb["model"]},
        "suite_sha256": ma["suite_sha256"],
        "tasks": len(ga),
        "rule": cfg.rule,
        "confidence": cfg.confidence,
        "metrics": metrics,
        "regressions": regressions,
        "improvements": [m for m, r in metrics.items() if r["improvement"]],
        "gate_passed": not regressions,
    }
