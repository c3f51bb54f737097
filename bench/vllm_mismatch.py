"""Behaviour/learner log-prob mismatch with vLLM rollouts, and in-place weight sync.

The trainer's importance correction compares, per sampled token, the learner's log-prob
(`etude.train.learner.packed_logprobs`, fp32, the same call a training step makes) with the
behaviour log-prob the sampler logged. This measures that gap for three samplers in one run:

    hf          LocalPolicy on the learner's own model (the baseline: today's rollout path)
    vllm-fp32   VLLMPolicy, engine dtype float32
    vllm-bf16   VLLMPolicy, engine dtype bfloat16 (vLLM's usual CPU/GPU setting)

For each: mean / median / p99 / max |Δ log p|, the distribution of the per-token IS weight
π_learner / π_behaviour (the quantity `sample_loss` truncates at `loss.is_cap`), the share above
the cap, and what the learner itself reports in a real optimiser step on those samples.

Weight sync (per vLLM dtype): one real optimiser step on the learner (lr `--lr`), then the
engine samples again *before* the sync (stale weights) and *after* `VLLMPolicy.load_weights`
(in place, no restart), and both are compared with the updated learner; the sync time is
recorded. The engine is never restarted.

    .venv-vllm/bin/python bench/vllm_mismatch.py [--model smollm2] [--prompts 16] [--n 2] [--max-tokens 48]

Writes bench/results/vllm_mismatch.json through `etude.evals.results.write_result`, with
vllm_mismatch.records.jsonl beside it: one record per sampled token (condition; phase: fresh, or
after one optimiser step with the engine stale or synced; |Δ log p|; IS weight; truncated at the
cap or below its inverse) and one per weight sync (seconds); `bench/verify.py` recomputes the
means, percentiles and shares from them. Generation and engine-load seconds, and what the learner
reports in its step, are kept in `meta`. Run on a shared 2-core machine: read ratios, not times.
`--dtypes ""` measures the HF baseline alone (no vLLM needed); `--quick` does so on the tiny
model at the smallest sizes (the unit test's run).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from etude.evals.results import write_result
from etude.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent


def mismatch(learner: Any, gens: list[Any], temperature: float, is_cap: float, condition: str,
             phase: str) -> list[dict[str, Any]]:
    """Per-token comparison of behaviour log-probs with the learner's recomputation: one record
    per token."""
    import torch

    from etude.train.learner import Sample, packed_logprobs

    samples = [Sample(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), 0.0)
               for g in gens if g.token_ids]
    with torch.no_grad():
        lps = packed_logprobs(learner.model, samples, temperature, share_prefix=True)
    out = []
    for i, (lp, s) in enumerate(zip(lps, samples, strict=True)):
        d = lp.double() - torch.tensor(s.behav_logprobs, dtype=torch.float64)
        for j, x in enumerate(d.tolist()):
            w = math.exp(x)
            out.append({"condition": condition, "phase": phase, "sample": i, "token": j, "abs_dlogp": abs(x),
                        "is_weight": w, "truncated": int(w > is_cap), "below_inverse_cap": int(w < 1 / is_cap)})
    return out


def figures(conditions: dict[str, list[str]]) -> dict[str, dict]:
    """Per condition and phase: |Δ log p| mean, p50, p99, max; the IS weight's range and p1/p99;
    the shares truncated at the cap and below its inverse. Per vLLM dtype: the sync's seconds."""
    figs: dict[str, dict] = {}
    for cond, phases in conditions.items():
        for ph in phases:
            at, key = {"condition": cond, "phase": ph}, f"{cond}.{ph}"
            figs[f"{key}.mean_abs_dlogp"] = {"kind": "mean", "of": at, "field": "abs_dlogp"}
            for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
                figs[f"{key}.abs_dlogp_{name}"] = {"kind": "quantile", "of": at, "field": "abs_dlogp", "q": q}
            for name, q in (("min", 0.0), ("p1", 0.01), ("p99", 0.99), ("max", 1.0)):
                figs[f"{key}.is_weight_{name}"] = {"kind": "quantile", "of": at, "field": "is_weight", "q": q}
            figs[f"{key}.truncated_share"] = {"kind": "rate", "of": at, "field": "truncated"}
            figs[f"{key}.below_inverse_cap_share"] = {"kind": "rate", "of": at, "field": "below_inverse_cap"}
        if cond != "hf":
            figs[f"{cond}.weight_sync_s"] = {"kind": "quantile", "of": {"part": "sync", "condition": cond},
                                             "field": "seconds", "q": 0.5}
    return figs


def learner_step_stats(learner: Any, gens: list[Any]) -> dict[str, float]:
    """What the learner reports when it trains on these samples (advantages ±1 alternating)."""
    from etude.train.learner import Sample
    from etude.train.losses import token_weights

    samples = [Sample(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), 1.0 if i % 2 else -1.0)
               for i, g in enumerate(gens) if g.token_ids]
    for s, w in zip(samples, token_weights([len(s.completion_ids) for s in samples], "token_mean"), strict=True):
        s.weight = w
    st = learner.step(samples)
    return {k: st[k] for k in ("is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_truncated_frac", "train_s")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=2, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of the one step before the sync")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="vLLM engine dtypes; empty: the HF baseline alone")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="smoke run: the HF baseline alone on the tiny model "
                    "(2 prompts, 1 sample, 4 tokens, 1 thread; no vLLM)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/vllm_mismatch.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.prompts, args.n, args.max_tokens, args.dtypes, args.threads = "tiny", 2, 1, 4, "", 1
    dtypes = [d for d in args.dtypes.split(",") if d]
    started = time.time()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    torch.set_num_threads(args.threads)
    from etude.envs.families import make_env
    from etude.policy.local import LocalPolicy
    from etude.train.config import EnvConfig, TrainConfig
    from etude.train.learner import Learner

    cfg = TrainConfig(model=args.model, lr=args.lr, temperature=args.temperature, max_new_tokens=args.max_tokens,
                      env=EnvConfig(name="arith", num_train=max(args.prompts, 8)))
    problems = make_env(cfg.env).problems("train")[: args.prompts]
    convs = [list(p.messages) for p in problems]
    kw = dict(n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, top_p=1.0)
    is_cap = cfg.loss.is_cap
    meta: dict[str, Any] = {
        "what": "per-token behaviour vs learner log-probs (learner: fp32 packed forward, as in a training step)",
        "model": args.model, "prompts": len(convs), "samples_per_prompt": args.n, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "top_p": 1.0, "is_cap": is_cap, "torch_threads": args.threads,
        "torch": torch.__version__, "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)", "conditions": {}}
    records: list[dict[str, Any]] = []
    phases: dict[str, list[str]] = {}

    # Baseline: today's rollout path, LocalPolicy on the learner's model.
    learner = Learner(cfg)
    hf = LocalPolicy(learner.model, learner.tokenizer, id=args.model)
    t0 = time.perf_counter()
    # NOTE: n copies of each prompt with n=1: LocalPolicy's shared-prefill path (n > 1) passes
    # generate() a `cache=` argument that the transformers of .venv-vllm (5.19) does not accept.
    gens = hf.generate_batch([c for c in convs for _ in range(args.n)], (), seed=1, **{**kw, "n": 1})
    meta["conditions"]["hf"] = {"gen_s": time.perf_counter() - t0}
    records += mismatch(learner, gens, args.temperature, is_cap, "hf", "fresh")
    phases["hf"] = ["fresh"]
    print("hf: measured", file=sys.stderr, flush=True)

    if dtypes:
        import vllm

        from etude.policy.vllm_backend import VLLMPolicy, engine_state

        meta["vllm"] = vllm.__version__
    for dtype in dtypes:
        learner = Learner(cfg)  # fresh weights for each condition
        pol = VLLMPolicy(args.model, dtype=dtype, seed=0)
        name = f"vllm-{'fp32' if dtype == 'float32' else 'bf16' if dtype == 'bfloat16' else dtype}"
        try:
            t0 = time.perf_counter()
            gens = pol.generate_batch(convs, (), seed=1, **kw)
            cond: dict[str, Any] = {"engine_load_s": pol.load_s, "gen_s": time.perf_counter() - t0}
            records += mismatch(learner, gens, args.temperature, is_cap, name, "fresh")
            cond["learner_step"] = learner_step_stats(learner, gens)  # the learner's own IS statistics
            # The learner moved one step; the engine still has the old weights.
            stale = pol.generate_batch(convs, (), seed=2, **kw)
            records += mismatch(learner, stale, args.temperature, is_cap, name, "after_step_stale_engine")
            state = engine_state(learner.model)
            t0 = time.perf_counter()
            pol.load_weights(state)
            records.append({"part": "sync", "condition": name, "seconds": time.perf_counter() - t0})
            cond["weight_sync"] = {"tensors": len(state),
                                   "bytes_sent": sum(v.numel() for v in state.values())
                                   * torch.empty((), dtype=pol.llm.llm_engine.model_config.dtype).element_size(),
                                   "engine_restarted": False, "policy_version": pol.version}
            synced = pol.generate_batch(convs, (), seed=2, **kw)
            records += mismatch(learner, synced, args.temperature, is_cap, name, "after_step_synced_engine")
            meta["conditions"][name] = cond
            phases[name] = ["fresh", "after_step_stale_engine", "after_step_synced_engine"]
            print(f"{name}: measured", file=sys.stderr, flush=True)
        finally:
            pol.close()
            del pol
    prov = provenance(seeds={"generate": 1, "after_step": 2, "engine": 0}, started=started,
                      argv=["bench/vllm_mismatch.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(Path(args.out), figures(phases), records, prov, meta=meta)
    f = doc["figures"]
    for cond, phs in phases.items():
        for ph in phs:
            print(f"{cond} {ph}: mean |dlogp| {f[f'{cond}.{ph}.mean_abs_dlogp']['mean']:.3g}, truncated "
                  f"{f[f'{cond}.{ph}.truncated_share']['rate']:.3f}", file=sys.stderr)
    print(args.out)


if __name__ == "__main__":
    main()
