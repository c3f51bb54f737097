"""Low-precision numerics on CPU: quantisation error of the formats and tiny-LM training curves.

Writes bench/results/precision.json (+ precision.records.jsonl) through
`etude.evals.results.write_result`:
- quantise/dequantise error of MXFP8 (ours), row-wise FP8 (ours) and naive per-tensor FP8
  (the baseline a plain `.to(float8)` cast with one scale gives) on random and outlier-heavy
  tensors: relative Frobenius error, max element error, median element relative error and the
  share of non-zero elements flushed to zero — one record per tensor and format;
- tiny-LM training curves in bf16 (reference), emulated FP8 row-wise and emulated MXFP8 — one
  record per recipe and step (its loss) — and the last-10-step mean loss of each recipe over
  bf16's (a ratio: 1.0013 is +0.13%).
`bench/verify.py` recomputes every figure from the records. The CPU wall times of the emulated
recipes measure the emulation, not speed: they are kept in `meta`, not as figures. GPU speed is
bench/gpu_precision.py's, in its own result file.

    python bench/precision.py [--steps 40] [--size 1024] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from etude.evals.results import write_result
from etude.provenance import provenance
from etude.scale.lowp_train import train_curve
from etude.scale.mx import fp8_rowwise_dequantize, fp8_rowwise_quantize, mx_dequantize, mx_quantize

RECIPES = ("bf16", "fp8_rowwise", "mxfp8")
METRICS = ("rel_fro_error", "max_abs_error", "median_elem_rel_error", "flushed_to_zero_fraction")


def tensors(size: int = 1024) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, size, generator=g)
    out = x.clone()
    out.view(-1)[torch.randint(0, x.numel(), (x.numel() * 2000 // 1024**2,), generator=g)] *= 300.0
    torch.manual_seed(0)  # StudentT draws from the global generator
    heavy = torch.distributions.StudentT(2.0).sample((size, size))
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


def figures(tensor_names: list[str]) -> dict[str, dict]:
    figs: dict[str, dict] = {}
    for t in tensor_names:
        for fmt in ("mxfp8", "fp8_rowwise", "fp8_per_tensor_naive"):
            for m in METRICS:
                figs[f"numerics.{t}.{fmt}.{m}"] = {"kind": "quantile", "of": {"part": "numerics", "tensor": t,
                                                                              "format": fmt}, "field": m, "q": 0.5}
    for r in RECIPES:
        figs[f"training.{r}.last10_mean_loss"] = {"kind": "mean", "of": {"part": "training", "recipe": r, "last10": 1},
                                                  "field": "loss"}
        if r != "bf16":
            figs[f"training.{r}_over_bf16.last10_mean_loss"] = {
                "kind": "ratio", "num": {"part": "training", "recipe": r, "last10": 1},
                "den": {"part": "training", "recipe": "bf16", "last10": 1}, "field": "loss"}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--size", type=int, default=1024, help="side of the square test tensors")
    ap.add_argument("--quick", action="store_true", help="smoke run: 10 training steps, 64x64 tensors")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "precision.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.steps, a.size = 10, 64
    if a.steps < 10:
        raise SystemExit("bench/precision.py: --steps must be >= 10 (the figure is the last 10 steps' mean loss)")
    started = time.time()
    records: list[dict] = []
    for name, x in tensors(a.size).items():
        for fmt, errs in errors(x).items():
            records.append({"part": "numerics", "tensor": name, "format": fmt, **errs})
    times = {}
    for recipe in RECIPES:
        t0 = time.time()
        curve = train_curve(recipe, steps=a.steps)
        times[recipe] = time.time() - t0
        records += [{"part": "training", "recipe": recipe, "step": i, "loss": loss, "last10": int(i >= a.steps - 10)}
                    for i, loss in enumerate(curve)]
    meta = {"tensors": f"{a.size}x{a.size}: gaussian, gaussian with 0.2% of elements x300, Student t (df 2)",
            "training": {"model": "tiny Llama (hidden 64, 2 layers), synthetic counting sequences, AdamW 3e-3",
                         "steps": a.steps},
            "wall_s_emulated_cpu": times,
            "note": "FP8/MXFP8 are emulated (fake-quantised linears); CPU wall times measure the emulation, not speed"}
    prov = provenance(seeds={"tensors": 0, "training": 0}, started=started,
                      argv=["bench/precision.py", *(sys.argv[1:] if argv is None else argv)])
    names = list(dict.fromkeys(r["tensor"] for r in records if r["part"] == "numerics"))
    doc = write_result(a.out, figures(names), records, prov, meta=meta)
    f = doc["figures"]
    print(json.dumps({k: v["value"] for k, v in f.items() if k.startswith("training.") and "_over_" in k}
                     | {k: v["mean"] for k, v in f.items() if k.endswith(".last10_mean_loss") and "_over_" not in k},
                     indent=2))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
