"""Planning a readout that can decide: users per arm from a power calculation, the mSPRT's τ tuned
for the minimum detectable effect, and — by simulation with a fixed seed — A/A false positives
within α while the always-valid test keeps at least half the fixed-horizon power at the plan."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from etude.errors import EtudeError
from etude.experiments.analysis import ABConfig, analyze_arrays, sequential_looks
from etude.experiments.power import best_ratio, estimate_user_cv, msprt_threshold_z2, plan, tau_rel_for

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
from ab_simulation import simulate_arrays, simulate_rows  # noqa: E402


def test_plan_matches_the_normal_sample_size_formula():
    za, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    p = plan(0.06, 0.9)
    expected = 2 * (za + zb) ** 2 * 0.9**2 / 0.06**2  # per arm, equal split
    assert p.users_per_arm[0] == p.users_per_arm[1]
    assert abs(p.users_per_arm[0] - expected) <= 2
    # unequal split: the smaller arm needs more users than half the total of a balanced design
    q = plan(0.06, 0.9, weights=(0.8, 0.2))
    assert q.users_per_arm[1] == pytest.approx(q.users_per_arm[0] / 4, abs=1)
    assert q.users > p.users
    # half the effect needs four times the users
    assert plan(0.03, 0.9).users_per_arm[0] == pytest.approx(4 * p.users_per_arm[0], rel=0.002)


def test_tau_is_where_the_one_look_threshold_is_lowest():
    r = best_ratio(0.05)
    for other in (r / 2, r * 2, 1.0, 50.0):
        assert msprt_threshold_z2(r, 0.05) < msprt_threshold_z2(other, 0.05)
    assert math.sqrt(msprt_threshold_z2(r, 0.05)) == pytest.approx(3.035, abs=0.01)
    za, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    assert tau_rel_for(0.06) == pytest.approx(0.06 * math.sqrt(r) / (za + zb))
    assert ABConfig(mde=0.06).effective_tau_rel() == tau_rel_for(0.06)
    assert ABConfig(mde=0.06, tau_rel=0.3).effective_tau_rel() == 0.3


def test_bad_plans_are_clear_errors():
    with pytest.raises(EtudeError, match="mde"):
        plan(0.0, 1.0)
    with pytest.raises(EtudeError, match="power"):
        plan(0.05, 1.0, power=1.2)
    with pytest.raises(EtudeError, match="user_cv"):
        plan(0.05, -1.0)
    with pytest.raises(EtudeError, match="mde"):
        ABConfig(mde=-0.1)
    with pytest.raises(EtudeError, match="at least 2 users"):
        estimate_user_cv([{"user_id": 1, "metric": "m", "numerator": 1, "denominator": 1}], "m")


def test_user_cv_is_measured_from_clustered_rows():
    rng = np.random.default_rng(0)
    rows = simulate_rows(rng, 4000, 0.0)
    cv = estimate_user_cv(rows, "m")
    # the same figure from the per-user sums directly: sd of (num − R·den)/mean(den), over R
    users = {}
    for r in rows:
        u = users.setdefault(r["user_id"], [0.0, 0.0])
        u[0] += r["numerator"]
        u[1] += r["denominator"]
    v = np.array(list(users.values()))
    ratio = v[:, 0].sum() / v[:, 1].sum()
    lin = (v[:, 0] - ratio * v[:, 1]) / v[:, 1].mean()
    assert cv == pytest.approx(lin.std(ddof=1) / ratio, rel=1e-6)


def test_always_valid_interval_agrees_with_the_msprt_at_one_look():
    rng = np.random.default_rng(5)
    cfg = ABConfig(mde=0.1, looks=1)
    for lift in (0.0, 0.05, 0.1, 0.2, -0.15):
        m = analyze_arrays(simulate_arrays(rng, 3000, lift), cfg)
        excludes_zero = not (m["msprt_ci_low"] <= 0 <= m["msprt_ci_high"])
        assert excludes_zero == (m["msprt_p"] < cfg.alpha), lift
        # wider than the fixed-horizon interval: it is valid at every look
        assert m["msprt_ci_low"] < m["ci_low"] and m["msprt_ci_high"] > m["ci_high"]


def test_at_the_planned_size_fpr_is_bounded_and_half_the_power_is_kept():
    """A 20% MDE keeps the planned size small (a few hundred users per arm) so this runs in
    seconds; bench/ab_simulation.py runs the 6% plan with 1,500 experiments per cell."""
    rng = np.random.default_rng(11)
    cv = estimate_user_cv(simulate_rows(rng, 6000, 0.0), "m")
    p = plan(0.2, cv)
    assert 100 < p.users_per_arm[0] < 1000
    cfg = ABConfig(mde=0.2, looks=20)
    reps = 400
    aa_msprt = aa_naive = fixed = msprt = 0
    for _ in range(reps):
        arr = simulate_arrays(rng, 2 * p.users_per_arm[0], 0.0)
        lk = sequential_looks(arr, cfg.looks)
        aa_msprt += analyze_arrays(arr, cfg, looks=lk)["msprt_p"] < cfg.alpha
        aa_naive += bool((lk.z_p() < cfg.alpha).any())
        m = analyze_arrays(simulate_arrays(rng, 2 * p.users_per_arm[0], 0.2), cfg)
        fixed += m["p_value"] < cfg.alpha
        msprt += m["msprt_p"] < cfg.alpha
    assert aa_msprt / reps <= cfg.alpha
    assert aa_naive / reps > 2 * cfg.alpha  # what peeking with the z-test would have done
    assert 0.7 < fixed / reps < 0.9  # the plan's 80% power, within simulation noise
    assert msprt / fixed >= 0.5


def test_cli_plan_and_analyze_with_mde(tmp_path):
    rng = np.random.default_rng(4)
    rows = simulate_rows(rng, 600, 0.1)
    ev = tmp_path / "events.jsonl"
    ev.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cmd = [sys.executable, "-m", "etude.cli", "ab"]
    p = subprocess.run([*cmd, "plan", "--mde", "0.06", "--events", str(ev), "--metric", "m"], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["users_per_arm"] == list(plan(0.06, estimate_user_cv(rows, "m")).users_per_arm)
    out = tmp_path / "r.json"
    a = subprocess.run([*cmd, "analyze", "--events", str(ev), "--out", str(out), "--mde", "0.06"], capture_output=True,
                       text=True)
    assert a.returncode == 0, a.stderr
    m = json.loads(out.read_text())["metrics"]["m"]
    assert m["msprt_tau_rel"] == pytest.approx(tau_rel_for(0.06)) and m["looks"] == 20
    assert m["msprt_ci_low"] <= m["delta"] <= m["msprt_ci_high"]
    bad = subprocess.run([*cmd, "plan", "--mde", "0.06"], capture_output=True, text=True)
    assert bad.returncode == 2 and "exactly one of --user-cv or --events" in bad.stderr
    assert "Traceback" not in bad.stderr
