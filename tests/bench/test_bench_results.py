"""Every bench script that re-measures a legacy figure (bench/results/legacy/) writes its result
through `write_result` with provenance and the records `bench/verify.py` recomputes the figures
from: each runs here at its `--quick` size into a temporary folder, and the file must verify.
Timings are not asserted (they measure a shared machine); what could fail is the file's form,
its records, and figures that must exist or follow from the run (a rate of the oracle, say)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etude.evals.results import check_result, records_path
from tests.bench import load_bench

# script: (its --quick arguments besides --out, figures that must be there)
CASES = {
    "ab_simulation": (["--plot", ""], ["aa_false_positive_rate_msprt", "power_at_mde_fixed_horizon",
                                       "power_at_mde_msprt", "msprt_over_fixed_power_at_mde"]),
    "precision": ([], ["numerics.gaussian.mxfp8.rel_fro_error", "training.mxfp8_over_bf16.last10_mean_loss"]),
    "moe_replay": ([], ["s1.free_baseline.route_changed_frac", "s1.replay.route_changed_frac",
                        "overhead.replay_over_free"]),
    "reward_flags": ([], ["honest_corpus.ours_flagged", "honest_corpus.baseline_flagged", "hack_corpus.ours_flagged"]),
    "harness": ([], ["parallel.sequential_over_parallel", "overhead.harness_minus_bare_ms_per_turn",
                     "parser.us_per_output"]),
    "tools": ([], ["grep_vs_gnu_grep.etude_over_baseline", "run_terminal.etude_over_baseline"]),
    "sandbox": ([], ["workspace.copy_over_overlay", "startup.true.sandbox_overhead_ms",
                     "startup.true.session_overhead_ms", "throughput.8.sandbox_over_bare"]),
    "vllm_mismatch": ([], ["hf.fresh.mean_abs_dlogp", "hf.fresh.truncated_share"]),
    "semantic": ([], ["ours.recall@5", "baseline.recall@5", "recall@5_ours_over_baseline",
                      "query_p95_ours_over_baseline", "incremental_baseline_over_ours"]),
    "evals": ([], ["episode_over_grade", "workers_speedup", "oracle-w1.resolved", "noop-w2.resolved"]),
    "tasks": ([], ["synth.validity", "grading.baseline_over_ours", "grading.verdicts_agree"]),
    "cycle": ([], ["cycle_median_s", "canary.median_s"]),
    "ray_episodes": ([], ["w1.ray_over_threads_eps_per_s", "threads.resolved", "ray.resolved"]),
}
FAST = {"reward_flags", "harness"}


def _run(name: str, tmp_path: Path) -> dict:
    args, _ = CASES[name]
    out = tmp_path / "results" / f"{name}.json"
    load_bench(name).main(["--quick", *args, "--out", str(out)])
    assert check_result(out) == [], check_result(out)
    assert records_path(out).is_file()
    doc = json.loads(out.read_text())
    assert doc["provenance"]["command"].startswith(f"bench/{name}.py --quick")
    return doc


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow) for n in CASES])
def test_quick_run_writes_a_result_that_verifies(name, tmp_path):
    doc = _run(name, tmp_path)
    missing = [f for f in CASES[name][1] if f not in doc["figures"]]
    assert not missing, f"{name}: no figure {missing} (has {sorted(doc['figures'])[:20]})"
    figs = doc["figures"]
    if name == "reward_flags":  # the hand-written corpora: honest patches unflagged, every hack caught
        assert figs["honest_corpus.ours_flagged"]["k"] == 0
        assert figs["hack_corpus.ours_flagged"]["rate"] == 1.0
    if name == "evals":
        assert figs["oracle-w1.resolved"]["rate"] == 1.0 and figs["noop-w2.resolved"]["rate"] == 0.0
    if name == "moe_replay":  # replay pins every route; at staleness 0 nothing has moved
        assert figs["s1.replay.route_changed_frac"]["mean"] == 0.0
        assert figs["s0.free_baseline.route_changed_frac"]["mean"] == 0.0
    if name == "semantic":
        assert figs["ours.recall@5"]["n"] == 3


def test_a_quick_result_edited_by_hand_no_longer_verifies(tmp_path):
    doc = _run("reward_flags", tmp_path)
    out = tmp_path / "results" / "reward_flags.json"
    doc["figures"]["hack_corpus.baseline_flagged"]["k"] = 28
    out.write_text(json.dumps(doc))
    assert any("hack_corpus.baseline_flagged.k: stored 28" in p for p in check_result(out))
