"""False-positive rate and power of the A/B readout (etude.experiments), by simulation.

Users are the randomisation unit and each user contributes several interactions (a user-clustered
ratio metric, read with the delta method): user u has a propensity p_u ~ Beta(3, 7) (mean 0.3),
1 + NegBin(1, 1/4) interactions (mean 4, heavy-tailed), arrives at a uniform time in the window
and spreads its interactions over the rest of it; each interaction succeeds with probability
p_u·(1 + lift) in the treatment arm, p_u in control. Each user is assigned to an arm by a fair
coin, so "users per arm" is the expected count.

The experiment is planned the way `etude ab plan` plans one: the per-user coefficient of variation
is measured on a large simulated pre-period (`estimate_user_cv`), and `etude.experiments.power.plan`
gives the users per arm for a minimum detectable effect (`--mde`, default 6%) at 80% power and
the mSPRT's τ tuned for it. Then, for every lift × users per arm in the grid, `--experiments`
simulated experiments are read by `analyze_arrays` (the function `etude ab analyze` runs per
metric) with `--looks` interim looks, and three rules are scored:
- fixed-horizon z-test: one look at the end (p_value < α);
- mSPRT: the always-valid p-value, peeking at every look (msprt_p < α);
- naive peeking: the z-test at every look, stopping at the first p < α (what mSPRT replaces).
Lift 0 is the A/A test: the rejection rate is the false-positive rate.

    python bench/ab_simulation.py [--experiments 300] [--mde 0.06] [--looks 20] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import numpy as np

from etude.evals.stats import wilson_ci
from etude.experiments.analysis import ABConfig, MetricArrays, analyze, analyze_arrays, sequential_looks
from etude.experiments.power import estimate_user_cv, plan


def _draw(rng: np.random.Generator, users: int, lift: float):
    treat = rng.random(users) < 0.5
    p = rng.beta(3, 7, users)
    k = 1 + rng.negative_binomial(1, 0.25, users)
    arrive = rng.random(users)
    user = np.repeat(np.arange(users), k)
    ts = arrive[user] + (1 - arrive[user]) * rng.random(len(user))
    prob = np.minimum(1.0, p[user] * np.where(treat[user], 1 + lift, 1.0))
    num = (rng.random(len(user)) < prob).astype(float)
    order = np.argsort(ts, kind="stable")
    return user[order], num[order], ts[order], treat


def simulate_arrays(rng: np.random.Generator, users: int, lift: float) -> MetricArrays:
    """One experiment of `users` users (both arms), one row per interaction, in time order."""
    user, num, _, treat = _draw(rng, users, lift)
    return MetricArrays(group=user, num=num, den=np.ones_like(num), group_treat=treat)


def simulate_rows(rng: np.random.Generator, users: int, lift: float, metric: str = "m") -> list[dict]:
    """The same experiment as `etude ab analyze` rows: user_id, arm, metric, numerator, denominator, ts."""
    user, num, ts, treat = _draw(rng, users, lift)
    return [{"user_id": int(u), "arm": "treatment" if treat[u] else "control", "metric": metric,
             "numerator": float(x), "denominator": 1.0, "ts": float(t)} for u, x, t in zip(user, num, ts, strict=True)]


def _rate(k: int, n: int) -> dict:
    low, high = wilson_ci(k, n)
    return {"rate": k / n, "ci_low": low, "ci_high": high, "n": n}


def run_cell(rng: np.random.Generator, n_arm: int, lift: float, reps: int, cfg: ABConfig) -> dict:
    fixed = msprt = naive = covered = av_covered = 0
    for _ in range(reps):
        arr = simulate_arrays(rng, 2 * n_arm, lift)
        lk = sequential_looks(arr, cfg.looks)
        m = analyze_arrays(arr, cfg, looks=lk)
        fixed += m["p_value"] < cfg.alpha
        msprt += m["msprt_p"] < cfg.alpha
        naive += bool((lk.z_p() < cfg.alpha).any())
        covered += m["ci_low"] <= lift <= m["ci_high"]
        av_covered += m["msprt_ci_low"] <= lift <= m["msprt_ci_high"]
    return {"users_per_arm": n_arm, "lift": lift, "fixed_horizon_z": _rate(fixed, reps), "msprt": _rate(msprt, reps),
            "naive_peeking_z": _rate(naive, reps), "fixed_ci_coverage": covered / reps,
            "msprt_interval_coverage": av_covered / reps}


def _plot(cells: list[dict], sizes: list[int], planned: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes), 3.2), sharey=True)
    for ax, n in zip(np.atleast_1d(axes), sizes, strict=True):
        cs = sorted((c for c in cells if c["users_per_arm"] == n), key=lambda c: c["lift"])
        for key, label in (("fixed_horizon_z", "fixed z"), ("msprt", "mSPRT"), ("naive_peeking_z", "naive peeking")):
            ax.plot([c["lift"] * 100 for c in cs], [c[key]["rate"] for c in cs], marker="o", label=label)
        ax.axhline(0.05, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{n} users/arm" + (" (planned)" if n == planned else ""), fontsize=9)
        ax.set_xlabel("true lift (%)")
    np.atleast_1d(axes)[0].set_ylabel("rejection rate")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experiments", type=int, default=300, help="simulated experiments per grid cell")
    ap.add_argument("--experiments-at-plan", type=int, default=1500,
                    help="experiments for the A/A and MDE cells at the planned size (the criteria's cells)")
    ap.add_argument("--mde", type=float, default=0.06)
    ap.add_argument("--power", type=float, default=0.8)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--looks", type=int, default=20)
    ap.add_argument("--lifts", default="0,0.02,0.04,0.06,0.08,0.10")
    ap.add_argument("--size-factors", default="0.25,0.5,1,1.5", help="users per arm as multiples of the planned size")
    ap.add_argument("--pilot-users", type=int, default=20000, help="users of the pre-period that gives user_cv")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ab_simulation.json")
    ap.add_argument("--plot", type=Path, default=Path(__file__).parent / "results" / "ab_simulation.png")
    a = ap.parse_args()
    if a.experiments < 1 or a.experiments_at_plan < 1 or a.looks < 1:
        raise SystemExit("--experiments, --experiments-at-plan and --looks must be >= 1")
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    cv = estimate_user_cv(simulate_rows(rng, a.pilot_users, 0.0), "m")
    p = plan(a.mde, cv, alpha=a.alpha, power=a.power)
    cfg = ABConfig(alpha=a.alpha, mde=a.mde, power=a.power, looks=a.looks)
    planned = p.users_per_arm[0]

    # the row path (`analyze`, what the CLI runs) and the array path agree on one experiment
    seed_state = np.random.default_rng(a.seed + 1)
    rows = simulate_rows(seed_state, 2 * planned, a.mde)
    via_rows = analyze(rows, cfg)["metrics"]["m"]
    via_arrays = analyze_arrays(simulate_arrays(np.random.default_rng(a.seed + 1), 2 * planned, a.mde), cfg)
    assert math.isclose(via_rows["msprt_p"], via_arrays["msprt_p"], rel_tol=1e-9, abs_tol=1e-12)
    assert math.isclose(via_rows["p_value"], via_arrays["p_value"], rel_tol=1e-9, abs_tol=1e-12)

    lifts = [float(x) for x in a.lifts.split(",")]
    sizes = sorted({max(20, round(planned * float(f))) for f in a.size_factors.split(",")} | {planned})
    cells = []
    for n in sizes:
        for lift in lifts:
            at_plan = n == planned and (lift == 0 or math.isclose(lift, a.mde))
            reps = a.experiments_at_plan if at_plan else a.experiments
            cells.append(run_cell(rng, n, lift, reps, cfg))
            c = cells[-1]
            print(f"n/arm {n:5d} lift {lift:+.2f}: fixed {c['fixed_horizon_z']['rate']:.3f}  "
                  f"mSPRT {c['msprt']['rate']:.3f}  naive {c['naive_peeking_z']['rate']:.3f}  ({reps} exps)", flush=True)
    aa = next(c for c in cells if c["users_per_arm"] == planned and c["lift"] == 0)
    at_mde = next(c for c in cells if c["users_per_arm"] == planned and math.isclose(c["lift"], a.mde))
    ratio = at_mde["msprt"]["rate"] / at_mde["fixed_horizon_z"]["rate"] if at_mde["fixed_horizon_z"]["rate"] else None
    res = {
        "machine": platform.platform(), "python": platform.python_version(), "seed": a.seed,
        "model": "per-interaction Bernoulli rows; user propensity Beta(3,7); 1+NegBin(1,1/4) interactions per user; "
                 "fair-coin assignment; looks in time order",
        "alpha": a.alpha, "looks": a.looks, "user_cv": cv, "plan": p.to_dict(),
        "criteria": {
            "aa_false_positive_rate_msprt": aa["msprt"], "aa_fpr_le_alpha": aa["msprt"]["rate"] <= a.alpha,
            "power_at_mde_fixed_horizon": at_mde["fixed_horizon_z"], "power_at_mde_msprt": at_mde["msprt"],
            "msprt_over_fixed_power_at_mde": ratio, "msprt_keeps_half_the_power": ratio is not None and ratio >= 0.5,
        },
        "cells": cells,
        "wall_s": round(time.time() - t0, 1),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    if a.plot:
        _plot(cells, sizes, planned, a.plot)
    print(json.dumps(res["criteria"], indent=2))
    print(f"-> {a.out}" + (f", {a.plot}" if a.plot else ""))


if __name__ == "__main__":
    main()
