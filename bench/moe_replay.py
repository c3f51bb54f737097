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

    python bench/moe_replay.py [--arch qwen3_moe] [--staleness 0,1,4]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

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


def drift(lp, behav, used, routes) -> dict[str, float]:
    """`used` and `routes`: [layers, batch, tokens - 1, k]; `lp`, `behav`: [batch, new]."""
    d = lp - behav
    changed = (used.sort(-1).values != routes.sort(-1).values).any(-1).float().mean()
    return {"route_changed_frac": float(changed), "mean_abs_dlogp": float(d.abs().mean()),
            "max_abs_dlogp": float(d.abs().max()), "is_outside_[0.5,2]_frac": float((d.abs() > 0.6931).float().mean())}


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


def overhead(model, seqs, routes, reps: int) -> dict[str, float]:
    pad = torch.full((*routes.shape[:2], 1, routes.shape[-1]), -1, dtype=torch.long)
    forced = torch.cat([routes, pad], 2)
    times: dict[str, list[float]] = {"free": [], "replay": []}
    pairs = [("free", None), ("replay", forced)]
    for i in range(reps + 1):  # the first round warms up and is dropped; order alternates
        for name, r in (pairs if i % 2 else pairs[::-1]):
            t0 = time.perf_counter()
            with torch.no_grad(), replay_routing(model, r) if r is not None else torch.no_grad():
                model(input_ids=seqs)
            if i:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"forward_s_free": med["free"], "forward_s_replay": med["replay"], "replay_over_free": med["replay"] / med["free"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="qwen3_moe")
    ap.add_argument("--staleness", default="0,1,4")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=24)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "moe_replay.json")
    a = ap.parse_args()
    torch.set_num_threads(1)  # I time on one thread: on a shared 2-core host more threads only add noise
    res = {"machine": platform.platform(), "torch": torch.__version__, "arch": a.arch,
           "model": "tiny random (hidden 64, 2 layers, 8 experts, top-2)", "lr": a.lr, "by_staleness": {}}
    for s in (int(v) for v in a.staleness.split(",")):
        model = tiny_moe(a.arch, hidden=64, experts=8)
        seqs, behav, routes = sample(model, a.batch, a.prompt, a.new, seed=s)
        update(model, s, a.lr, seed=s)
        row = {}
        for name, r in (("replay", routes), ("free_baseline", None)):
            lp, used = score(model, seqs, a.prompt, r)
            used = used.reshape(routes.shape[0], a.batch, a.prompt + a.new, -1)[:, :, :-1]
            row[name] = drift(lp, behav, used, routes)
        res["by_staleness"][str(s)] = row
        print(f"staleness {s}: replay {row['replay']}  free {row['free_baseline']}", flush=True)
        if s == 0:
            res["overhead"] = overhead(model, seqs, routes, a.reps)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=2))
    print(json.dumps(res.get("overhead"), indent=2))


if __name__ == "__main__":
    main()
