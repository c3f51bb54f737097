"""Prefix KV reuse across an agent's turns (etude.policy.prefix): cost of replaying real episodes.

Takes the trajectories of an `etude eval` run (OUT/trajectories/*.jsonl: the messages the harness
sent), and replays every turn's prompt through `LocalPolicy` twice, greedy, the same model:
- baseline: no reuse (every turn prefills the whole conversation, what LocalPolicy did before);
- ours: the default prefix cache (turn k+1 prefills only what turn k did not cover).
Several conversations are replayed side by side, turn by turn, as the eval's batcher would send
them (one `generate_ids` call per turn index over the conversations still going).
Reported: seconds per replay (median of --repeats), prompt tokens fed to the model, the
speed-up, and the share of turns whose greedy tokens are identical in both modes.

    .venv/bin/python bench/prefix_reuse.py --run runs/al2/eval-sft [--model runs/al2/sft/final] [--conversations 8]

Writes bench/results/prefix_reuse.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from etude.policy.local import LocalPolicy
from etude.types import Message


def conversations(run: Path, k: int, min_turns: int) -> list[list[list[Message]]]:
    """Per episode, the prompt (messages so far) of each assistant turn."""
    out = []
    for f in sorted((run / "trajectories").glob("*.jsonl")):
        rec = json.loads(f.read_text().splitlines()[0])
        msgs = [Message(role=m["role"], content=m.get("content") or "", tool_call_id=m.get("tool_call_id"),
                        name=m.get("name")) for m in rec["messages"]]
        turns = [msgs[:i] for i, m in enumerate(msgs) if m.role == "assistant"]
        if len(turns) >= min_turns:
            out.append(turns)
        if len(out) == k:
            break
    return out


def replay(pol: LocalPolicy, convs: list[list[list[Message]]], max_tokens: int) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    outs: list[list[int]] = []
    for t in range(max(len(c) for c in convs)):
        prompts = [pol.encode_prompt(c[t]) for c in convs if t < len(c)]
        outs += [list(g.token_ids) for g in pol.generate_ids(prompts, max_tokens=max_tokens, temperature=0)]
    return time.perf_counter() - t0, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/al2/eval-sft")
    ap.add_argument("--model", default=None, help="default: the run's model (run.json)")
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--min-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results/prefix_reuse.json")
    args = ap.parse_args()
    run = Path(args.run)
    model = args.model or json.loads((run / "run.json").read_text())["model"]
    convs = conversations(run, args.conversations, args.min_turns)
    if not convs:
        raise SystemExit(f"no episode with {args.min_turns}+ turns under {run}/trajectories")
    base = LocalPolicy.from_pretrained(model, dtype=torch.bfloat16, id="bench")
    plain = LocalPolicy(base.model, base.tokenizer, prefix_cache_tokens=0)
    res: dict[str, Any] = {}
    for name, pol in (("baseline_no_reuse", plain), ("ours_prefix_reuse", base)):
        walls, fed, toks = [], [], None
        for _ in range(args.repeats):
            if pol.prefix_cache is not None:
                pol.prefix_cache.clear()
                pol.prefix_cache.fed_tokens = 0
            wall, toks = replay(pol, convs, args.max_tokens)
            walls.append(wall)
            fed.append(pol.prefix_cache.fed_tokens if pol.prefix_cache is not None else
                       sum(len(pol.encode_prompt(p)) for c in convs for p in c))
        res[name] = {"seconds": walls, "median_s": statistics.median(walls), "prompt_tokens_fed": fed[-1],
                     "outputs": toks}
    a, b = res["baseline_no_reuse"], res["ours_prefix_reuse"]
    same = sum(x == y for x, y in zip(a.pop("outputs"), b.pop("outputs"), strict=True))
    turns = sum(len(c) for c in convs)
    result = {
        "bench": "prefix_reuse", "model": model, "run": str(run), "conversations": len(convs), "turns": turns,
        "max_tokens": args.max_tokens, "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                   "torch": torch.__version__, "platform": platform.platform()},
        "baseline_no_reuse": a, "ours_prefix_reuse": b,
        "speedup_median": a["median_s"] / b["median_s"],
        "prompt_tokens_fed_ratio": b["prompt_tokens_fed"] / a["prompt_tokens_fed"],
        "greedy_turns_identical": same / turns,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine",)}, indent=1))


if __name__ == "__main__":
    main()
