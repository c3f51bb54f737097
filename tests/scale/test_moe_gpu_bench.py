"""bench/gpu_precision.py: on a CPU machine it records `skipped` and exits cleanly; `--smoke`
runs the real measurement code (tiny MoE, emulated FP8) end to end."""

from __future__ import annotations

import json

import pytest
import torch

from tests.bench import load_bench


def _bench():
    return load_bench("gpu_precision")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this checks the CPU-only path")
def test_without_cuda_the_bench_records_skipped(tmp_path):
    res = _bench().main(["--out", str(tmp_path / "g.json")])
    assert res["status"].startswith("skipped") and res["variants"] == []
    assert json.loads((tmp_path / "g.json").read_text())["status"] == res["status"]


@pytest.mark.slow
def test_smoke_measures_bf16_and_fp8_of_a_small_moe(tmp_path):
    res = _bench().main(["--smoke", "--steps", "2", "--only", "moe/bf16,moe/fp8_rowwise", "--out", str(tmp_path / "g.json")])
    assert res["status"] == "ok" and [v["recipe"] for v in res["variants"]] == ["bf16", "fp8_rowwise"]
    fp8 = res["variants"][1]
    assert fp8["backend"] == "emulated_rowwise" and fp8["tokens_per_s"] > 0 and len(fp8["step_s_all"]) == 2
    assert fp8["fp8_linears"] == 8 and res["variants"][0]["fp8_linears"] == 0  # q/k/v/o of 2 layers
    assert "moe/fp8_rowwise" in res["vs_bf16"]
