"""Statistics for evaluation runs: pass@k, bootstrap confidence intervals over tasks, and paired
tests for comparing two runs on the same suite.

Tasks are the unit of resampling (samples of one task are not independent of each other). The
bootstrap is the percentile method with a fixed seed, so a report is reproducible. Paired tests:
exact McNemar (binomial on discordant tasks) for a 0/1 metric, Wilcoxon signed-rank otherwise.
What this does not guarantee: good coverage for very small suites (a handful of tasks gives wide,
honest intervals, but percentile intervals undercover below ~20 tasks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the mean; (nan, nan) without values, (v, v) for a single one."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1 or np.all(x == x[0]):
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def mean_ci(values: Sequence[float], **kw: float | int) -> dict[str, float | int | None]:
    """{"mean", "ci_low", "ci_high", "n"}; None members when there are no values."""
    x = [float(v) for v in values if v is not None]
    if not x:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    low, high = bootstrap_ci(x, **kw)  # type: ignore[arg-type]
    return {"mean": float(np.mean(x)), "ci_low": low, "ci_high": high, "n": len(x)}


def is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def mcnemar_exact(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes."""
    from scipy.stats import binomtest

    worse = sum(1 for x, y in zip(a, b, strict=True) if x == 1 and y == 0)
    better = sum(1 for x, y in zip(a, b, strict=True) if x == 0 and y == 1)
    if worse + better == 0:
        return 1.0
    return float(binomtest(better, worse + better, 0.5).pvalue)


def wilcoxon_p(diffs: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value; 1.0 when every difference is zero."""
    from scipy.stats import wilcoxon

    d = [x for x in diffs if x != 0]
    if not d:
        return 1.0
    return float(wilcoxon(d).pvalue)


def paired_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
    """(p-value, test name) for a paired comparison of per-task values."""
    if is_binary(a) and is_binary(b):
        return mcnemar_exact(a, b), "mcnemar-exact"
    return wilcoxon_p([y - x for x, y in zip(a, b, strict=True)]), "wilcoxon"
