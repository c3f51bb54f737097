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

IDS = [f"t{i}" for i in range(10)]


def make_run(d, model, resolved, adherence=None, tokens=None, suite="s1"):
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"model": model, "suite_sha256": suite, "instance_ids": IDS}))
    with (d / "results.jsonl").open("w") as f:
        for i, iid in enumerate(IDS):
            rec = {
                "instance_id": iid,
                "sample": 0,
                "status": "ok",
                "resolved": bool(resolved[i]),
                "partial": False,
                "adherence": {"score": (adherence or [1.0] * 10)[i]},
                "reward": {"total": float(resolved[i])},
                "efficiency": {"tokens": (tokens or [1000] * 10)[i], "broken_calls": 0, "turns": 3},
            }
            f.write(json.dumps(rec) + "\n")
    return d


def test_a_real_drop_in_resolved_fails_the_gate(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * 10)
    b = make_run(tmp_path / "b", "cand", [1, 1] + [0] * 8)
    v = compare(a, b)
    r = v["metrics"]["resolved"]
    assert r["delta"] == pytest.approx(-0.8) and r["ci_high"] < 0
    assert r["p_value"] == pytest.approx(2 * 0.5**8) and r["test"] == "mcnemar-exact"
    assert r["regression"] and "resolved" in v["regressions"] and v["gate_passed"] is False


def test_identical_runs_pass(tmp_path):
    a = make_run(tmp_path / "a", "base", [1, 0] * 5)
    b = make_run(tmp_path / "b", "cand", [1, 0] * 5)
    v = compare(a, b)
    assert v["gate_passed"] and v["metrics"]["resolved"]["delta"] == 0 and v["metrics"]["resolved"]["p_value"] == 1.0


def test_noise_within_the_interval_is_not_a_regression_unless_rule_point(tmp_path):
    adh = [1.0] * 9 + [0.5]  # one task's adherence dropped: mean -0.05 > margin 0.04, CI touches 0
    a = make_run(tmp_path / "a", "base", [1] * 10)
    b = make_run(tmp_path / "b", "cand", [1] * 10, adherence=adh)
    margins = {"adherence": 0.04}
    ci = compare(a, b, CompareConfig(margins=margins))["metrics"]["adherence"]
    assert ci["delta"] == pytest.approx(-0.05) and ci["ci_high"] == 0.0 and not ci["regression"]
    point = compare(a, b, CompareConfig(rule="point"), margins=margins)
    assert point["metrics"]["adherence"]["regression"] and not point["gate_passed"]


def test_cost_metrics_are_gated_only_when_asked(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * 10)
    b = make_run(tmp_path / "b", "cand", [1] * 10, tokens=[1500 + i for i in range(10)])
    assert compare(a, b)["gate_passed"]  # tokens are reported, not gated, by default
    v = compare(a, b, CompareConfig(margins={"tokens": 100}))
    t = v["metrics"]["tokens"]
    assert t["higher_is_better"] is False and t["delta"] == pytest.approx(504.5) and t["regression"]


def test_runs_on_different_suites_are_refused(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * 10)
    b = make_run(tmp_path / "b", "cand", [1] * 10, suite="other")
    with pytest.raises(EtudeError, match="different suites"):
        compare(a, b)
    with pytest.raises(EtudeError, match="unknown metric"):
        CompareConfig(margins={"speed": 1})


@pytest.mark.slow  # three CLI start-ups
def test_cli_exit_status_is_the_gate(tmp_path):
    a = make_run(tmp_path / "a", "base", [1] * 10)
    b = make_run(tmp_path / "b", "cand", [0] * 10)
    cmd = [sys.executable, "-m", "etude.cli", "eval", "compare"]
    bad = subprocess.run([*cmd, str(a), str(b), "--out", str(tmp_path / "v.json")], capture_output=True, text=True)
    assert bad.returncode == 1 and json.loads((tmp_path / "v.json").read_text())["gate_passed"] is False
    ok = subprocess.run([*cmd, str(a), str(a)], capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["gate_passed"] is True
    missing = subprocess.run([*cmd, str(a), str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 2 and "not an etude eval output folder" in missing.stderr
    assert "Traceback" not in missing.stderr
