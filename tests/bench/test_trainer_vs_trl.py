"""bench/trainer_vs_trl.py's reward check: non-inferiority with a stated margin and power, a check
that can fail (the bench itself trains two models and is not run here)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from etude.evals.results import check_result
from tests.bench import BENCH_DIR, load_bench

tvt = load_bench("trainer_vs_trl")


def _answers(trainer: str, per_problem: list[list[float]], seed: int = 0) -> list[dict]:
    return [{"kind": "held_out", "trainer": trainer, "seed": seed, "problem": f"p{i}", "sample": j, "reward": r}
            for i, rs in enumerate(per_problem) for j, r in enumerate(rs)]


def test_fails_when_etude_is_clearly_worse():
    rng = np.random.default_rng(0)
    trl = rng.uniform(0.4, 0.9, (64, 4))
    etude = np.clip(trl - 0.3 + rng.normal(0, 0.1, trl.shape), 0, None)
    d = tvt.reward_decision(_answers("trl", trl.tolist()) + _answers("etude", etude.tolist()), margin=0.05)
    assert d["noninferior"] is False and d["p"] > 0.99
    assert d["n"] == 64 and d["lower_bound"] < -0.05


def test_passes_when_equal_on_enough_problems_and_states_margin_n_and_power():
    rng = np.random.default_rng(1)
    trl = rng.uniform(0, 1, (200, 4))
    etude = trl + rng.normal(0, 0.1, trl.shape)
    d = tvt.reward_decision(_answers("trl", trl.tolist()) + _answers("etude", etude.tolist()), margin=0.05)
    assert d["noninferior"] is True and d["p"] < 0.05
    assert d["n"] == 200 and d["power_at_margin"] > 0.8 and d["n_for_power"] <= 200
    assert d["mean_a"] == pytest.approx(trl.mean()) and d["mean_b"] == pytest.approx(etude.mean())


def test_the_no_checkpointing_run_is_no_longer_called_equal():
    # issue 29: etude 0.244 < TRL 0.250 on 8 problems x 2 answers was `equal_or_better: true`
    doc = json.loads((BENCH_DIR / "results/legacy/trainer_vs_trl_realistic_nogc.json").read_text())
    (run,) = doc["runs"]
    k = doc["held_out"]["samples_each"]
    per = {t: [run[t]["raw"]["held_out"][i:i + k] for i in range(0, len(run[t]["raw"]["held_out"]), k)]
           for t in ("etude", "trl")}
    d = tvt.reward_decision(_answers("trl", per["trl"]) + _answers("etude", per["etude"]), margin=0.05)
    assert d["n"] == 8 and d["noninferior"] is False
    assert d["power_at_margin"] < 0.5 and d["n_for_power"] > 8  # too few problems to show it


def test_the_written_result_verifies(tmp_path):
    rng = np.random.default_rng(2)

    def raw(shift: float, speed: float) -> dict:
        return {"held_out": [{"problem": f"p{i}", "sample": j, "reward": float(np.clip(rng.uniform(0, 1) + shift, 0, 1))}
                             for i in range(10) for j in range(2)],
                "held_out_base": [], "step_s": [9.0, speed, speed * 1.1], "completion_tokens": [40, 42, 44],
                "samples_per_step": 8, "peak_rss_mb": 3000.0 + 1000 * shift}

    runs = [{"seed": s, "etude": {"raw": raw(0.0, 2.0)}, "trl": {"raw": raw(0.0, 5.0)}} for s in (0, 1)]
    records = tvt.result_records(runs)
    figs = tvt.result_figures(0.05, 0.05, base=False)
    prov = tvt.provenance(seeds={"train": [0, 1]}, started=0.0, argv=["bench/trainer_vs_trl.py"])
    doc = tvt.write_result(tmp_path / "trainer_vs_trl.json", figs, records, prov, meta={"setting": "short"})
    f = doc["figures"]
    assert f["etude_noninferior_to_trl"]["margin"] == 0.05 and f["etude_noninferior_to_trl"]["n"] == 10
    assert "power_at_margin" in f["etude_noninferior_to_trl"]
    assert f["throughput_ratio_samples_per_s"]["value"] == pytest.approx(2.5)  # median 4 / 1.6 samples/s, warm-up out
    assert check_result(tmp_path / "trainer_vs_trl.json") == []
