"""The A/B readout: known answers, simulated error rates, bad input, the CLI."""

import json
import math
import random
import subprocess
import sys

import numpy as np
import pytest

from etude.errors import EtudeError
from etude.experiments.analysis import (
    ABConfig,
    Guardrail,
    MetricArrays,
    analyze,
    analyze_arrays,
    load_events,
    msprt_p,
    ratio_and_var,
    sequential_looks,
    srm_p,
)

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2] / "bench"))
from ab_simulation import simulate_arrays, simulate_rows  # noqa: E402


def test_ratio_delta_method_matches_bootstrap():
    rng = np.random.default_rng(1)
    den = rng.poisson(5, 3000).astype(float) + 1
    num = rng.binomial(den.astype(int), 0.3).astype(float)
    r, var = ratio_and_var(num, den)
    boots = []
    for _ in range(400):
        i = rng.integers(0, len(num), len(num))
        boots.append(num[i].sum() / den[i].sum())
    assert r == pytest.approx(num.sum() / den.sum())
    assert math.sqrt(var) == pytest.approx(np.std(boots), rel=0.15)


def test_known_lift_is_estimated_and_cuped_reduces_variance():
    rng = np.random.default_rng(2)
    rows = []
    for u in range(3000):
        arm = "treatment" if u % 2 else "control"
        base = rng.beta(3, 7)
        d, pd_ = int(rng.poisson(6)) + 1, int(rng.poisson(6)) + 1
        rows.append({"user_id": u, "arm": arm, "metric": "kept",
                     "numerator": rng.binomial(d, min(1, base * (1.2 if arm == "treatment" else 1))), "denominator": d,
                     "pre_numerator": rng.binomial(pd_, base), "pre_denominator": pd_})
    res = analyze(rows)["metrics"]["kept"]
    assert res["cuped"] is True
    assert res["cuped_variance_reduction"] > 0.1
    assert res["ci_low"] < 0.2 < res["ci_high"]
    assert res["ci_low"] > 0  # a 20% lift with 3,000 users is detected
    assert res["p_value"] < 0.01


def test_msprt_is_conservative_compared_with_z():
    # For the same evidence the always-valid p-value is never below the fixed-horizon one.
    from scipy import stats

    for z in (0.5, 1.96, 3.0, 5.0):
        var = 0.01
        diff = z * math.sqrt(var)
        assert msprt_p(diff, var, tau2=0.01) >= 2 * stats.norm.sf(z) - 1e-12
    assert msprt_p(0.0, 0.01, 0.01) == 1.0


def test_srm_detects_mismatch():
    assert srm_p({"control": 500, "treatment": 500}, (0.5, 0.5)) > 0.5
    assert srm_p({"control": 560, "treatment": 440}, (0.5, 0.5)) < 0.001
    assert srm_p({"control": 900, "treatment": 100}, (0.9, 0.1)) > 0.5


def test_aa_false_positive_rate_of_sequential_test_is_at_most_alpha():
    """200 A/A experiments peeking at 10 looks each (bench/ab_simulation.py runs 1,000)."""
    from etude.experiments.analysis import analyze_arrays

    rng = np.random.default_rng(7)
    cfg = ABConfig(looks=10)
    rejections = sum(analyze_arrays(simulate_arrays(rng, 300, 0.0), cfg)["msprt_p"] < 0.05 for _ in range(200))
    # alpha=0.05: the expected count is at most 10; 18 is beyond the binomial 99.5% quantile.
    assert rejections <= 18


def test_guardrail_non_inferiority():
    rng = np.random.default_rng(3)
    rows = simulate_rows(rng, 2000, -0.3)  # treatment clearly worse
    res = analyze(rows, ABConfig(guardrails=(Guardrail("m", higher_is_better=True, margin=0.05),)))
    assert res["guardrails"][0]["ok"] is False
    rows = simulate_rows(rng, 2000, 0.0)
    res = analyze(rows, ABConfig(guardrails=(Guardrail("m", higher_is_better=True, margin=0.5),)))
    assert res["guardrails"][0]["ok"] is True


def test_bad_rows_are_clear_errors(tmp_path):
    p = tmp_path / "e.jsonl"
    p.write_text('{"user_id": 1, "arm": "control", "metric": "m", "numerator": 1, "denominator": 1}\n{not json\n')
    with pytest.raises(EtudeError, match=":2: not valid JSON"):
        load_events(p)
    p.write_text('{"user_id": 1, "arm": "blue", "metric": "m", "numerator": 1, "denominator": 1}\n')
    with pytest.raises(EtudeError, match="arm must be"):
        load_events(p)
    with pytest.raises(EtudeError, match="not found"):
        load_events(tmp_path / "missing.csv")


def test_cli_writes_contract_fields(tmp_path):
    rng = np.random.default_rng(4)
    rows = simulate_rows(rng, 500, 0.1)
    ev = tmp_path / "events.csv"
    ev.write_text("user_id,arm,metric,numerator,denominator\n" + "".join(
        f"{r['user_id']},{r['arm']},{r['metric']},{r['numerator']},{r['denominator']}\n" for r in rows))
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-m", "etude.cli", "ab", "analyze", "--events", str(ev), "--out", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert 0 <= res["srm_p"] <= 1
    m = res["metrics"]["m"]
    for k in ("control", "treatment", "delta", "ci_low", "ci_high", "p_value", "msprt_p"):
        assert isinstance(m[k], float), k
    bad = subprocess.run([sys.executable, "-m", "etude.cli", "ab", "analyze", "--events", str(tmp_path / "nope.csv"),
                          "--out", str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "not found" in bad.stderr


def test_a_burn_in_counts_a_look_only_once_each_arm_has_enough_users() -> None:
    """ABConfig.min_look_users: the mSPRT's looks start once each arm has that many users (the
    last look always counts), so a look on one to three users an arm, whose delta-method variance
    is degenerate, cannot set the always-valid interval (stop 54)."""
    rng, rows = random.Random(0), []
    for i in range(30):
        for arm, p in (("control", 0.4), ("treatment", 0.3)):
            n = rng.randint(3, 12)
            rows.append({"user_id": f"{arm}-{i}", "arm": arm, "metric": "m", "numerator": sum(rng.random() < p
                         for _ in range(n)), "denominator": n, "ts": len(rows)})
    arr = MetricArrays.from_rows(rows, "m")
    every, burnt = sequential_looks(arr, 20), sequential_looks(arr, 20, min_users=10)
    assert len(every.rows) == 20 and 0 < len(burnt.rows) < 20 and burnt.rows[-1] == every.rows[-1]
    first = int(burnt.rows[0])
    tot = arr.totals(first)
    assert min(len(tot["control"].num), len(tot["treatment"].num)) >= 10
    assert analyze_arrays(arr, ABConfig(min_look_users=10))["looks"] == len(burnt.rows)
    assert analyze_arrays(arr, ABConfig())["looks"] == 20
    with pytest.raises(EtudeError, match="min_look_users"):
        ABConfig(min_look_users=-1)
    # a look never reaching the burn-in: the last one still counts
    assert len(sequential_looks(arr, 20, min_users=1000).rows) == 1
