"""GPU speed of low-precision training: a small MoE (and a dense model of the same width) at
bf16 vs FP8, step time, peak memory and tokens/s. Writes bench/results/gpu_precision.json.

    python bench/gpu_precision.py                 # on a CUDA machine (budget ~7 min on an H200)
    python bench/gpu_precision.py --smoke         # CPU: tiny sizes, emulated FP8, proves the code path

FP8 comes from torchao's `convert_to_float8_training` (recipes "tensorwise" and "rowwise") when
torchao is importable and the GPU has FP8 tensor cores (sm89+); otherwise from our emulation
(`etude.scale.mx.convert_linears`, fake-quantised, slower than bf16 by construction), and the
JSON says which. What FP8 covers: `nn.Linear` layers whose dimensions are multiples of 16
(attention projections, dense MLPs), not the router and not `lm_head`. The MoE's experts are 3-D
parameters run by transformers' `grouped_mm` experts kernel in bf16 in every variant (torchao's
FP8/MXFP8 grouped GEMMs for MoE are a prototype we do not wire here), so for the MoE the FP8
gain is bounded by the attention share of the FLOPs; the dense model shows the linear-layer gain.

Each variant is compiled with torch.compile (torchao's FP8 is only fast compiled); variants run
in priority order and the run stops starting new ones past `--budget-s`; the JSON is rewritten
after every variant so a timeout keeps what was measured. Without CUDA and without `--smoke`
it writes a `skipped` record and exits 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

OUT = Path(__file__).parent / "results" / "gpu_precision.json"
VARIANTS = [("moe", "bf16"), ("moe", "fp8_rowwise"), ("dense", "bf16"), ("dense", "fp8_rowwise"),
            ("moe", "fp8_tensorwise"), ("dense", "fp8_tensorwise")]


def build(kind: str, a: argparse.Namespace, device: str) -> torch.nn.Module:
    from etude.scale.moe import tiny_moe

    if kind == "moe":
        extra = {"_experts_implementation": "grouped_mm"} if device == "cuda" else {}
        model = tiny_moe("qwen3_moe", vocab=a.vocab, hidden=a.hidden, layers=a.layers, experts=a.experts,
                         top_k=a.top_k, max_position_embeddings=a.seq, **extra)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        # the dense model's MLP is as wide as the MoE's active experts (top_k × expert width)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                                             intermediate_size=2 * a.hidden * a.top_k, num_attention_heads=max(4, a.hidden // 128),
                                             num_key_value_heads=max(4, a.hidden // 128), max_position_embeddings=a.seq))
    return model.to(device=device, dtype=torch.bfloat16).train()


def to_fp8(model: torch.nn.Module, recipe: str, device: str) -> str:
    """Convert eligible linears; returns the backend used ("torchao" or "emulated_rowwise")."""
    name = recipe.removeprefix("fp8_")
    fits = lambda m, fqn: (isinstance(m, torch.nn.Linear) and "lm_head" not in fqn and not fqn.endswith(".gate")  # noqa: E731
                           and m.in_features % 16 == 0 and m.out_features % 16 == 0)
    if device == "cuda" and torch.cuda.get_device_capability() >= (8, 9):
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError:
            pass
        else:
            convert_to_float8_training(model, module_filter_fn=fits, config=Float8LinearConfig.from_recipe_name(name))
            return "torchao"
    from etude.scale.mx import convert_linears

    convert_linears(model, "fp8_rowwise", skip=("lm_head",))
    return "emulated_rowwise"  # both recipes: our fake-quantised row-wise FP8, numerics only


def run_variant(kind: str, recipe: str, a: argparse.Namespace, device: str) -> dict[str, Any]:
    torch.manual_seed(0)
    model = build(kind, a, device)
    backend = to_fp8(model, recipe, device) if recipe != "bf16" else "native"
    params = sum(p.numel() for p in model.parameters())
    lowp = sum(1 for m in model.modules() if "Float8" in type(m).__name__ or "LowPrecision" in type(m).__name__)
    step_model = torch.compile(model) if a.compile else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=device)
    times = []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"model": kind, "recipe": recipe, "backend": backend, "params": params, "fp8_linears": lowp,
            "compiled": a.compile,
            "step_s_median": med, "step_s_all": times, "tokens_per_s": a.batch * a.seq / med,
            "peak_mem_gib": peak, "final_loss": float(loss)}


def ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Speed-up and memory of each FP8 variant against bf16 of the same model (same run)."""
    base = {r["model"]: r for r in rows if r["recipe"] == "bf16"}
    out = {}
    for r in rows:
        b = base.get(r["model"])
        if r["recipe"] != "bf16" and b:
            out[f"{r['model']}/{r['recipe']}"] = {
                "speedup_vs_bf16": b["step_s_median"] / r["step_s_median"],
                "peak_mem_ratio_vs_bf16": (r["peak_mem_gib"] / b["peak_mem_gib"]) if b["peak_mem_gib"] else None}
    return out


def machine(device: str) -> dict[str, Any]:
    m: dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0], "torch": torch.__version__}
    try:
        import torchao

        m["torchao"] = torchao.__version__
    except ImportError:
        m["torchao"] = None
    if device == "cuda":
        m["gpu"] = torch.cuda.get_device_name()
        m["capability"] = list(torch.cuda.get_device_capability())
    return m


def args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, emulated FP8: exercises the code path")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--budget-s", type=float, default=420.0, help="no new variant starts after this")
    ap.add_argument("--only", default=None, help="comma-separated MODEL/RECIPE variants, e.g. moe/bf16,moe/fp8_rowwise")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    a.compile = not a.smoke
    a.variants = VARIANTS if not a.only else [tuple(v.split("/", 1)) for v in a.only.split(",")]
    unknown = [v for v in a.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; known: {', '.join('/'.join(v) for v in VARIANTS)}")
    if a.smoke:
        a.steps, a.warmup, a.batch, a.seq, a.hidden, a.layers, a.experts, a.vocab = (
            min(a.steps, 3), 1, 2, 32, 64, 2, 4, 256)
    a.out = a.out or (OUT.with_name("gpu_precision_cpu_smoke.json") if a.smoke else OUT)
    return a


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = args(argv)
    device = "cuda" if torch.cuda.is_available() and not a.smoke else "cpu"
    res: dict[str, Any] = {"machine": machine(device),
                           "sizes": {k: v for k, v in vars(a).items() if k not in ("out", "variants")},
                           "variants": []}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    if device == "cpu" and not a.smoke:
        res["status"] = "skipped: no CUDA device on this machine (run on a GPU, or --smoke for the CPU code path)"
        a.out.write_text(json.dumps(res, indent=2))
        print(f"gpu_precision: {res['status']}; wrote {a.out}")
        return res
    t0 = time.time()
    for kind, recipe in a.variants:
        if time.time() - t0 > a.budget_s:
            res.setdefault("not_run", []).append(f"{kind}/{recipe}: time budget spent")
            continue
        try:
            row = run_variant(kind, recipe, a, device)
        except Exception as e:  # one failing variant (e.g. a kernel missing) must not lose the others
            res.setdefault("errors", []).append(f"{kind}/{recipe}: {type(e).__name__}: {str(e)[:300]}")
            continue
        res["variants"].append(row)
        res["vs_bf16"] = ratios(res["variants"])
        res["status"] = "partial" if len(res["variants"]) < len(a.variants) else "ok"
        a.out.write_text(json.dumps(res, indent=2))
        print(f"{kind:5s} {recipe:15s} {row['backend']:8s} step {row['step_s_median'] * 1e3:8.1f} ms  "
              f"{row['tokens_per_s']:10.0f} tok/s  peak {row['peak_mem_gib'] or 0:.2f} GiB", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
    res["status"] = "ok" if len(res["variants"]) == len(a.variants) else "partial"
    res["wall_s"] = time.time() - t0
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res.get("vs_bf16", {}), indent=2))
    return res


if __name__ == "__main__":
    main()
