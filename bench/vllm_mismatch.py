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

Writes bench/results/vllm_mismatch.json. Run on a shared 2-core machine: read ratios, not times.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _quantiles(x: Any) -> dict[str, float]:
    import torch

    q = torch.tensor([0.01, 0.05, 0.5, 0.95, 0.99], dtype=torch.float64)
    v = torch.quantile(x.double(), q).tolist()
    return {"min": float(x.min()), "p1": v[0], "p5": v[1], "p50": v[2], "p95": v[3], "p99": v[4],
            "max": float(x.max()), "mean": float(x.mean()), "std": float(x.std())}


def mismatch(learner: Any, gens: list[Any], temperature: float, is_cap: float) -> dict[str, Any]:
    """Per-token comparison of behaviour log-probs with the learner's recomputation."""
    import torch

    from etude.train.learner import Sample, packed_logprobs

    samples = [Sample(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), 0.0)
               for g in gens if g.token_ids]
    with torch.no_grad():
        lps = packed_logprobs(learner.model, samples, temperature, share_prefix=True)
    learner_lp = torch.cat([lp.double() for lp in lps])
    behav = torch.cat([torch.tensor(s.behav_logprobs, dtype=torch.float64) for s in samples])
    d = learner_lp - behav
    ratio = torch.exp(d)
    return {"samples": len(samples), "tokens": int(d.numel()),
            "abs_dlogp": {"mean": float(d.abs().mean()), "p50": float(d.abs().median()),
                          "p99": float(torch.quantile(d.abs(), 0.99)), "max": float(d.abs().max())},
            "mean_dlogp": float(d.mean()),
            "is_weight": _quantiles(ratio),
            "truncated_share": float((ratio > is_cap).double().mean()),
            "below_inverse_cap_share": float((ratio < 1 / is_cap).double().mean())}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=2, help="samples per prompt")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of the one step before the sync")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench/results/vllm_mismatch.json"))
    args = ap.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    import torch

    torch.set_num_threads(args.threads)
    import vllm

    from etude.envs.families import make_env
    from etude.policy.local import LocalPolicy
    from etude.policy.vllm_backend import VLLMPolicy, engine_state
    from etude.train.config import EnvConfig, TrainConfig
    from etude.train.learner import Learner

    cfg = TrainConfig(model=args.model, lr=args.lr, temperature=args.temperature, max_new_tokens=args.max_tokens,
                      env=EnvConfig(name="arith", num_train=max(args.prompts, 8)))
    problems = make_env(cfg.env).problems("train")[: args.prompts]
    convs = [list(p.messages) for p in problems]
    kw = dict(n=args.n, max_tokens=args.max_tokens, temperature=args.temperature, top_p=1.0)
    is_cap = cfg.loss.is_cap
    res: dict[str, Any] = {
        "what": "per-token behaviour vs learner log-probs (learner: fp32 packed forward, as in a training step)",
        "model": args.model, "prompts": len(convs), "samples_per_prompt": args.n, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "top_p": 1.0, "is_cap": is_cap, "torch_threads": args.threads,
        "vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)", "conditions": {}}

    # Baseline: today's rollout path, LocalPolicy on the learner's model.
    learner = Learner(cfg)
    hf = LocalPolicy(learner.model, learner.tokenizer, id=args.model)
    t0 = time.perf_counter()
    # NOTE: n copies of each prompt with n=1: LocalPolicy's shared-prefill path (n > 1) passes
    # generate() a `cache=` argument that the transformers of .venv-vllm (5.19) does not accept.
    gens = hf.generate_batch([c for c in convs for _ in range(args.n)], (), seed=1, **{**kw, "n": 1})
    res["conditions"]["hf"] = {"gen_s": time.perf_counter() - t0, **mismatch(learner, gens, args.temperature, is_cap)}
    print("hf", json.dumps(res["conditions"]["hf"]["abs_dlogp"]), file=sys.stderr, flush=True)

    for dtype in [d for d in args.dtypes.split(",") if d]:
        learner = Learner(cfg)  # fresh weights for each condition
        pol = VLLMPolicy(args.model, dtype=dtype, seed=0)
        name = f"vllm-{'fp32' if dtype == 'float32' else 'bf16' if dtype == 'bfloat16' else dtype}"
        try:
            t0 = time.perf_counter()
            gens = pol.generate_batch(convs, (), seed=1, **kw)
            cond = {"engine_load_s": pol.load_s, "gen_s": time.perf_counter() - t0,
                    **mismatch(learner, gens, args.temperature, is_cap)}
            cond["learner_step"] = learner_step_stats(learner, gens)  # the learner's own IS statistics
            # The learner moved one step; the engine still has the old weights.
            stale = pol.generate_batch(convs, (), seed=2, **kw)
            cond["after_step_stale_engine"] = mismatch(learner, stale, args.temperature, is_cap)
            state = engine_state(learner.model)
            t0 = time.perf_counter()
            pol.load_weights(state)
            cond["weight_sync"] = {"s": time.perf_counter() - t0, "tensors": len(state),
                                   "bytes_sent": sum(v.numel() for v in state.values())
                                   * torch.empty((), dtype=pol.llm.llm_engine.model_config.dtype).element_size(),
                                   "engine_restarted": False, "policy_version": pol.version}
            synced = pol.generate_batch(convs, (), seed=2, **kw)
            cond["after_step_synced_engine"] = mismatch(learner, synced, args.temperature, is_cap)
            res["conditions"][name] = cond
            print(name, json.dumps(cond["abs_dlogp"]), "sync", round(cond["weight_sync"]["s"], 3),
                  "stale", round(cond["after_step_stale_engine"]["abs_dlogp"]["mean"], 4),
                  "synced", round(cond["after_step_synced_engine"]["abs_dlogp"]["mean"], 4), file=sys.stderr, flush=True)
        finally:
            pol.close()
            del pol
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
