"""The comparison gate on run folders written in the format `etude eval` writes.

The records here are made by hand (the end-to-end test compares real runs): that lets each test
set exactly the per-task differences whose verdict it checks.
"""

import json
import subprocess
import sys

import pytest

from etude.errors import EtudeError
from etude.evals.compare import CompareConfig, compare

N = 40


def make_run(d, model, resolved, adherence=None, tokens=None, suite="s1"):
    n = len(resolved)
    ids = [f"t{i}" for i in range(n)]
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"model": model, "suite_sha256": suite, "instance_ids": ids}))
    with (d / "results.jsonl").open("w") as f:
        for i, iid in enumerate(ids):
            rec = {
                "instance_id": iid,
                "sample": 0,
                "status": "ok",
                "resolved": bool(resolved[i]),
                "partial": False,
                "adherence": {"score": (adherence or [1.0] * n)[i]},
                "reward": {"total": float(resolved[i])},
                "efficiency": {"tokens": (tokens or [1000] * n)[i], "broken_calls": 0, "turns": 3},
            }
            f.write(json.dumps(rec) + "\n")
    return d


def test_a_real_drop_in_resolved_fails_the_gate(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * N)
    b = make_run(tmp_path / "b", "cand", [1, 1] + [0] * 8 + [1] * 30)  # 8 of 40 tasks lost, none gained
    v = compare(a, b)
    r = v["metrics"]["resolved"]
    assert r["delta"] == pytest.approx(-0.2) and r["ci_high"] < 0 and r["interval"] == "tango-score"
    assert r["p_value"] == pytest.approx(2 * 0.5**8) and r["test"] == "mcnemar-exact"
    assert r["verdict"] == "failed" and r["regression"] and "resolved" in v["regressions"]
    assert v["gate"] == "failed" and v["gate_passed"] is False


def test_a_worse_candidate_fails_even_on_the_minimum_suite(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * 20 + [0] * 10)
    b = make_run(tmp_path / "b", "cand", [1] * 10 + [0] * 20)  # 30 tasks: 10 lost
    v = compare(a, b)
    assert v["tasks"] == 30 and v["gate"] == "failed" and v["metrics"]["resolved"]["verdict"] == "failed"


def test_identical_runs_pass_when_the_suite_can_exclude_harm(tmp_path):
    a = make_run(tmp_path / "a", "base", [1, 0] * 60)
    b = make_run(tmp_path / "b", "cand", [1, 0] * 60)
    v = compare(a, b)
    r = v["metrics"]["resolved"]
    assert r["delta"] == 0 and r["p_value"] == 1.0
    # 120 tasks, none discordant: the score interval is about ±0.03, inside the 0.05 margin
    assert -0.05 < r["ci_low"] < 0 < r["ci_high"] < 0.05 and r["ni_p_value"] < 0.025
    assert r["verdict"] == "passed" and v["gate"] == "passed" and v["gate_passed"] is True


def test_identical_runs_on_a_small_suite_are_inconclusive_not_passed(tmp_path):
    a = make_run(tmp_path / "a", "base", [0] * 30)
    b = make_run(tmp_path / "b", "cand", [0] * 30)
    v = compare(a, b)
    r = v["metrics"]["resolved"]
    # both at 0%: the interval is not [0, 0]; it cannot exclude a drop of more than 5 points
    assert r["ci_low"] < -0.05 and r["ci_high"] > 0.05
    assert r["verdict"] == "inconclusive" and not r["regression"]
    assert v["gate"] == "inconclusive" and v["gate_passed"] is False and "resolved" in v["inconclusive"]


def test_noisy_losses_and_gains_are_inconclusive(tmp_path):
    base = [1] * 20 + [0] * 20
    cand = [0] * 4 + [1] * 16 + [1] * 3 + [0] * 17  # 4 lost, 3 gained of 40
    v = compare(make_run(tmp_path / "a", "base", base), make_run(tmp_path / "b", "cand", cand))
    r = v["metrics"]["resolved"]
    assert r["p_value"] == 1.0 and r["verdict"] == "inconclusive" and v["gate"] == "inconclusive"


def test_a_clear_gain_passes_a_small_suite(tmp_path):
    adh = [0.8] * 30  # not 0/1: a bootstrap interval, identical runs -> [0, 0]
    a = make_run(tmp_path / "a", "base", [0] * 30, adherence=adh)
    b = make_run(tmp_path / "b", "cand", [1] * 6 + [0] * 24, adherence=adh)
    v = compare(a, b)
    r = v["metrics"]["resolved"]
    assert r["verdict"] == "passed" and r["improvement"] and v["gate_passed"] and "resolved" in v["improvements"]


def test_a_metric_production_never_had_does_not_block_a_gain(tmp_path):
    # production made no edit (adherence undefined on every task); the candidate edits and resolves 6
    a = make_run(tmp_path / "a", "base", [0] * 30, adherence=[None] * 30)
    b = make_run(tmp_path / "b", "cand", [1] * 6 + [0] * 24, adherence=[0.8] * 30)
    v = compare(a, b)
    adh = v["metrics"]["adherence"]
    assert adh["n"] == 0 and adh["verdict"] == "no baseline" and not adh["regression"]
    assert "adherence" not in v["inconclusive"] and v["gate"] == "passed" and "resolved" in v["improvements"]
    # the other way round the candidate stopped editing where production edited: harm not excluded
    back = compare(b, a)
    assert back["metrics"]["adherence"]["verdict"] == "inconclusive" and back["gate"] != "passed"


def test_suites_below_the_minimum_are_refused(tmp_path):
    a = make_run(tmp_path / "a", "base", [0, 0])
    b = make_run(tmp_path / "b", "cand", [0, 0])
    with pytest.raises(EtudeError, match="needs at least 30 tasks and the suite has 2"):
        compare(a, b)
    assert CompareConfig().min_tasks == 30
    # an explicit, lower minimum runs — and on two tasks it cannot pass
    v = compare(a, b, CompareConfig(min_tasks=2))
    assert v["gate"] == "inconclusive" and v["metrics"]["resolved"]["ci_low"] < -0.5
    with pytest.raises(EtudeError, match="min_tasks"):
        CompareConfig(min_tasks=0)


def test_noise_within_the_interval_is_not_a_regression_unless_rule_point(tmp_path):
    adh = [1.0] * (N - 1) + [0.5]  # one task's adherence dropped: mean -0.0125
    a = make_run(tmp_path / "a", "base", [1] * N)
    b = make_run(tmp_path / "b", "cand", [1] * N, adherence=adh)
    margins = {"adherence": 0.01}
    ci = compare(a, b, CompareConfig(margins=margins))["metrics"]["adherence"]
    assert ci["delta"] == pytest.approx(-0.0125) and ci["ci_high"] == 0.0 and not ci["regression"]
    assert ci["verdict"] == "inconclusive" and ci["interval"] == "bootstrap"
    point = compare(a, b, CompareConfig(rule="point"), margins=margins)
    assert point["metrics"]["adherence"]["regression"] and point["gate"] == "failed" and not point["gate_passed"]


def test_cost_metrics_are_gated_only_when_asked(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * N)
    b = make_run(tmp_path / "b", "cand", [1] * N, tokens=[1500 + i for i in range(N)])
    assert compare(a, b)["metrics"]["tokens"]["verdict"] == "not gated"  # reported, not gated, by default
    v = compare(a, b, CompareConfig(margins={"tokens": 100}))
    t = v["metrics"]["tokens"]
    assert t["higher_is_better"] is False and t["delta"] == pytest.approx(519.5) and t["regression"]


def test_runs_on_different_suites_are_refused(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * N)
    b = make_run(tmp_path / "b", "cand", [1] * N, suite="other")
    with pytest.raises(EtudeError, match="different suites"):
        compare(a, b)
    with pytest.raises(EtudeError, match="unknown metric"):
        CompareConfig(margins={"speed": 1})
    with pytest.raises(EtudeError, match="margins must be >= 0"):
        CompareConfig(margins={"resolved": -0.1})


@pytest.mark.slow  # three CLI start-ups
def test_cli_exit_status_is_the_gate(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * N)
    b = make_run(tmp_path / "b", "cand", [0] * N)
    cmd = [sys.executable, "-m", "etude.cli", "eval", "compare"]
    bad = subprocess.run([*cmd, str(a), str(b), "--out", str(tmp_path / "v.json")], capture_output=True, text=True)
    assert bad.returncode == 1 and json.loads((tmp_path / "v.json").read_text())["gate_passed"] is False
    same = subprocess.run([*cmd, str(a), str(a)], capture_output=True, text=True)
    assert same.returncode == 1 and json.loads(same.stdout)["gate"] == "inconclusive"  # 40 tasks: ±0.09
    small = make_run(tmp_path / "s", "base", [1] * 5)
    refused = subprocess.run([*cmd, str(small), str(small)], capture_output=True, text=True)
    assert refused.returncode == 2 and "needs at least 30 tasks" in refused.stderr
    missing = subprocess.run([*cmd, str(a), str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not an etude eval output folder" in missing.stderr
    assert "Traceback" not in missing.stderr
