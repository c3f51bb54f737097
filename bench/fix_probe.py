"""Fix probe: with the buggy function on screen, does the model write the right edit?

Held-out episodes mix three skills: finding the function, reading it, and choosing the fix. Stop
22's funnel showed the SFT models read the buggy line in half their episodes and still edited it
right in few. This probe measures the last skill alone, the same way for every model: for each
task, the fix drill's conversation (etude.envs.sources.drill_trajectories: grep for the function,
read it window by window, all through the real harness and tools) up to the edit turn; the model
writes that turn, greedy. Figures, each a rate over tasks with a Wilson 95% interval:
  well_formed   the reply parses as tool calls (etude.toolcalls.parse_hermes)
  edits         it holds an edit_file call on the buggy file whose old_str occurs once there
  on_bug_line   that old_str holds the buggy line
  right_fix     applying the edit gives the gold file (compared as Python ASTs, so layout aside)
and, per pair of models, the exact McNemar test on right_fix.

    .venv/bin/python bench/fix_probe.py --tasks runs/cur-test.jsonl --model sft=runs/gpu_sft/final \\
        --model drill=runs/gpu_drill/final --out bench/results/fix_probe.json [--backend vllm]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def score(reply: str, src: str, gold_src: str, path: str, bug_line: str) -> dict[str, bool]:
    """The probe's figures for one reply (see the module doc): `etude.envs.fixturn.score_edit`,
    the score the `fix` RL env trains on."""
    from etude.envs.fixturn import score_edit

    return score_edit(reply, src, gold_src, path, bug_line)


def prompts(tasks: list[Any], work: Path, hc: Any) -> list[dict[str, Any]]:
    """Per task that has a drill: the conversation before its edit turn and what scoring needs."""
    from etude.envs.fixturn import edit_turn_prompts

    return edit_turn_prompts(tasks, hc, work / "drill.jsonl")


def run_model(spec: str, items: list[dict[str, Any]], backend: str, max_tokens: int) -> list[str]:
    from etude.evals.models import local_policy
    from etude.tools import tool_schemas

    pol = local_policy(spec, backend)  # the engine `etude eval` samples a local model with
    replies: list[str] = []
    batch = 64 if backend == "vllm" else 4
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        gens = pol.generate_batch([it["messages"] for it in chunk], tool_schemas(), n=1, max_tokens=max_tokens,
                                  temperature=0.0)
        replies += [g.text for g in gens]
        print(f"{spec}: {len(replies)}/{len(items)}", file=sys.stderr, flush=True)
    if hasattr(pol, "close"):
        pol.close()
    return replies


def main(argv: list[str] | None = None) -> None:
    from etude.evals.stats import paired_summary, wilson_ci
    from etude.tasks.schema import load_tasks
    from etude.train.sft import load_sft_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", required=True, help="task file (e.g. the held-out split)")
    ap.add_argument("--model", action="append", required=True, metavar="NAME=PATH",
                    help="a model to probe (repeatable; smollm2 or a model directory)")
    ap.add_argument("--out", default="bench/results/fix_probe.json")
    ap.add_argument("--work", default="runs/fix_probe", help="where the drills are cached")
    ap.add_argument("--config", default="configs/agent_sft.toml", help="its [harness] is the drills' harness")
    ap.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    ap.add_argument("--max-tokens", type=int, default=0, help="per reply (0: the harness's max_tokens_per_turn)")
    args = ap.parse_args(argv)
    models = dict(m.split("=", 1) for m in args.model)
    tasks = load_tasks(args.tasks)
    hc = load_sft_config(args.config, {}).harness_config()
    items = prompts(tasks, Path(args.work), hc)
    args.max_tokens = args.max_tokens or hc.max_tokens_per_turn
    result: dict[str, Any] = {"tasks_file": args.tasks, "tasks": len(tasks), "probed": len(items),
                              "backend": args.backend, "max_tokens": args.max_tokens, "models": {}, "paired": {}}
    outcomes: dict[str, list[int]] = {}
    for name, spec in models.items():
        t0 = time.time()
        cache = Path(args.work) / f"replies-{name}.json"  # a rerun with the same model and tasks reads them
        kept = json.loads(cache.read_text()) if cache.is_file() else {}
        if (kept.get("path"), kept.get("max_tokens")) == (spec, args.max_tokens) and kept.get("tasks") == [it["task"] for it in items]:
            replies = kept["replies"]
        else:
            replies = run_model(spec, items, args.backend, args.max_tokens)
            cache.write_text(json.dumps({"path": spec, "max_tokens": args.max_tokens, "tasks": [it["task"] for it in items], "replies": replies}))
        scores = [score(r, it["src"], it["gold"], it["path"], it["bug_line"]) for r, it in zip(replies, items, strict=True)]
        figs = {}
        for key in ("well_formed", "edits", "on_bug_line", "right_fix"):
            k = sum(s[key] for s in scores)
            figs[key] = {"k": k, "rate": k / len(items), "ci95": list(wilson_ci(k, len(items)))}
        outcomes[name] = [int(s["right_fix"]) for s in scores]
        result["models"][name] = {"path": spec, **figs, "wall_s": round(time.time() - t0, 1),
                                  "right": [it["task"] for it, s in zip(items, scores, strict=True) if s["right_fix"]]}
        print(name, {k: f"{v['k']}/{len(items)}" for k, v in figs.items()}, flush=True)
    names = list(models)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            result["paired"][f"{b}_vs_{a}"] = paired_summary(outcomes[a], outcomes[b])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["paired"]))


if __name__ == "__main__":
    main()
