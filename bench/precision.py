"""Low-precision numerics and (where a GPU is present) speed.

Writes bench/results/precision.json with:
- quantise/dequantise error of MXFP8 (ours), row-wise FP8 (ours) and naive per-tensor FP8
  (the baseline a plain `.to(float8)` cast with one scale gives) on random and outlier-heavy
  tensors: relative Frobenius error and max element error;
- tiny-LM training curves in bf16 (reference), emulated FP8 row-wise and emulated MXFP8, and
  the gap of the last-10-step mean loss to bf16;
- GPU step time, memory, tokens/s: copied from bench/results/gpu_precision.json when
  bench/gpu_precision.py has run on a GPU (otherwise `skipped`).

    python bench/precision.py [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from etude.scale.lowp_train import train_curve
from etude.scale.mx import fp8_rowwise_dequantize, fp8_rowwise_quantize, mx_dequantize, mx_quantize


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 1024, generator=g)
    out = x.clone()
    out.view(-1)[torch.randint(0, x.numel(), (2000,), generator=g)] *= 300.0
    torch.manual_seed(0)  # StudentT draws from the global generator
    heavy = torch.distributions.StudentT(2.0).sample((1024, 1024))
    return {"gaussian": x, "outliers_0.2pct_x300": out, "student_t_df2": heavy}


def errors(x: torch.Tensor) -> dict[str, dict[str, float]]:
    amax = x.abs().max()
    naive = (x / amax * 448).to(torch.float8_e4m3fn).float() * (amax / 448)
    res = {"mxfp8": mx_dequantize(mx_quantize(x)), "fp8_rowwise": fp8_rowwise_dequantize(*fp8_rowwise_quantize(x)),
           "fp8_per_tensor_naive": naive}
    # The Frobenius error is dominated by the largest values; what block scaling buys shows in the
    # typical element (median relative error) and in how many non-zero elements are flushed to 0.
    nz = x != 0
    return {k: {"rel_fro_error": float((v - x).norm() / x.norm()), "max_abs_error": float((v - x).abs().max()),
                "median_elem_rel_error": float(((v - x).abs()[nz] / x.abs()[nz]).median()),
                "flushed_to_zero_fraction": float(((v == 0) & nz).sum() / nz.sum())}
            for k, v in res.items()}


def gpu_figures(path: Path) -> dict:
    """Speed figures from bench/gpu_precision.py's last run on a GPU, when there is one."""
    if path.is_file():
        g = json.loads(path.read_text())
        if g.get("variants") and g["machine"].get("gpu"):
            rows = [{k: v[k] for k in ("model", "recipe", "backend", "step_s_median", "tokens_per_s", "peak_mem_gib")}
                    for v in g["variants"]]
            return {"status": g["status"], "gpu": g["machine"]["gpu"], "variants": rows, "vs_bf16": g.get("vs_bf16")}
    if torch.cuda.is_available():
        return {"status": "CUDA present: run bench/gpu_precision.py for step time and memory"}
    return {"status": "skipped: no GPU figures (bench/gpu_precision.py has not run on a GPU; no device was lent)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "precision.json")
    a = ap.parse_args()
    res: dict = {"machine": platform.platform(), "torch": torch.__version__, "numerics": {}}
    for name, x in tensors().items():
        res["numerics"][name] = errors(x)
    curves, times = {}, {}
    for recipe in ("bf16", "fp8_rowwise", "mxfp8"):
        t0 = time.time()
        curves[recipe] = train_curve(recipe, steps=a.steps)
        times[recipe] = time.time() - t0
    tail = {k: statistics.mean(v[-10:]) for k, v in curves.items()}
    res["training"] = {
        "model": "tiny Llama (hidden 64, 2 layers), synthetic counting sequences, AdamW 3e-3",
        "steps": a.steps, "curves": curves, "last10_mean_loss": tail,
        "gap_vs_bf16": {k: (tail[k] - tail["bf16"]) / tail["bf16"] for k in tail},
        "wall_s_emulated_cpu": times,
        "note": "FP8/MXFP8 are emulated (fake-quantised linears); CPU wall times measure the emulation, not speed",
    }
    res["gpu"] = gpu_figures(a.out.parent / "gpu_precision.json")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: v for k, v in res.items() if k != "training"} | {"gap_vs_bf16": res["training"]["gap_vs_bf16"]}, indent=2))


if __name__ == "__main__":
    main()
