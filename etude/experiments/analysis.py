"""A/B readout for ratio metrics randomised per user.

What it computes, per metric (rows are `user_id, arm, metric, numerator, denominator`):
- the ratio Σnumerator/Σdenominator in each arm (users are the randomisation unit, so the
  variance is the per-user delta-method variance of a ratio of means, Deng et al. 2018);
- `delta`, the relative lift treatment/control − 1, with a 95% delta-method interval and a
  two-sided z-test p-value;
- CUPED (θ = cov(Y, X)/var(X) on linearised per-user values) when every row carries
  `pre_numerator, pre_denominator`; the adjusted estimate replaces the raw one and
  `cuped_variance_reduction` says how much it bought;
- `msprt_p`, an always-valid p-value from the normal-mixture sequential probability ratio test
  (mSPRT, Johari et al.): Λ = sqrt(V/(V+τ²))·exp(τ²Δ²/(2V(V+τ²))), p = min(1, 1/Λ) taken as a
  running minimum over looks. With a `ts` column the looks follow time order; without one the
  rows' file order is used. It is valid at any stopping time, so the loop may peek as often as
  it likes. τ = `tau_rel` × the control ratio; with `ABConfig.mde` it is tuned for that minimum
  detectable effect at the planned size (etude.experiments.power). `msprt_ci_low/high` is the
  always-valid interval of the lift (the shifts the mSPRT does not reject, over all looks);
- and for the experiment, `srm_p`: a chi-square test of the user counts per arm against the
  configured weights (sample ratio mismatch means the randomisation or logging is broken and
  no metric should be trusted).

Guardrails (`ABConfig.guardrail_rule`): "sequential" (the default since stop 45) fails a guardrail
only when its always-valid interval, at alpha divided by the number of guardrails, lies wholly past
the margin on the bad side; "noninferiority" fails it whenever the fixed-horizon interval's bad end
reaches past the margin (absence of evidence of no harm), which on a few users per arm fires on noise.

What it does not do: it assumes users are independent and assigned once (sticky); the primary
metric and the guardrails are separate tests (a guardrail rollback and a promotion each happen at
most alpha of the time on A/A traffic, not both together at most alpha).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from etude.errors import EtudeError
from etude.experiments.power import ratio_and_var, tau_rel_for

ARMS = ("control", "treatment")
REQUIRED = ("user_id", "arm", "metric", "numerator", "denominator")


@dataclass(frozen=True)
class Guardrail:
    """A metric that must not get worse by more than `margin` (relative)."""

    metric: str
    higher_is_better: bool = True
    margin: float = 0.05  # non-inferiority margin on the relative lift


@dataclass
class ABConfig:
    alpha: float = 0.05  # two-sided level for intervals, z-test and mSPRT
    weights: tuple[float, float] = (0.5, 0.5)  # expected share of users in control, treatment
    mde: float | None = None  # relative minimum detectable effect the mSPRT is tuned for (etude.experiments.power)
    power: float = 0.8  # fixed-horizon power the experiment is planned for (with mde)
    tau_rel: float | None = None  # mSPRT mixture sd / control ratio; None: tuned for mde (0.1 without an mde)
    looks: int = 20  # number of interim looks the running mSPRT minimum is taken over
    min_look_users: int = 0
    """a burn-in: an interim look counts (mSPRT p, always-valid interval) only once each arm has at
    least this many users. At one to three users an arm the delta-method variance is degenerate,
    and one such look's narrow interval can land far from the estimate (a guardrail's interval of
    [+54%, +73%] around a −34% estimate, bench/results/loop_cycles_measured.json). 0: every look."""
    guardrails: tuple[Guardrail, ...] = field(default_factory=tuple)
    guardrail_rule: str = "sequential"
    """how a guardrail fails. "sequential": only on always-valid evidence of harm past its margin
    (the mSPRT interval at alpha / number of guardrails lies wholly beyond the margin), so over A/A
    traffic a guardrail rollback happens at most alpha of the time, at any stopping point.
    "noninferiority" (the rule before stop 45): whenever the fixed-horizon interval's bad end
    reaches past the margin, which at a few users per arm fires on noise."""

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 0.5:
            raise EtudeError(f"alpha must be in (0, 0.5), got {self.alpha}")
        if self.looks < 1:
            raise EtudeError(f"looks must be >= 1, got {self.looks}")
        if self.min_look_users < 0:
            raise EtudeError(f"min_look_users must be >= 0, got {self.min_look_users}")
        if self.guardrail_rule not in ("sequential", "noninferiority"):
            raise EtudeError(f"guardrail_rule must be sequential or noninferiority, not {self.guardrail_rule!r}")
        if self.tau_rel is not None and not self.tau_rel > 0:
            raise EtudeError(f"tau_rel must be positive, got {self.tau_rel}")
        if self.mde is not None:
            tau_rel_for(self.mde, self.alpha, self.power)  # validates mde and power

    def effective_tau_rel(self) -> float:
        """τ/R of the mSPRT: given, or tuned for `mde` at the planned size, or 0.1 (tuned for a ~10% lift)."""
        if self.tau_rel is not None:
            return self.tau_rel
        if self.mde is not None:
            return tau_rel_for(self.mde, self.alpha, self.power)
        return 0.1


@dataclass(frozen=True)
class UserTotals:
    """Per-user sums for one metric: arrays aligned by user."""

    num: np.ndarray  # [users]
    den: np.ndarray  # [users]
    pre_num: np.ndarray | None = None
    pre_den: np.ndarray | None = None


def load_events(path: Path) -> list[dict[str, Any]]:
    """Read CSV or JSONL rows. Raises EtudeError with the line number on a bad row."""
    if not path.exists():
        raise EtudeError(f"events file not found: {path}")
    text = path.read_text()
    rows: list[dict[str, Any]] = []
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise EtudeError(f"{path}:{i}: not valid JSON ({e.msg})") from None
    else:
        rows = list(csv.DictReader(text.splitlines()))
    return [_check_row(r, path, i) for i, r in enumerate(rows, 1)]


def _check_row(r: dict[str, Any], path: Path, i: int) -> dict[str, Any]:
    missing = [k for k in REQUIRED if r.get(k) in (None, "")]
    if missing:
        raise EtudeError(f"{path}: row {i}: missing {', '.join(missing)}")
    if r["arm"] not in ARMS:
        raise EtudeError(f"{path}: row {i}: arm must be 'control' or 'treatment', got {r['arm']!r}")
    out = dict(r)
    try:
        for k in ("numerator", "denominator", "pre_numerator", "pre_denominator"):
            if r.get(k) not in (None, ""):
                out[k] = float(r[k])
            else:
                out.pop(k, None)
    except (TypeError, ValueError):
        raise EtudeError(f"{path}: row {i}: numerator/denominator must be numbers") from None
    if out["denominator"] < 0:
        raise EtudeError(f"{path}: row {i}: denominator must be non-negative")
    return out


def _linearised(num: np.ndarray, den: np.ndarray, r: float, mu_d: float) -> np.ndarray:
    return (num - r * den) / mu_d


def cuped_ratio(t: UserTotals, theta: float, pre_mean: float) -> tuple[float, float]:
    """CUPED-adjusted ratio and variance for one arm, given a pooled θ and pooled pre-period mean."""
    r, _ = ratio_and_var(t.num, t.den)
    mu_d = t.den.mean()
    y = _linearised(t.num, t.den, r, mu_d)
    x = _pre_linearised(t)
    adj = r - theta * (x.mean() - pre_mean)
    var = float(np.var(y - theta * x, ddof=1) / len(y))
    return float(adj), var


def _pre_linearised(t: UserTotals) -> np.ndarray:
    # The covariate is the user's pre-period ratio contribution, on the same scale as y.
    assert t.pre_num is not None and t.pre_den is not None
    den = t.pre_den.sum()
    r_pre = t.pre_num.sum() / den if den > 0 else 0.0
    mu = t.pre_den.mean() if t.pre_den.mean() > 0 else 1.0
    return (t.pre_num - r_pre * t.pre_den) / mu + r_pre


def _theta(tot: dict[str, UserTotals]) -> tuple[float, float]:
    ys, xs = [], []
    for arm in ARMS:
        t = tot[arm]
        r, _ = ratio_and_var(t.num, t.den)
        ys.append(_linearised(t.num, t.den, r, t.den.mean()))
        xs.append(_pre_linearised(t))
    y, x = np.concatenate(ys), np.concatenate(xs)
    vx = np.var(x, ddof=1)
    theta = float(np.cov(y, x, ddof=1)[0, 1] / vx) if vx > 0 else 0.0
    return theta, float(x.mean())


def relative_lift(c: float, vc: float, t: float, vt: float) -> tuple[float, float]:
    """t/c − 1 and its delta-method variance (arms independent)."""
    lift = t / c - 1.0
    var = (t / c) ** 2 * (vt / (t * t) + vc / (c * c)) if t != 0 else vc / (c * c)
    return lift, var


def msprt_p(diff: float, var: float, tau2: float) -> float:
    """Always-valid p-value of one look: min(1, 1/Λ) for the normal mixture with variance τ²."""
    if not (var > 0) or not math.isfinite(diff):
        return 1.0
    log_lam = 0.5 * math.log(var / (var + tau2)) + tau2 * diff * diff / (2 * var * (var + tau2))
    return float(min(1.0, math.exp(-log_lam)))


def msprt_halfwidth(var: float, tau2: float, alpha: float) -> float:
    """Half-width of the always-valid interval of one look: the shifts Δ0 the mSPRT does not reject,
    |d − Δ0| < sqrt(V(V+τ²)/τ² · (2·log(1/α) + log((V+τ²)/V)))."""
    if not (var > 0):
        return math.inf
    return math.sqrt(var * (var + tau2) / tau2 * (2 * math.log(1 / alpha) + math.log((var + tau2) / var)))


@dataclass(frozen=True)
class MetricArrays:
    """One metric's rows as arrays in look order (`ts`, else file order); `group` indexes the
    (arm, user) pairs, `group_treat` says which pairs are in the treatment arm."""

    group: np.ndarray  # [rows] int
    num: np.ndarray  # [rows]
    den: np.ndarray  # [rows]
    group_treat: np.ndarray  # [groups] bool
    pre_num: np.ndarray | None = None  # [rows]
    pre_den: np.ndarray | None = None

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], metric: str) -> MetricArrays:
        mrows = [r for r in rows if r["metric"] == metric]
        if any("ts" in r for r in mrows):
            mrows = sorted(mrows, key=lambda r: float(r.get("ts", 0)))
        has_pre = bool(mrows) and all("pre_numerator" in r and "pre_denominator" in r for r in mrows)
        index: dict[tuple[str, str], int] = {}
        group = np.array([index.setdefault((r["arm"], str(r["user_id"])), len(index)) for r in mrows], dtype=np.int64)
        treat = np.zeros(len(index), dtype=bool)
        for (arm, _), g in index.items():
            treat[g] = arm == "treatment"
        col = lambda k: np.array([float(r[k]) for r in mrows], dtype=float)  # noqa: E731
        return cls(group, col("numerator"), col("denominator"), treat,
                   col("pre_numerator") if has_pre else None, col("pre_denominator") if has_pre else None)

    def totals(self, upto: int | None = None) -> dict[str, UserTotals]:
        """Per-user sums of the first `upto` rows, per arm (users not seen yet are left out)."""
        g = self.group if upto is None else self.group[:upto]
        k = len(self.group_treat)
        seen = np.bincount(g, minlength=k) > 0
        sums = [np.bincount(g, weights=(x if upto is None else x[:upto]), minlength=k) if x is not None else None
                for x in (self.num, self.den, self.pre_num, self.pre_den)]
        out = {}
        for arm, mask in (("control", seen & ~self.group_treat), ("treatment", seen & self.group_treat)):
            out[arm] = UserTotals(*(s[mask] if s is not None else None for s in sums))
        return out


@dataclass(frozen=True)
class Looks:
    """Per interim look: rows seen, control/treatment ratios and variances (raw, no CUPED)."""

    rows: np.ndarray
    c: np.ndarray
    vc: np.ndarray
    t: np.ndarray
    vt: np.ndarray

    def msprt_p(self, tau_rel: float) -> np.ndarray:
        """mSPRT p-value at each look (τ = tau_rel × that look's control ratio)."""
        return np.array([msprt_p(t - c, vc + vt, _tau2(tau_rel, c)) if math.isfinite(c) and math.isfinite(t) else 1.0
                         for c, vc, t, vt in zip(self.c, self.vc, self.t, self.vt, strict=True)])

    def z_p(self) -> np.ndarray:
        """The fixed-horizon z-test's p-value of the relative lift at each look (valid at one look only)."""
        out = []
        for c, vc, t, vt in zip(self.c, self.vc, self.t, self.vt, strict=True):
            if not (math.isfinite(c) and math.isfinite(t)) or c == 0:
                out.append(1.0)
                continue
            lift, var = relative_lift(c, vc, t, vt)
            out.append(float(2 * stats.norm.sf(abs(lift) / math.sqrt(var))) if var > 0 else float(lift == 0))
        return np.array(out)


def _tau2(tau_rel: float, c: float) -> float:
    return (tau_rel * c) ** 2 if c != 0 else tau_rel**2


def sequential_looks(arr: MetricArrays, looks: int, min_users: int = 0) -> Looks:
    """The interim looks: after each of `looks` equal shares of the rows in look order, those where
    each arm has at least `min_users` users (the last look always counts)."""
    n = len(arr.group)
    cuts = sorted({max(1, round(n * (k + 1) / looks)) for k in range(looks)}) if n else []
    vals = []
    for cut in cuts:
        tot = arr.totals(cut)
        if cut != cuts[-1] and min(len(tot[a].num) for a in ARMS) < min_users:
            continue
        (c, vc), (t, vt) = (ratio_and_var(tot[a].num, tot[a].den) for a in ARMS)
        vals.append((cut, c, vc, t, vt))
    cols = list(zip(*vals, strict=True)) if vals else [[]] * 5
    return Looks(*(np.array(x, dtype=float) for x in cols))


def sequential_msprt_p(rows: list[dict[str, Any]], metric: str, cfg: ABConfig) -> float:
    """Running minimum of the mSPRT p-value over `cfg.looks` interim looks in time order."""
    p = sequential_looks(MetricArrays.from_rows(rows, metric), cfg.looks,
                         cfg.min_look_users).msprt_p(cfg.effective_tau_rel())
    return float(p.min()) if len(p) else 1.0


def always_valid_interval(lk: Looks, tau_rel: float, alpha: float) -> tuple[float, float]:
    """Intersection over the looks of the mSPRT's always-valid intervals of the relative lift
    (each look's interval of t − c divided by that look's control ratio)."""
    low, high = -math.inf, math.inf
    for c, vc, t, vt in zip(lk.c, lk.vc, lk.t, lk.vt, strict=True):
        if not (math.isfinite(c) and math.isfinite(t)) or c <= 0 or not (vc + vt > 0):
            continue
        h = msprt_halfwidth(vc + vt, _tau2(tau_rel, c), alpha)
        low, high = max(low, (t - c - h) / c), min(high, (t - c + h) / c)
    if low > high:  # possible only by chance (the intersection of valid intervals is still valid)
        mid = (low + high) / 2
        low = high = mid
    return low, high


def srm_p(users_per_arm: dict[str, int], weights: tuple[float, float]) -> float:
    """Chi-square p-value of observed user counts per arm against expected weights."""
    obs = np.array([users_per_arm.get(a, 0) for a in ARMS], dtype=float)
    if obs.sum() == 0:
        return 1.0
    w = np.array(weights, dtype=float) / sum(weights)
    return float(stats.chisquare(obs, f_exp=obs.sum() * w).pvalue)


def analyze_metric(rows: list[dict[str, Any]], metric: str, cfg: ABConfig) -> dict[str, Any]:
    """Everything the readout says about one metric."""
    return analyze_arrays(MetricArrays.from_rows(rows, metric), cfg)


def analyze_arrays(arr: MetricArrays, cfg: ABConfig, looks: Looks | None = None) -> dict[str, Any]:
    """`analyze_metric` on one metric's arrays (what bench/ab_simulation.py calls directly)."""
    tot = arr.totals()
    (c, vc), (t, vt) = (ratio_and_var(tot[a].num, tot[a].den) for a in ARMS)
    out: dict[str, Any] = {"users": {a: int(len(tot[a].num)) for a in ARMS}}
    if not (math.isfinite(c) and math.isfinite(t)) or c == 0:
        out.update(control=_num(c), treatment=_num(t), delta=None, ci_low=None, ci_high=None,
                   p_value=None, msprt_p=None, note="not enough users or zero control ratio")
        return out
    raw_var = vc + vt
    cuped = tot["control"].pre_num is not None
    if cuped:
        theta, pre_mean = _theta(tot)
        (c, vc), (t, vt) = (cuped_ratio(tot[a], theta, pre_mean) for a in ARMS)
        out["cuped_theta"] = theta
        out["cuped_variance_reduction"] = float(1 - (vc + vt) / raw_var) if raw_var > 0 else 0.0
    lift, var = relative_lift(c, vc, t, vt)
    z = stats.norm.ppf(1 - cfg.alpha / 2)
    se = math.sqrt(var)
    p = float(2 * stats.norm.sf(abs(lift) / se)) if se > 0 else (0.0 if lift != 0 else 1.0)
    lk = looks if looks is not None else sequential_looks(arr, cfg.looks, cfg.min_look_users)
    tau_rel = cfg.effective_tau_rel()
    mp = lk.msprt_p(tau_rel)
    av_low, av_high = always_valid_interval(lk, tau_rel, cfg.alpha)
    out.update(control=c, treatment=t, delta=lift, ci_low=lift - z * se, ci_high=lift + z * se, p_value=p,
               msprt_p=float(mp.min()) if len(mp) else 1.0, msprt_ci_low=_num(av_low), msprt_ci_high=_num(av_high),
               msprt_tau_rel=tau_rel, looks=int(len(mp)), cuped=cuped)
    return out


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def guardrail_verdict(res: dict[str, Any], g: Guardrail, av: tuple[float, float] | None = None,
                      rule: str = "noninferiority") -> dict[str, Any]:
    """A guardrail's verdict. "noninferiority": ok while the fixed-horizon interval's bad end stays
    within the margin. "sequential": failed only when `av`, the always-valid interval of the lift,
    lies wholly past the margin on the bad side (evidence of harm, not absence of evidence)."""
    if res.get("delta") is None:
        return {"metric": g.metric, "ok": None, "reason": "no estimate", "rule": rule}
    bad_end = -res["ci_low"] if g.higher_is_better else res["ci_high"]
    out = {"metric": g.metric, "margin": g.margin, "worst_plausible_change": float(bad_end),
           "higher_is_better": g.higher_is_better, "rule": rule}
    if rule == "noninferiority":
        return {**out, "ok": bool(bad_end <= g.margin)}
    if av is None or not all(math.isfinite(x) for x in av):
        return {**out, "ok": True, "reason": "no always-valid interval yet: no evidence of harm"}
    best_end = -av[1] if g.higher_is_better else av[0]  # the least harm the interval allows
    return {**out, "ok": bool(best_end <= g.margin), "av_low": float(av[0]), "av_high": float(av[1]),
            "least_plausible_harm": float(best_end)}


def guardrail_interval(rows: list[dict[str, Any]], metric: str, cfg: ABConfig) -> tuple[float, float]:
    """The always-valid interval of `metric`'s lift at alpha / number of guardrails (Bonferroni:
    the chance that any guardrail fires on A/A traffic stays within alpha)."""
    alpha = cfg.alpha / max(1, len(cfg.guardrails))
    lk = sequential_looks(MetricArrays.from_rows(rows, metric), cfg.looks, cfg.min_look_users)
    return always_valid_interval(lk, cfg.effective_tau_rel(), alpha)


def analyze(rows: list[dict[str, Any]], cfg: ABConfig | None = None) -> dict[str, Any]:
    """Readout of a whole experiment: per-metric results, SRM, guardrails."""
    cfg = cfg or ABConfig()
    if not rows:
        raise EtudeError("no events to analyse")
    users = {a: len({str(r["user_id"]) for r in rows if r["arm"] == a}) for a in ARMS}
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    per = {m: analyze_metric(rows, m, cfg) for m in metrics}
    guards = [guardrail_verdict(per[g.metric], g, guardrail_interval(rows, g.metric, cfg)
                                if cfg.guardrail_rule == "sequential" and per[g.metric].get("delta") is not None
                                else None, cfg.guardrail_rule)
              for g in cfg.guardrails if g.metric in per]
    return {
        "alpha": cfg.alpha,
        "users": users,
        "srm_p": srm_p(users, cfg.weights),
        "srm_ok": srm_p(users, cfg.weights) >= 0.001,
        "metrics": per,
        "guardrails": guards,
    }
