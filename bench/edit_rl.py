"""Does more GRPO on the edit turn teach a specialised adapter to fix functions it never trained on?

Issue 30's held-out gain is bounded by one skill: with the buggy function on screen, writing the
right edit. `etude specialise` measured about 1 right fix in 59 applied attempts on held-out
functions, against 3-16% a sample on its train functions during RL (docs/specialise.md). This
bench asks whether a longer, stronger run of the specialisation's own stage 4 moves the held-out
rate, measured on that skill alone, many samples a task:

0. Both arms are probed as in 2; the start arm first. When it writes no applicable edit in any
   sample of the select slice, GRPO on the edit turn has no signal (every group's rewards tie: a
   first attempt from the 7-step SFT adapter of `etude demo` ran 5 steps with 0 edits in 160
   samples), so RL is not run unless `--force`, and the result holds the start arm alone.
1. From an `etude specialise` run past its SFT stage (`--run DIR`: tasks/train.jsonl, select.jsonl,
   heldout.jsonl, sft/adapter) on its base (`--base`), GRPO on the edit turn with the stage's own
   TrainConfig (etude.pipeline.specialise.rl_stage_config) for `--steps` steps at `--lr`,
   continued from the SFT adapter. The arm is the last checkpoint: nothing is chosen on held-out
   data (the select slice's greedy right fixes are logged every `--every` steps).
2. For every select and held-out task with a fix drill, the conversation up to its edit turn
   (etude.envs.fixturn.edit_turn_prompts: grep, then the function read through the real harness);
   `--samples` replies per task at `--temperature` from each arm (`start` = the SFT adapter,
   `rl` = the RL adapter, both merged into the base for vLLM), scored by score_edit, the score
   the RL env trains on.

    .venv-vllm/bin/python bench/edit_rl.py --run runs/demo/specialise --base runs/demo/sft/final \\
        --steps 30 --lr 1e-4

Writes bench/results/edit_rl.json and .records.jsonl through write_result: per arm and split the
right-fix, on-bug-line, edit-applies and parse rates over samples; rl vs start paired by (task,
sample) (exact McNemar) and by task (some right fix among the samples); the RL run's training
right-fix by step from its metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "run": "str",
    "base": "str",
    "steps": "int",
    "rl_not_run": "str|null",
    "lr": "float",
    "reward_weights": "dict",
    "samples": "int",
    "temperature": "float",
    "prompts": "dict",
    "select_right_fix_by_step": "list",
    "train_right_fix_by_step": "list",
    "rl_seconds": "float",
    "stages": "dict",
    "rule": "str",
}

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("well_formed", "attempted", "edits", "on_bug_line", "right_fix")


def train_rl(run: Path, base: str, out: Path, steps: int, lr: float, every: int, seed: int,
             weights: dict[str, float]) -> dict[str, Any]:
    from etude.pipeline.isolate import in_child
    from etude.pipeline.specialise import SpecialiseConfig, rl_stage_config
    from etude.train import train

    done = out / "summary.json"
    if done.is_file():
        old = json.loads(done.read_text())
        if old.get("weights", {}) != weights:
            raise SystemExit(f"{out} holds an RL run with reward weights {old.get('weights', {})}, not {weights}: "
                             "use another --work")
        return old
    extra = {"env.rewards.weights": weights} if weights else {}
    cfg = rl_stage_config(SpecialiseConfig.rl_config, run, base, str(run / "sft" / "adapter"), "vllm", lr=lr,
                          steps=steps, seed=seed, every=every, **extra)
    t0 = time.monotonic()
    res = in_child(train, cfg, out / "train", progress=True)
    summary = {"steps": res["steps"], "checkpoint": res["checkpoint"], "seconds": round(time.monotonic() - t0, 1),
               "select_right_fix": [{"step": e["step"], "right_fix": e.get("eval/successes")} for e in res["evals"]],
               "weights": weights}
    done.write_text(json.dumps(summary, indent=1))
    return summary


def training_curve(train_dir: Path) -> list[dict[str, Any]]:
    """By training step (metrics.jsonl of the RL run): the shares of samples whose reply was the
    right fix, an edit that applied (any of the three applying tiers) and well formed."""
    p = train_dir / "metrics.jsonl"
    rows = []
    for line in p.read_text().splitlines() if p.is_file() else []:
        r = json.loads(line)
        if "reward/right_fix" in r and "step" in r:
            applied = sum(r.get(f"reward/{k}", 0.0) for k in ("right_fix", "on_bug_line", "edits"))
            rows.append({"step": r["step"], "right_fix": r["reward/right_fix"], "applied_edits": round(applied, 4),
                         "well_formed": r.get("reward/well_formed")})
    return rows


def replies(model_dir: str, items: list[dict[str, Any]], samples: int, temperature: float, max_tokens: int,
            seed: int) -> list[list[str]]:
    from etude.evals.models import local_policy
    from etude.tools import tool_schemas

    pol = local_policy(model_dir, "vllm")
    out: list[list[str]] = []
    try:
        for i in range(0, len(items), 16):
            chunk = items[i:i + 16]
            gens = pol.generate_batch([it["messages"] for it in chunk], tool_schemas(), n=samples,
                                      max_tokens=max_tokens, temperature=temperature, seed=seed + i * samples)
            out += [[g.text for g in gens[j * samples:(j + 1) * samples]] for j in range(len(chunk))]
            print(f"{model_dir}: {len(out)}/{len(items)} prompts", file=sys.stderr, flush=True)
    finally:
        if hasattr(pol, "close"):
            pol.close()
    return out


def main() -> None:
    from etude.envs.fixturn import TIERS, edit_turn_prompts, score_edit
    from etude.evals.results import write_result
    from etude.provenance import provenance
    from etude.tasks.schema import load_tasks
    from etude.train.lora import merge_adapter_dir
    from etude.train.sft import load_sft_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a finished `etude specialise` run")
    ap.add_argument("--base", required=True, help="the model its adapter sits on")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--every", type=int, default=10, help="select-slice evaluations every this many steps")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7, help="the harness's sampling temperature")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="run RL even when the start arm never edits")
    ap.add_argument("--weights", default="", help="reward weights of the fix env over its defaults, e.g. "
                    "well_formed=-0.1 (a reply that does not try to edit below one that tries and misses)")
    ap.add_argument("--work", default="runs/bench_edit_rl")
    ap.add_argument("--out", default=str(RESULTS / "edit_rl.json"))
    a = ap.parse_args()
    run, work = Path(a.run), Path(a.work)
    weights: dict[str, float] = {}
    for kv in filter(None, (x.strip() for x in a.weights.split(","))):
        k, _, v = kv.partition("=")
        try:
            weights[k.strip()] = float(v)
        except ValueError:
            raise SystemExit(f"--weights {kv!r}: give TIER=NUMBER") from None
        if k.strip() not in TIERS:
            raise SystemExit(f"--weights: {k.strip()} is no tier of the fix env ({', '.join(TIERS)})")
    for need in ("sft/adapter", "tasks/train.jsonl", "tasks/select.jsonl", "tasks/heldout.jsonl"):
        if not (run / need).exists():
            raise SystemExit(f"--run {run}: not an `etude specialise` run past its SFT stage (no {need})")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    stages: dict[str, float] = {}

    t = time.monotonic()
    hc = load_sft_config("configs/agent_sft.toml", {}).harness_config()
    items = []
    for split in ("select", "heldout"):
        tasks = load_tasks(run / "tasks" / f"{split}.jsonl")
        items += [{**it, "split": split} for it in edit_turn_prompts(tasks, hc, work / f"drills-{split}.jsonl")]
    stages["prompts"] = round(time.monotonic() - t, 1)

    records: list[dict[str, Any]] = []

    def probe(arm: str, adapter: str) -> None:
        t = time.monotonic()
        merged = merge_adapter_dir(adapter, a.base, work / f"merged-{arm}")
        got = replies(str(merged), items, a.samples, a.temperature, hc.max_tokens_per_turn, a.seed)
        for it, texts in zip(items, got, strict=True):
            scores = [score_edit(x, it["src"], it["gold"], it["path"], it["bug_line"]) for x in texts]
            for k, sc in enumerate(scores):
                records.append({"record": "sample", "arm": arm, "split": it["split"], "task": it["task"], "sample": k,
                                "item": f"{it['task']}#{k}", **{f: int(bool(sc[f])) for f in FIELDS}})
            records.append({"record": "task", "arm": arm, "split": it["split"], "task": it["task"],
                            "any_right_fix": int(any(sc["right_fix"] for sc in scores)),
                            "right_fixes": sum(int(bool(sc["right_fix"])) for sc in scores)})
        stages[f"probe {arm}"] = round(time.monotonic() - t, 1)

    # the start arm first: GRPO on the edit turn learns nothing from a model that never edits there
    # (every group's rewards tie), and that is cheap to see before an hour of steps
    probe("start", str(run / "sft" / "adapter"))
    arms = ["start"]
    select_edits = sum(r["edits"] for r in records if r["record"] == "sample" and r["split"] == "select")
    rl: dict[str, Any] = {"steps": 0, "select_right_fix": [], "seconds": 0.0}
    stop = None
    if a.steps and not select_edits and not a.force:
        stop = (f"the start adapter wrote no applicable edit in {a.samples} samples of each select prompt: GRPO on "
                "the edit turn has no signal from it (train its SFT longer); RL not run (--force runs it)")
        print(f"edit_rl: {stop}", file=sys.stderr)
    elif a.steps:
        t = time.monotonic()
        rl = train_rl(run, a.base, work / "rl", a.steps, a.lr, a.every, a.seed, weights)
        stages["rl"] = round(time.monotonic() - t, 1)
        probe("rl", rl["checkpoint"])
        arms.append("rl")

    figures: dict[str, dict[str, Any]] = {}
    for split in ("select", "heldout"):
        for arm in arms:
            for f in FIELDS:
                figures[f"{split}.{arm}.{f}"] = {"kind": "rate", "of": {"record": "sample", "arm": arm, "split": split},
                                                 "field": f}
            figures[f"{split}.{arm}.any_right_fix"] = {"kind": "rate", "field": "any_right_fix",
                                                       "of": {"record": "task", "arm": arm, "split": split}}
        if "rl" in arms:
            figures[f"{split}.rl_vs_start.right_fix"] = {
                "kind": "paired", "a": {"record": "sample", "arm": "start", "split": split},
                "b": {"record": "sample", "arm": "rl", "split": split}, "key": "item", "field": "right_fix"}
            figures[f"{split}.rl_vs_start.any_right_fix"] = {
                "kind": "paired", "a": {"record": "task", "arm": "start", "split": split},
                "b": {"record": "task", "arm": "rl", "split": split}, "key": "task", "field": "any_right_fix"}
    meta = {"what": "GRPO on the edit turn (the specialisation's stage 4, longer), probed on the edit turn of "
                    "select and held-out functions; many samples a task", "run": str(run), "base": a.base,
            "steps": rl["steps"], "rl_not_run": stop, "lr": a.lr, "reward_weights": weights, "samples": a.samples, "temperature": a.temperature,
            "prompts": {s: sum(1 for it in items if it["split"] == s) for s in ("select", "heldout")},
            "select_right_fix_by_step": rl["select_right_fix"],
            "train_right_fix_by_step": training_curve(work / "rl" / "train") if "rl" in arms else [],
            "rl_seconds": rl["seconds"],
            "stages": stages,
            "rule": "the RL arm is the run's last checkpoint; whether RL runs depends on the select slice only; "
                    "held-out prompts are only scored"}
    doc = write_result(Path(a.out), figures, records, provenance(started=t0), meta=meta)
    for name, fig in doc["figures"].items():
        if name.endswith(("right_fix", "any_right_fix", "edits")):
            print(name, {k: fig.get(k) for k in ("k", "n", "rate", "a_k", "b_k", "p")})


if __name__ == "__main__":
    main()
