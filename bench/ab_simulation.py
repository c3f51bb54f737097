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

    python bench/ab_simulation.py [--experiments 300] [--mde 0.06] [--looks 20] [--plot PNG] [--quick]

Written through `etude.evals.results.write_result`: `ab_simulation.json` (figures, provenance,
meta) and `ab_simulation.records.jsonl`, one record per simulated experiment (users per arm, lift,
and 0/1 for each rule's rejection and each interval's coverage), from which `bench/verify.py`
recomputes every rate and interval. `--quick` is a smoke run (a few experiments, small grid).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from etude.evals.results import write_result
from etude.experiments.analysis import ABConfig, MetricArrays, analyze, analyze_arrays, sequential_looks
from etude.experiments.power import estimate_user_cv, plan
from etude.provenance import provenance

RULES = {"fixed": "fixed-horizon z, one look", "msprt": "mSPRT, every look", "naive": "z at every look, first p < alpha"}


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


def run_cell(rng: np.random.Generator, n_arm: int, lift: float, reps: int, cfg: ABConfig) -> list[dict]:
    """One record per simulated experiment: each rule's rejection and each interval's coverage (0/1)."""
    out = []
    for i in range(reps):
        arr = simulate_arrays(rng, 2 * n_arm, lift)
        lk = sequential_looks(arr, cfg.looks)
        m = analyze_arrays(arr, cfg, looks=lk)
        out.append({"users": n_arm, "lift": lift, "exp": i, "fixed": int(m["p_value"] < cfg.alpha),
                    "msprt": int(m["msprt_p"] < cfg.alpha), "naive": int(bool((lk.z_p() < cfg.alpha).any())),
                    "ci": int(m["ci_low"] <= lift <= m["ci_high"]),
                    "av_ci": int(m["msprt_ci_low"] <= lift <= m["msprt_ci_high"])})
    return out


def cell_figures(sizes: list[int], lifts: list[float]) -> dict[str, dict]:
    """Per cell: each rule's rejection rate and each interval's coverage, Wilson intervals."""
    return {f"n{n}.lift{lift:g}.{field}": {"kind": "rate", "of": {"users": n, "lift": lift}, "field": field}
            for n in sizes for lift in lifts for field in (*RULES, "ci", "av_ci")}


def _plot(figs: dict[str, dict], sizes: list[int], lifts: list[float], planned: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sizes), figsize=(3.2 * len(sizes), 3.2), sharey=True)
    for ax, n in zip(np.atleast_1d(axes), sizes, strict=True):
        for key, label in (("fixed", "fixed z"), ("msprt", "mSPRT"), ("naive", "naive peeking")):
            ax.plot([lift * 100 for lift in sorted(lifts)], [figs[f"n{n}.lift{lift:g}.{key}"]["rate"] for lift in sorted(lifts)],
                    marker="o", label=label)
        ax.axhline(0.05, color="grey", lw=0.8, ls=":")
        ax.set_title(f"{n} users/arm" + (" (planned)" if n == planned else ""), fontsize=9)
        ax.set_xlabel("true lift (%)")
    np.atleast_1d(axes)[0].set_ylabel("rejection rate")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
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
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 experiments a cell (10 at plan), 2 sizes, "
                    "lifts 0 and the MDE, 5 looks, a 2,000-user pre-period")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ab_simulation.json")
    ap.add_argument("--plot", default=str(Path(__file__).parent / "results" / "ab_simulation.png"),
                    help="the plot (an empty value: none)")
    a = ap.parse_args(argv)
    if a.quick:
        a.experiments, a.experiments_at_plan, a.looks, a.pilot_users = 4, 10, 5, 2000
        a.size_factors, a.lifts = "0.5,1", f"0,{a.mde}"
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
    mde_lift = next((x for x in lifts if math.isclose(x, a.mde)), None)
    if 0.0 not in lifts or mde_lift is None:
        raise SystemExit(f"--lifts must hold 0 (the A/A test) and the MDE {a.mde}")
    sizes = sorted({max(20, round(planned * float(f))) for f in a.size_factors.split(",")} | {planned})
    records: list[dict] = []
    for n in sizes:
        for lift in lifts:
            at_plan = n == planned and lift in (0.0, mde_lift)
            reps = a.experiments_at_plan if at_plan else a.experiments
            cell = run_cell(rng, n, lift, reps, cfg)
            records += cell
            rate = {k: sum(r[k] for r in cell) / reps for k in RULES}
            print(f"n/arm {n:5d} lift {lift:+.2f}: fixed {rate['fixed']:.3f}  mSPRT {rate['msprt']:.3f}  "
                  f"naive {rate['naive']:.3f}  ({reps} exps)", flush=True)
    at = {"users": planned}
    figures = {
        "aa_false_positive_rate_msprt": {"kind": "rate", "of": {**at, "lift": 0.0}, "field": "msprt"},
        "aa_false_positive_rate_fixed": {"kind": "rate", "of": {**at, "lift": 0.0}, "field": "fixed"},
        "aa_false_positive_rate_naive": {"kind": "rate", "of": {**at, "lift": 0.0}, "field": "naive"},
        "power_at_mde_fixed_horizon": {"kind": "rate", "of": {**at, "lift": mde_lift}, "field": "fixed"},
        "power_at_mde_msprt": {"kind": "rate", "of": {**at, "lift": mde_lift}, "field": "msprt"},
        "power_at_mde_naive": {"kind": "rate", "of": {**at, "lift": mde_lift}, "field": "naive"},
        "msprt_over_fixed_power_at_mde": {"kind": "ratio", "num": {**at, "lift": mde_lift},
                                          "den": {**at, "lift": mde_lift}, "field": "msprt", "den_field": "fixed"},
        **cell_figures(sizes, lifts),
    }
    meta = {
        "model": "per-interaction Bernoulli rows; user propensity Beta(3,7); 1+NegBin(1,1/4) interactions per user; "
                 "fair-coin assignment; looks in time order",
        "rules": RULES, "alpha": a.alpha, "looks": a.looks, "user_cv": cv, "plan": p.to_dict(),
        "planned_users_per_arm": planned, "sizes": sizes, "lifts": lifts, "quick": a.quick,
        "experiments": {"per_cell": a.experiments, "at_plan": a.experiments_at_plan},
    }
    prov = provenance(seeds={"simulation": a.seed}, started=t0, argv=["bench/ab_simulation.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(a.out, figures, records, prov, meta=meta)
    figs = doc["figures"]
    if a.plot:
        _plot(figs, sizes, lifts, planned, Path(a.plot))
    for k in ("aa_false_positive_rate_msprt", "power_at_mde_fixed_horizon", "power_at_mde_msprt"):
        print(f"{k}: {figs[k]['rate']:.3f} ({figs[k]['ci_low']:.3f}-{figs[k]['ci_high']:.3f}, n {figs[k]['n']})")
    print(f"msprt_over_fixed_power_at_mde: {figs['msprt_over_fixed_power_at_mde']['value']}")
    print(f"-> {a.out}" + (f", {a.plot}" if a.plot else ""))


if __name__ == "__main__":
    main()
