"""Statistics for evaluation runs: pass@k, confidence intervals over tasks, and paired tests for
comparing two runs on the same suite.

Tasks are the unit of analysis (samples of one task are not independent of each other).
- Intervals of a mean: a 0/1 value per task is a proportion and gets a Wilson score interval
  (never zero-width, also at 0/n or n/n); other values get a percentile bootstrap with a fixed
  seed (reproducible; undercovers below ~20 tasks, which is why the gate refuses small suites).
- Paired 0/1 outcomes (the gate's `resolved`): the difference p_B − p_A has Tango's score
  interval (the paired counterpart of Wilson's, Tango 1998); the two-sided difference test is the
  exact McNemar test (binomial on the discordant tasks); non-inferiority with a margin δ
  (H0: p_B − p_A ≤ −δ) is an exact unconditional test: the score statistic's tail probability
  maximised over the nuisance parameter (the loss probability) on a grid under H0's boundary.
- Other paired values: Wilcoxon signed-rank; non-inferiority with a margin (B ≥ A − δ) is a
  one-sided paired t with its power at the margin (`paired_noninferiority`).
- Several comparisons on one held-out set (checkpoints against one base): Holm's step-down
  adjusted p (`holm`).
What this does not guarantee: the maximum over a finite grid can miss the exact supremum by a
little (501 points; the p-value is reported, not hidden); beyond `EXACT_MAX_TASKS` tasks the
non-inferiority p-value is the normal approximation of the same score statistic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n samples of which c are correct (Chen et al. 2021)."""
    if k > n:
        raise ValueError(f"k={k} > n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_ci(
    values: Sequence[float], *, resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
    statistic: str = "mean",
) -> tuple[float, float]:
    """Seeded percentile interval of the mean (or, `statistic="median"`, the median; so a verifier
    recomputes it exactly); (nan, nan) without values, (v, v) for a single one or identical ones.
    With few values a median's interval cannot be narrower than their order statistics allow:
    over 5 repetitions it spans about the 2nd to the 4th."""
    if statistic not in ("mean", "median"):
        raise ValueError(f"statistic must be mean or median, not {statistic!r}")
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1 or np.all(x == x[0]):
        return float(x[0]), float(x[0])
    rng = np.random.default_rng(seed)
    samples = x[rng.integers(0, x.size, size=(resamples, x.size))]
    estimates = samples.mean(axis=1) if statistic == "mean" else np.median(samples, axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(estimates, [tail, 100 - tail])
    return float(low), float(high)


def wilson_ci(k: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n; (0, 1) without observations."""
    if n <= 0:
        return 0.0, 1.0
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - confidence) / 2))
    p = k / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    # The interval always holds p: in floating point centre - half can land a hair above 0 at k = 0
    # (5.6e-17 for 0/3), and an error bar below the mean would then be negative.
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def mean_ci(values: Sequence[float], **kw: float | int) -> dict[str, float | int | None]:
    """{"mean", "ci_low", "ci_high", "n"}; None members when there are no values. All values 0 or
    1: Wilson interval of the proportion; otherwise the percentile bootstrap (`bootstrap_ci`)."""
    x = [float(v) for v in values if v is not None]
    if not x:
        return {"mean": None, "ci_low": None, "ci_high": None, "n": 0}
    if is_binary(x):
        low, high = wilson_ci(sum(x), len(x), float(kw.get("confidence", 0.95)))
    else:
        low, high = bootstrap_ci(x, **kw)  # type: ignore[arg-type]
    return {"mean": float(np.mean(x)), "ci_low": low, "ci_high": high, "n": len(x)}


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 <= q <= 1) by linear interpolation between order statistics (numpy's
    default, Hyndman-Fan type 7; q = 0.5 is the median), in plain Python so that a stored value
    does not move with a library version."""
    x = sorted(float(v) for v in values)
    if not x:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    h = (len(x) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(x) - 1)
    return x[lo] + (h - lo) * (x[hi] - x[lo])


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


def paired_summary(x: Sequence[int], y: Sequence[int]) -> dict[str, Any]:
    """Paired 0/1 outcomes of arm `y` against arm `x` on the same tasks: the change in rate, the
    tasks only `y` and only `x` got right, and the exact McNemar p."""
    return {"tasks": len(x), "gain_points": (sum(y) - sum(x)) / max(1, len(x)),
            "b_only": sum(1 for p, q in zip(x, y, strict=True) if q and not p),
            "a_only": sum(1 for p, q in zip(x, y, strict=True) if p and not q),
            "mcnemar_p": mcnemar_exact(x, y)}


def paired_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, str]:
    """(p-value, test name) for a paired comparison of per-task values."""
    if is_binary(a) and is_binary(b):
        return mcnemar_exact(a, b), "mcnemar-exact"
    return wilcoxon_p([y - x for x, y in zip(a, b, strict=True)]), "wilcoxon"


# -- paired proportions: Tango's score interval and the exact non-inferiority test -------------
EXACT_MAX_TASKS = 300
_GRID = 501


def discordant(a: Sequence[float], b: Sequence[float]) -> tuple[int, int]:
    """(losses, gains): tasks A resolved and B did not, and the reverse."""
    losses = sum(1 for x, y in zip(a, b, strict=True) if x == 1 and y == 0)
    gains = sum(1 for x, y in zip(a, b, strict=True) if x == 0 and y == 1)
    return losses, gains


def _loss_mle(losses: np.ndarray, gains: np.ndarray, n: int, d0: float) -> np.ndarray:
    """Constrained MLE of the loss probability q given p_gain − p_loss = d0 (root of
    2n·q² − B·q − losses·d0·(1 − d0) = 0, B = (losses + gains)(1 − d0) − 2·d0·(n − gains)),
    clipped into the feasible range [max(0, −d0), (1 − d0)/2]."""
    bq = (losses + gains) * (1 - d0) - 2 * d0 * (n - gains)
    disc = np.maximum(bq * bq + 8 * n * losses * d0 * (1 - d0), 0.0)
    q = (bq + np.sqrt(disc)) / (4 * n)
    return np.clip(q, max(0.0, -d0), (1 - d0) / 2)


def tango_score(losses: np.ndarray | int, gains: np.ndarray | int, n: int, d0: float) -> np.ndarray:
    """Score statistic of H: p_B − p_A = d0 for paired 0/1 outcomes (large: B better than d0)."""
    lo, ga = np.asarray(losses, dtype=float), np.asarray(gains, dtype=float)
    q = _loss_mle(lo, ga, n, d0)
    var = (2 * q + d0 - d0 * d0) / n
    diff = (ga - lo) / n - d0
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(var > 0, diff / np.sqrt(np.where(var > 0, var, 1.0)), np.sign(diff) * np.inf)
    return np.where(diff == 0, 0.0, z)


def tango_ci(losses: int, gains: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Score interval of p_B − p_A from the discordant counts of n paired tasks (Tango 1998)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    if n <= 0:
        return -1.0, 1.0
    z = float(norm.ppf(1 - (1 - confidence) / 2))
    est = (gains - losses) / n
    f = lambda d0: float(tango_score(losses, gains, n, d0)) - z  # noqa: E731  decreasing in d0
    g = lambda d0: float(tango_score(losses, gains, n, d0)) + z  # noqa: E731
    eps = 1e-9
    low = -1.0 if f(-1 + eps) <= 0 else brentq(f, -1 + eps, est, xtol=1e-10)
    high = 1.0 if g(1 - eps) >= 0 else brentq(g, est, 1 - eps, xtol=1e-10)
    return float(low), float(high)


def noninferiority_p(losses: int, gains: int, n: int, margin: float) -> float:
    """One-sided p-value of H0: p_B − p_A ≤ −margin (B worse by the margin or more) for paired 0/1
    outcomes: P(score ≥ observed) maximised over the loss probability on H0's boundary (exact
    unconditional; normal approximation beyond EXACT_MAX_TASKS tasks)."""
    from scipy.special import gammaln, xlogy
    from scipy.stats import norm

    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    d0 = -margin
    z_obs = float(tango_score(losses, gains, n, d0))
    if n > EXACT_MAX_TASKS:
        return float(norm.sf(z_obs))
    lo, ga = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = lo + ga <= n
    lo, ga = lo[keep].astype(float), ga[keep].astype(float)
    rest = n - lo - ga
    tail = tango_score(lo, ga, n, d0) >= z_obs - 1e-9
    lo, ga, rest = lo[tail], ga[tail], rest[tail]
    log_coef = gammaln(n + 1) - gammaln(lo + 1) - gammaln(ga + 1) - gammaln(rest + 1)
    # boundary of H0: p_gain = q − margin, q in [margin, (1 + margin)/2]
    qs = np.linspace(margin, (1 + margin) / 2, _GRID)
    best = 0.0
    for q in qs:
        pg, pr = max(q - margin, 0.0), max(1 - 2 * q + margin, 0.0)
        logp = log_coef + xlogy(lo, q) + xlogy(ga, pg) + xlogy(rest, pr)
        best = max(best, float(np.exp(logp).sum()))
    return float(min(1.0, best))


# -- several comparisons on one held-out set, and non-inferiority of continuous paired values ---
def paired_mean_diff(a: Sequence[float], b: Sequence[float], clusters: Sequence[Any] | None = None, *,
                     resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> dict[str, Any]:
    """Paired continuous values (one per unit, e.g. a held-out line's loss under base and adapter):
    the mean of b − a with a seeded percentile bootstrap interval and a two-sided Wilcoxon
    signed-rank p. With `clusters` (a label per unit, e.g. the commit a line came from) units of one
    cluster are not independent: the bootstrap resamples whole clusters and the test runs on the
    clusters' mean differences, so a commit with many lines counts once in the p value."""
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)  # raises on unequal lengths
    n = int(d.size)
    labels = list(range(n)) if clusters is None else list(clusters)
    if len(labels) != n:
        raise ValueError("one cluster label per pair")
    groups: dict[Any, list[int]] = {}
    for i, c in enumerate(labels):
        groups.setdefault(c, []).append(i)
    out: dict[str, Any] = {"n": n, "n_clusters": len(groups), "mean_a": float(np.mean(a)) if n else None,
                           "mean_b": float(np.mean(b)) if n else None, "mean_diff": float(d.mean()) if n else None,
                           "ci_low": None, "ci_high": None, "p": None}
    if n < 2 or len(groups) < 2:
        return out
    idx = list(groups.values())
    sums = np.array([d[g].sum() for g in idx])
    sizes = np.array([len(g) for g in idx], dtype=float)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(idx), size=(resamples, len(idx)))
    means = sums[pick].sum(axis=1) / sizes[pick].sum(axis=1)  # the item mean of each resample
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    out.update(ci_low=float(low), ci_high=float(high), p=wilcoxon_p((sums / sizes).tolist()))
    return out


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, in the order given: with m comparisons on one held-out set
    (several checkpoints against one base), the i-th smallest p becomes max over j ≤ i of
    min(1, (m − j + 1)·p_(j)). Rejecting where the adjusted p < α controls the family-wise error."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def paired_noninferiority(a: Sequence[float], b: Sequence[float], margin: float, *, alpha: float = 0.05,
                          power_target: float = 0.8) -> dict[str, Any]:
    """Is B at least as good as A, less `margin`? Paired values (one per unit, e.g. a held-out
    problem's mean reward under each arm), one-sided paired t-test of H0: mean(b − a) ≤ −margin.

    Returns n, margin, alpha, the mean and sd of the differences, the one-sided (1 − alpha) lower
    bound of the mean difference, p, `noninferior` (p < alpha, i.e. lower bound > −margin), and
    the power this n had to show non-inferiority when B equals A (true difference 0), with the
    observed sd as the planning value, plus the n that power_target needs at that sd. Fewer than
    two units is never non-inferior; zero spread is decided by the mean alone (power then None)."""
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    d = np.asarray(b, dtype=float) - np.asarray(a, dtype=float)  # raises on unequal lengths
    n = int(d.size)
    out: dict[str, Any] = {"test": "paired t, one-sided", "n": n, "margin": float(margin), "alpha": float(alpha),
                           "mean_diff": float(d.mean()) if n else None, "sd_diff": None, "lower_bound": None,
                           "p": None, "noninferior": False, "power_at_margin": None, "n_for_power": None,
                           "power_target": float(power_target)}
    if n < 2:
        return out
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    out["sd_diff"] = sd
    if sd == 0:
        out.update(lower_bound=mean, p=0.0 if mean > -margin else 1.0, noninferior=mean > -margin)
        return out
    se = sd / math.sqrt(n)
    tstat = (mean + margin) / se
    out["lower_bound"] = mean - float(student_t.ppf(1 - alpha, n - 1)) * se
    out["p"] = float(student_t.sf(tstat, n - 1))
    out["noninferior"] = out["p"] < alpha

    def power(k: int) -> float:
        return float(nct.sf(student_t.ppf(1 - alpha, k - 1), k - 1, margin * math.sqrt(k) / sd))

    out["power_at_margin"] = power(n) if margin > 0 else float(alpha)
    if margin > 0:
        hi = 2
        while power(hi) < power_target and hi < 10**7:
            hi *= 2
        lo = max(2, hi // 2)
        while lo < hi:  # smallest k with power(k) >= power_target (power rises with k)
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if power(mid) < power_target else (lo, mid)
        out["n_for_power"] = hi
    return out
