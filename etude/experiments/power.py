"""Planning an A/B experiment: users per arm for a minimum detectable effect, and the mSPRT mixture
variance tuned for that effect.

- **Users per arm.** The primary metric is a ratio metric randomised per user; its per-user
  linearised value (num − R·den)/mean(den) has standard deviation σ, and `user_cv` = σ / R (the
  per-user coefficient of variation, `estimate_user_cv` measures it from logged rows, e.g.
  production's window before the experiment). A relative lift `mde` moves the ratio by mde·R, so
  the standardised effect is mde / user_cv; statsmodels' `NormalIndPower` solves the two-sided
  z-test's sample size at level `alpha` and `power` (unequal arms through the weights).
- **τ² for the mSPRT.** With the normal mixture N(0, τ²), the always-valid test at one look with
  variance V rejects when z² ≥ (1 + 1/r)·(2·log(1/α) + log(1 + r)), r = τ²/V. That threshold is
  smallest at one ratio r* (≈ 8 at α = 0.05, giving |z| ≥ 3.03), so the test is most powerful
  when r = r* at the look that matters. At the planned size the difference's variance is
  V_n = (mde·R / (z_{1−α/2} + z_{power}))², so τ = mde·R·sqrt(r*)/(z_{1−α/2} + z_{power}):
  `tau_rel` = τ/R = mde·sqrt(r*)/(z_{1−α/2} + z_{power}) (≈ 1.01·mde at α = 0.05, power 0.8),
  independent of the metric's noise. The mSPRT stays valid for any τ; this choice only places its
  power where the plan needs it.
- `msprt_power_final_look` is the normal-theory power of the always-valid test at the planned
  size from the last look alone — a lower bound on the sequential test's power (earlier looks only
  add rejections); bench/ab_simulation.py measures the real figure.

Not covered: metrics with many zero-denominator users (the delta method needs mean(den) > 0),
and the loss of power from interim looks on users only partly observed (simulated, not modelled).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize, stats

from etude.errors import EtudeError


@dataclass(frozen=True)
class ABPlan:
    mde: float  # relative minimum detectable effect on the primary metric
    alpha: float
    power: float  # fixed-horizon power at mde
    user_cv: float
    weights: tuple[float, float]
    users_per_arm: tuple[int, int]  # control, treatment
    tau_rel: float  # mSPRT mixture sd as a share of the control ratio
    msprt_r: float  # τ²/V at the planned size
    msprt_z: float  # |z| the always-valid test needs at the planned size
    msprt_power_final_look: float

    @property
    def users(self) -> int:
        return sum(self.users_per_arm)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"users": self.users}


def msprt_threshold_z2(r: float, alpha: float) -> float:
    """z² the normal-mixture mSPRT needs at one look when τ²/V = r."""
    return (1 + 1 / r) * (2 * math.log(1 / alpha) + math.log1p(r))


@lru_cache(maxsize=64)
def best_ratio(alpha: float) -> float:
    """r* = argmin_r of the one-look threshold: τ² = r*·V puts the mSPRT's power at that look."""
    res = optimize.minimize_scalar(lambda lr: msprt_threshold_z2(math.exp(lr), alpha), bounds=(-5.0, 10.0),
                                   method="bounded", options={"xatol": 1e-8})
    return float(math.exp(res.x))


def tau_rel_for(mde: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """τ/R that makes the mSPRT most powerful at the size planned for `mde` (see module doc)."""
    _check(mde, alpha, power)
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    return float(mde * math.sqrt(best_ratio(alpha)) / (za + zb))


def plan(mde: float, user_cv: float, *, alpha: float = 0.05, power: float = 0.8,
         weights: tuple[float, float] = (0.5, 0.5)) -> ABPlan:
    """Users per arm for a two-sided z-test to detect a relative lift `mde` with `power`."""
    from statsmodels.stats.power import NormalIndPower

    _check(mde, alpha, power)
    if not (user_cv > 0 and math.isfinite(user_cv)):
        raise EtudeError(f"user_cv must be a positive number, got {user_cv}")
    if len(weights) != 2 or min(weights) <= 0:
        raise EtudeError(f"weights must be two positive numbers, got {weights}")
    ratio = weights[1] / weights[0]
    with warnings.catch_warnings():  # its root finder's failure is handled below
        warnings.simplefilter("ignore")
        n1 = NormalIndPower().solve_power(effect_size=mde / user_cv, nobs1=None, alpha=alpha, power=power,
                                          ratio=ratio, alternative="two-sided")
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    n1 = float(np.asarray(n1).item())
    if not math.isfinite(n1):  # statsmodels' root finder fails below about one user: the normal formula
        n1 = (za + zb) ** 2 * (1 + 1 / ratio) / (mde / user_cv) ** 2
    n_c = max(2, int(math.ceil(n1)))  # a per-user variance needs two users an arm
    n_t = max(2, int(math.ceil(n_c * ratio)))
    r = best_ratio(alpha)
    z_needed = math.sqrt(msprt_threshold_z2(r, alpha))
    return ABPlan(mde=mde, alpha=alpha, power=power, user_cv=float(user_cv), weights=(float(weights[0]), float(weights[1])),
                  users_per_arm=(n_c, n_t), tau_rel=tau_rel_for(mde, alpha, power), msprt_r=r, msprt_z=z_needed,
                  msprt_power_final_look=float(stats.norm.sf(z_needed - (za + zb))))


def ratio_and_var(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """Ratio of sums and its delta-method variance (per-user i.i.d. pairs)."""
    n = len(num)
    if n < 2 or den.sum() <= 0:
        return (float("nan"), float("nan"))
    r = num.sum() / den.sum()
    mu_d = den.mean()
    # Var(n̄/d̄) ≈ (σ_n² − 2R σ_nd + R² σ_d²) / (n μ_d²)
    cov = np.cov(num, den, ddof=1)
    var = (cov[0, 0] - 2 * r * cov[0, 1] + r * r * cov[1, 1]) / (n * mu_d * mu_d)
    return float(r), float(max(var, 0.0))


def estimate_user_cv(rows: list[dict[str, Any]], metric: str) -> float:
    """Per-user coefficient of variation of `metric` (linearised ratio sd / ratio) from logged rows
    (both arms pooled, or a pre-experiment window): what `plan` needs."""
    acc: dict[str, list[float]] = {}
    for r in rows:
        if r["metric"] == metric:
            s = acc.setdefault(str(r["user_id"]), [0.0, 0.0])
            s[0] += float(r["numerator"])
            s[1] += float(r["denominator"])
    if len(acc) < 2:
        raise EtudeError(f"need rows of at least 2 users for metric {metric!r} to estimate its variance")
    v = np.array(list(acc.values()))
    ratio, var = ratio_and_var(v[:, 0], v[:, 1])
    if not (math.isfinite(ratio) and ratio > 0 and var > 0):
        raise EtudeError(f"metric {metric!r}: ratio {ratio} and variance {var} give no coefficient of variation")
    return float(math.sqrt(var * len(v)) / ratio)


def _check(mde: float, alpha: float, power: float) -> None:
    if not 0 < mde < 10:
        raise EtudeError(f"mde (relative lift) must be in (0, 10), got {mde}")
    if not 0 < alpha < 0.5:
        raise EtudeError(f"alpha must be in (0, 0.5), got {alpha}")
    if not alpha < power < 1:
        raise EtudeError(f"power must be in (alpha, 1), got {power}")
