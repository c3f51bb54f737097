"""Routing replay vs free routing: how far the trainer's log-probs drift from the sampler's on a
small MoE, and what replay costs. Writes bench/results/moe_replay.json.

For each staleness s (optimizer updates applied between sampling and training, AdamW on a
random LM batch, like a learner running ahead of its rollout workers) it samples completions
through `generate` with the KV cache while recording routes, updates the weights s times, then
scores the same tokens with a full forward twice: replaying the recorded routes (ours) and
routing freely (the baseline). Reported: share of token×layer routes that free routing changes,
mean |Δ log-prob| vs the behaviour log-probs, and the share of tokens whose importance ratio
leaves [1/2, 2] (what truncated IS with cap 2 would clip). Overhead: median forward time with
and without the replay hooks (same model, same tokens).

    python bench/moe_replay.py [--arch qwen3_moe] [--staleness 0,1,4] [--quick]

Written through `etude.evals.results.write_result` (+ moe_replay.records.jsonl): one record per
sampled token and scoring (|Δ log-prob|, outside [1/2, 2] or not), one per token position and
scoring (the share of its layers whose route changed), one per timed forward; `bench/verify.py`
recomputes the means, shares and the median-over-median overhead ratio from them.
`--quick` is a smoke run (2 samples x 6 tokens, staleness 0 and 1, 3 timed forwards).
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
from etude.scale.moe import record_routing, replay_routing, routes_for_rows, tiny_moe


def sample(model, batch: int, prompt: int, new: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 256, (batch, prompt), generator=g)
    model.generation_config.eos_token_id = None
    torch.manual_seed(seed)
    with torch.no_grad(), record_routing(model) as rec:
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=True,
                             top_k=0, output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    comp = out.sequences[:, prompt:]
    behav = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1).gather(-1, comp[..., None])[..., 0]
    routes = torch.stack([r.tensor() for r in routes_for_rows(rec, prompt, [prompt] * batch, [new] * batch)], 1)
    return out.sequences, behav, routes  # routes [layers, batch, prompt + new - 1, k]


def score(model, seqs, prompt: int, routes):
    forced = None
    if routes is not None:  # the last position has no route: -1 = free
        pad = torch.full((*routes.shape[:2], 1, routes.shape[-1]), -1, dtype=torch.long)
        forced = torch.cat([routes, pad], 2)
    with torch.no_grad(), replay_routing(model, forced) as sess:
        logits = model(input_ids=seqs).logits[:, prompt - 1: -1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, seqs[:, prompt:, None])[..., 0]
    return lp, torch.stack(sess.used)


def drift_records(lp, behav, used, routes, staleness: int, scoring: str, prompt: int) -> list[dict]:
    """`used` and `routes`: [layers, batch, tokens - 1, k]; `lp`, `behav`: [batch, new]. One record
    per completion token (|Δ log-prob|, IS ratio outside [1/2, 2]) and one per position (the share
    of layers whose route free routing or replay changed)."""
    d = (lp - behav).abs()
    changed = (used.sort(-1).values != routes.sort(-1).values).any(-1).float().mean(0)  # [batch, tokens - 1]
    out = [{"part": "token", "staleness": staleness, "scoring": scoring, "sample": b, "pos": prompt + t,
            "abs_dlogp": float(d[b, t]), "is_outside": int(float(d[b, t]) > 0.6931)}
           for b in range(d.shape[0]) for t in range(d.shape[1])]
    out += [{"part": "route", "staleness": staleness, "scoring": scoring, "sample": b, "pos": t,
             "changed_frac": float(changed[b, t])} for b in range(changed.shape[0]) for t in range(changed.shape[1])]
    return out


def update(model, steps: int, lr: float, seed: int) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 99)
    model.train()
    for _ in range(steps):
        ids = torch.randint(3, 256, (4, 32), generator=g)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()


def overhead(model, seqs, routes, reps: int) -> list[dict]:
    """Timed forwards of the same tokens with and without the replay hooks, one record each."""
    pad = torch.full((*routes.shape[:2], 1, routes.shape[-1]), -1, dtype=torch.long)
    forced = torch.cat([routes, pad], 2)
    out = []
    pairs = [("free", None), ("replay", forced)]
    for i in range(reps + 1):  # the first round warms up and is dropped; order alternates
        for name, r in (pairs if i % 2 else pairs[::-1]):
            t0 = time.perf_counter()
            with torch.no_grad(), replay_routing(model, r) if r is not None else torch.no_grad():
                model(input_ids=seqs)
            if i:
                out.append({"part": "forward", "routing": name, "rep": i, "seconds": time.perf_counter() - t0})
    return out


def figures(staleness: list[int]) -> dict[str, dict]:
    figs: dict[str, dict] = {}
    for s in staleness:
        for scoring in ("replay", "free_baseline"):
            at = {"staleness": s, "scoring": scoring}
            figs[f"s{s}.{scoring}.route_changed_frac"] = {"kind": "mean", "of": {"part": "route", **at},
                                                          "field": "changed_frac"}
            figs[f"s{s}.{scoring}.mean_abs_dlogp"] = {"kind": "mean", "of": {"part": "token", **at}, "field": "abs_dlogp"}
            figs[f"s{s}.{scoring}.max_abs_dlogp"] = {"kind": "quantile", "of": {"part": "token", **at},
                                                     "field": "abs_dlogp", "q": 1.0}
            figs[f"s{s}.{scoring}.is_outside_frac"] = {"kind": "rate", "of": {"part": "token", **at},
                                                       "field": "is_outside"}
    figs["overhead.replay_over_free"] = {"kind": "ratio", "num": {"part": "forward", "routing": "replay"},
                                         "den": {"part": "forward", "routing": "free"}, "field": "seconds",
                                         "stat": "median"}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3_moe")
    ap.add_argument("--staleness", default="0,1,4")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="smoke run: staleness 0,1, 2 samples x 6 tokens, 3 reps")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "moe_replay.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.staleness, a.batch, a.prompt, a.new, a.reps = "0,1", 2, 8, 6, 3
    levels = [int(v) for v in a.staleness.split(",")]
    if 0 not in levels:
        raise SystemExit("bench/moe_replay.py: --staleness must include 0 (the overhead is timed there)")
    started = time.time()
    torch.set_num_threads(1)  # I time on one thread: on a shared 2-core host more threads only add noise
    records: list[dict] = []
    for s in levels:
        model = tiny_moe(a.arch, hidden=64, experts=8)
        seqs, behav, routes = sample(model, a.batch, a.prompt, a.new, seed=s)
        update(model, s, a.lr, seed=s)
        for name, r in (("replay", routes), ("free_baseline", None)):
            lp, used = score(model, seqs, a.prompt, r)
            used = used.reshape(routes.shape[0], a.batch, a.prompt + a.new, -1)[:, :, :-1]
            records += drift_records(lp, behav, used, routes, s, name, a.prompt)
        print(f"staleness {s}: scored", flush=True)
        if s == 0:
            records += overhead(model, seqs, routes, a.reps)
    meta = {"arch": a.arch, "model": "tiny random (hidden 64, 2 layers, 8 experts, top-2)", "lr": a.lr,
            "batch": a.batch, "prompt_tokens": a.prompt, "new_tokens": a.new, "timed_forwards_each": a.reps,
            "torch_threads": 1}
    prov = provenance(seeds={"sample": "staleness", "update": "staleness + 99"}, started=started,
                      argv=["bench/moe_replay.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(a.out, figures(levels), records, prov, meta=meta)
    f = doc["figures"]
    for s in levels:
        print(f"staleness {s}: routes changed free {f[f's{s}.free_baseline.route_changed_frac']['mean']:.4f} "
              f"replay {f[f's{s}.replay.route_changed_frac']['mean']:.4f}; mean |dlogp| free "
              f"{f[f's{s}.free_baseline.mean_abs_dlogp']['mean']:.4f} replay {f[f's{s}.replay.mean_abs_dlogp']['mean']:.4f}")
    print(json.dumps(f["overhead.replay_over_free"], indent=2))
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
