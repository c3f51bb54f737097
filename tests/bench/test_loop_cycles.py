"""bench/loop_cycles.py (issue 46): how the held-out ground truth judges a decision, that cycle 1
plans for the given effect and later cycles for the previous readout, that the users run the
behaviour config's harness, and — slow — that `--quick` runs two real consecutive cycles whose
result file passes bench/verify.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etude.loop import LoopConfig
from tests.bench import BENCH_DIR, load_bench

lc = load_bench("loop_cycles")
verify = load_bench("verify")
CONFIG = BENCH_DIR.parent / "configs" / "loop_behaviour.toml"


def _pair(prod: list[float], cand: list[float], broken_prod: list[float] | None = None,
          broken_cand: list[float] | None = None) -> list[dict]:
    bp = broken_prod or [0.0] * len(prod)
    bc = broken_cand or [0.0] * len(cand)
    out = []
    for arm, rs, bs in (("production", prod, bp), ("candidate", cand, bc)):
        out += [{"arm": arm, "task": f"t{i}", "repeat_share": r, "broken_share": b, "broken_call_share": b}
                for i, (r, b) in
                enumerate(zip(rs, bs, strict=True))]
    return out


def test_a_decision_is_confirmed_only_when_held_out_repeats_drop_and_broken_calls_do_not_rise():
    n = 20
    better = lc.verdict_of(_pair([0.5] * n, [0.2 + 0.01 * (i % 3) for i in range(n)]))
    assert better["confirmed"] and better["repeat_share"]["ci_high"] < 0
    tie = lc.verdict_of(_pair([0.3 + 0.01 * (i % 2) for i in range(n)], [0.3 + 0.01 * ((i + 1) % 2) for i in range(n)]))
    assert not tie["confirmed"] and not tie["better"]
    # fewer repeats bought with broken calls is not an improvement
    traded = lc.verdict_of(_pair([0.5] * n, [0.2] * n, [0.1] * n, [0.6 + 0.01 * (i % 3) for i in range(n)]))
    assert traded["better"] and traded["guardrail_worse"] and not traded["confirmed"]
    # nor with more of the calls it makes broken (per call), though per turn it broke no more
    per_call = _pair([0.5] * n, [0.2] * n)
    for r in per_call:
        r["broken_call_share"] = 0.1 if r["arm"] == "production" else 0.5 + 0.01 * (int(r["task"][1:]) % 3)
    fewer_calls = lc.verdict_of(per_call)
    assert fewer_calls["better"] and fewer_calls["broken_share"]["ci_low"] == 0 and fewer_calls["guardrail_worse"]
    assert not fewer_calls["confirmed"]
    # nor by no longer editing: fewer repeats and broken calls from a candidate that reads and stops
    quitter = _pair([0.5] * n, [0.2] * n)
    for r in quitter:
        r["edited"] = int(r["arm"] == "production" or int(r["task"][1:]) % 10 == 0)
    stopped = lc.verdict_of(quitter)
    assert stopped["better"] and stopped["fewer_edits"] and stopped["guardrail_worse"] and not stopped["confirmed"]
    assert stopped["edited"]["mean_diff"] == pytest.approx(-0.9)


def test_cycle_one_plans_for_the_given_effect_and_later_cycles_for_the_previous_readout(tmp_path):
    base = LoopConfig.from_toml(CONFIG)
    s = lc.DEFAULT
    first = lc.cycle_config(base, s, root=tmp_path, production="/m", backend="vllm", previous=False, quick=False)
    # the per-user noise is measured on each cycle's collect window, not assumed
    assert (first.canary.mde, first.canary.user_cv, first.canary.mde_from) == (s.mde, None, "")
    assert first.canary.user_cv_from == "collect"
    # a canary window larger than the collect window: the plan's reach
    assert first.traffic.users == s.users and first.canary.window_users == s.canary_users > s.users
    second = lc.cycle_config(base, s, root=tmp_path, production="/m", backend="vllm", previous=True, quick=False)
    assert second.canary.mde is None and second.canary.mde_from == "previous"
    assert second.canary.user_cv_from == "collect"
    quick = lc.cycle_config(base, lc.QUICK, root=tmp_path, production="/m", backend="hf", previous=False, quick=True)
    assert (quick.canary.user_cv, quick.canary.user_cv_from) == (lc.QUICK.user_cv, "")
    assert first.traffic.users == s.users and first.eval.backend == first.server.backend == "vllm"
    # the users run production's own harness: the warm start's tools, turns and read window
    h = first.traffic.harness
    assert h.tools == ("read_file", "edit_file", "grep", "run_terminal", "semantic_search")
    assert (h.max_steps, h.max_tokens_per_turn, h.tools_config.read_max_lines) == (8, 160, 25)
    assert first.canary.primary == "repeat_rate" and not first.canary.primary_higher_is_better
    assert first.distill.reward_config().weights["repeated_calls"] == 1.0


def test_figures_verify_against_their_records(tmp_path, capsys):
    recs = [{"record": "cycle", "cycle": "cycle-0001", "promoted": 1, "true_promotion": 1, "false_promotion": 0,
             "missed_improvement": 0, "wall_s": 10.0}]
    recs += [{"record": "confirm", "cycle": "cycle-0001", **r, "resolved": 0} for r in
             _pair([0.5, 0.4, 0.6, 0.5], [0.2, 0.1, 0.3, 0.2])]
    recs += [{"record": "aa_split", "cycle": "cycle-0001", "split": i, "promote": 0, "rollback": int(i == 0)}
             for i in range(10)]
    cycles = [{"cycle": "cycle-0001", "readout_settings": {"alpha": 0.05, "weights": [0.5, 0.5], "power": 0.8}}]
    figs = lc.figures_of(recs, cycles)
    assert {"true_promotions", "false_promotions", "aa_false_rollback_rate", "confirm.cycle-0001.repeat_share",
            "production_repeat_share.cycle-0001"} <= set(figs)
    from etude.evals.results import write_result
    from etude.provenance import provenance
    out = tmp_path / "loop_cycles.json"
    write_result(out, figs, recs, provenance(), meta={"what": "test"})
    assert verify.main(["--results", str(tmp_path)]) == 0
    f = json.loads(out.read_text())["figures"]
    assert f["confirm.cycle-0001.repeat_share"]["mean_diff"] == pytest.approx(-0.3)
    assert f["aa_false_rollback_rate"]["k"] == 1


def test_bad_input_is_one_line(tmp_path, capsys):
    assert lc.main([]) == 2
    assert "--production" in capsys.readouterr().err
    assert lc.main(["--quick", "--hacks", "sulk"]) == 2
    assert "unknown hack(s) sulk" in capsys.readouterr().err
    assert lc.main(["--quick", "--hacks", "quit", "--out", str(tmp_path)]) == 2
    assert "run the cycles first" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_quick_runs_two_consecutive_real_cycles_and_verifies(tmp_path):
    results = tmp_path / "results" / "loop_cycles.json"
    r = subprocess.run([sys.executable, str(BENCH_DIR / "loop_cycles.py"), "--quick", "--out", str(tmp_path / "out"),
                        "--results", str(results)], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(results.read_text())
    cycles = data["meta"]["cycles"]
    assert [c["cycle"] for c in cycles] == ["cycle-0001", "cycle-0002"]
    assert cycles[0]["plan"]["primary"] == "repeat_rate" and cycles[0]["plan"]["mde_source"] == "[canary] mde"
    # each decided cycle's pair was measured on the same held-out tasks
    for c in cycles:
        if c["candidate"]:
            n = len(data["meta"]["confirm_tasks"])
            assert data["figures"][f"confirm.{c['cycle']}.repeat_share"]["n"] == n
    assert data["figures"]["aa_false_promotion_rate"]["n"] == 2 * lc.QUICK.aa_splits
    assert verify.main(["--results", str(results.parent)]) == 0
    assert Path(results.with_suffix(".png")).is_file()
    # the hacks: each trained from production on cycle 1's logged prompts, each canaried and decided
    hacks = tmp_path / "results" / "loop_hacks.json"
    r = subprocess.run([sys.executable, str(BENCH_DIR / "loop_cycles.py"), "--quick", "--out", str(tmp_path / "out"),
                        "--results", str(hacks), "--hacks", "quit,clarify,broken"], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    h = json.loads(hacks.read_text())
    assert [x["hack"] for x in h["meta"]["hacks"]] == ["quit", "clarify", "broken"]
    assert all(x["steps"] >= 1 and x["decision"] in ("promote", "rollback") for x in h["meta"]["hacks"])
    assert h["figures"]["hacks_caught"]["n"] == 3
    assert verify.main(["--results", str(results.parent)]) == 0
