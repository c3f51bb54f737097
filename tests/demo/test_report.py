"""The demo's report renders the measured figures it is given (and nothing it is not)."""

import math

from etude.demo.report import write_report
from etude.evals.stats import wilson_ci as _wilson


def test_wilson_interval():
    lo, hi = _wilson(5, 10)
    assert lo < 0.5 < hi and 0.2 < lo and hi < 0.8
    assert _wilson(0, 0) == (0.0, 1.0)
    lo, hi = _wilson(10, 10)
    assert hi > 0.999999 and lo > 0.6 and not math.isnan(lo)


def test_report_has_tables_plots_and_figures(tmp_path):
    data = {
        "intro": "measured",
        "stages": [("1. tasks", "3 tasks", 0.5), ("5. real-time cycle", "decision: promote", 12.25)],
        "metrics": [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.4}],
        "evals": [{"step": 0, "success": 0.25, "ci_low": 0.05, "ci_high": 0.6}],
        "comparison": {"metrics": {"resolved": {"n": 3, "a": 0.0, "b": 0.3333, "delta": 0.3333, "ci_low": 0.0,
                                                "ci_high": 1.0, "p_value": 0.5, "regression": False, "improvement": True}}},
        "cycle": {"collect": 3.0, "train": 5.0},
        "cycle_rows": [["collect", "done", 3.0]],
        "readout": {"metrics": {"accept_rate": {"control": 0.5, "treatment": 0.75, "delta": 0.5, "ci_low": -0.1,
                                                "ci_high": 1.1, "p_value": 0.2, "msprt_p": 0.9}},
                    "users": {"control": 4, "treatment": 4}, "srm_p": 1.0},
        "decision": "promote — because",
        "trajectories": [("eval: t1", "[user] fix <it>")],
    }
    page = write_report(tmp_path, data).read_text()
    assert 'id="summary"' in page and "decision: promote" in page and "12.2" in page
    assert "0.3333" in page and "accept_rate" in page and "0.75" in page
    assert "&lt;it&gt;" in page  # trajectory text is escaped
    assert (tmp_path / "plots" / "learning.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "cycle.png").stat().st_size > 1000


def test_report_shows_heldout_stages_and_side_by_side(tmp_path):
    held = {"base": {"resolved": 0, "tasks": 30, "rate": 0.0, "ci95": [0.0, 0.114],
                     "tool_use": {"episodes": 0, "rate": 0.0, "ci95": [0.0, 0.114]}},
            "sft": {"resolved": 9, "tasks": 30, "rate": 0.3, "ci95": [0.167, 0.479],
                    "tool_use": {"episodes": 29, "rate": 0.967, "ci95": [0.8333, 0.9941]}},
            "sft_vs_base": {"gain": 0.3, "mcnemar_p": 0.0039, "tool_use_gain": 0.967, "tool_use_mcnemar_p": 3.7e-09}}
    data = {"stages": [], "heldout": held, "sft_metrics": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}],
            "side_by_side": {"task": "pkg__synth-x", "resolved": {"base": 0, "sft": 1},
                             "columns": [("base", "[assistant] prose <b>"), ("sft", "[assistant] <tool_call>")]}}
    page = write_report(tmp_path, data).read_text()
    assert "0.0039" in page and "sft vs base" in page and "0.479" in page
    assert "well-formed tool call" in page and "0.994" in page and "3.7e-09" in page
    assert "pkg__synth-x" in page and "prose &lt;b&gt;" in page and "&lt;tool_call&gt;" in page
    assert (tmp_path / "plots" / "heldout.png").stat().st_size > 1000
    assert (tmp_path / "plots" / "sft.png").stat().st_size > 1000


def test_the_org_cycle_shows_its_decision_and_the_numbers_that_made_it(tmp_path):
    gate_only = {"decision": "rollback", "basis": "gate-only", "primary": "accept_rate",
                 "reason": "gate-only decision (the plan needs 811/811 users per arm …): eval gate inconclusive",
                 "eval": {"gate": "inconclusive", "tasks": 30, "production_resolved": 0.1, "candidate_resolved": 0.2,
                          "metrics": {"resolved": {"delta": 0.1, "ci_low": -0.05, "ci_high": 0.25}}},
                 "plan": {"mode": "gate-only", "mde": 0.139, "source": "candidate acme-spec-1: held out 18/60 -> 27/60",
                          "users_per_arm": [811, 811], "reach": [2.0, 2.0], "line": "the plan needs 811/811 users per arm"},
                 "ab": None, "alarms": None, "canary": {}}
    page = write_report(tmp_path, {"stages": [], "cycle_report": gate_only}).read_text()
    assert "What decided it" in page and "rollback (basis: gate-only)" in page
    assert "inconclusive on 30 held-out task(s): resolved 10.0% (production) → 20.0% (candidate)" in page
    assert "Δ +10.0% [-5.0%, +25.0%]" in page
    assert "users per arm planned 811/811, window reaches 2/2" in page and "18/60 -&gt; 27/60" in page

    readout = {"decision": "promote", "basis": "readout", "primary": "accept_rate", "reason": "significantly better",
               "eval": {"gate": "passed", "tasks": 30, "production_resolved": 0.3, "candidate_resolved": 0.45,
                        "metrics": {"resolved": {"delta": 0.15, "ci_low": 0.02, "ci_high": 0.28}}},
               "plan": {"mode": "ab", "mde": 0.14, "source": "[canary] mde", "users_per_arm": [200, 200],
                        "reach": [250.0, 250.0], "line": ""},
               "ab": {"users": {"control": 240, "treatment": 236}, "srm_p": 0.85,
                      "metrics": {"accept_rate": {"delta": 0.12, "ci_low": 0.04, "ci_high": 0.2, "msprt_ci_low": 0.01,
                                                  "msprt_ci_high": 0.23, "msprt_p": 0.003}}},
               "alarms": [{"metric": "edit_rate", "fired": False}], "canary": {"rounds": 3}}
    page = write_report(tmp_path, {"stages": [], "cycle_report": readout}).read_text()
    assert "promote (basis: readout)" in page and "control 240, canary 236 after 3 round(s); SRM p 0.85" in page
    assert "lift +12.0% [+4.0%, +20.0%], always-valid [+1.0%, +23.0%], mSPRT p 0.003" in page
    assert "accept_rate (primary)" in page and "none fired" in page
    assert "no cycle" in write_report(tmp_path, {"stages": []}).read_text()
