"""Does a change to the harness help a trained model? One model, the same held-out tasks, paired.

The baseline is an earlier `etude eval` run of the model (its harness is read from its run.json).
Each `--variant NAME:KEY=VALUE[,KEY=VALUE...]` is that harness with the changes, evaluated now
with the code as it is today. Per arm: resolved rate with its Wilson 95% interval, behaviour
(valid calls, repeated-turn share, turns, tokens), stop reasons; per pair of arms: exact McNemar p
on the paired tasks and how many tasks each arm alone resolved.

    VLLM_CPU_KVCACHE_SPACE=2 .venv-vllm/bin/python bench/harness_ablation.py \
        --model runs/gpu_sft/final --baseline runs/al_gpu/eval-sft --eval-backend vllm \
        --variant notice_off:repeat_notice=false --variant notice_on:repeat_notice=true \
        --baseline-note "evaluated before the 80-column agent terminal" \
        --out bench/results/harness_ablation.json

An arm's folder under --work resumes if interrupted. Differences in code since the baseline (not
harness fields) are not visible to this script: say them with --baseline-note.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from itertools import combinations
from pathlib import Path
from typing import Any

from etude.configfile import parse_set
from etude.envs.episode import AGENT_COLUMNS
from etude.errors import EtudeError
from etude.evals import EvalConfig, run_eval
from etude.evals.records import paired_outcomes, read_records, resolved_by_task
from etude.evals.stats import wilson_ci
from etude.evals.summary import behaviour
from etude.harness import HarnessConfig
from etude.tasks.curriculum import builtin_curriculum


def repeated_replies(run: Path, recs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Assistant replies identical to an earlier reply of the same episode, over all replies: the
    same measure for every arm (the harness's own `repeated_turns` also needs the same results,
    and a baseline evaluated before it existed does not have it)."""
    again = total = episodes = 0
    for r in recs.values():
        if not r.get("trajectory") or not (run / r["trajectory"]).is_file():
            continue
        traj = json.loads((run / r["trajectory"]).read_text().splitlines()[-1])
        replies = [(m.get("content") or "").strip() for m in traj["messages"] if m["role"] == "assistant"]
        repeats = len(replies) - len(set(replies))
        again, total, episodes = again + repeats, total + len(replies), episodes + (repeats > 0)
    lo, hi = wilson_ci(again, total) if total else (None, None)
    return {"mean": again / total if total else None, "ci_low": lo, "ci_high": hi, "k": again, "n": total,
            "episodes_with_a_repeat": episodes}


def arm_figures(run: Path) -> dict[str, Any]:
    recs = {iid: r for (iid, k), r in read_records(run / "results.jsonl").items() if k == 0}
    res = resolved_by_task(run)
    k, n = sum(res.values()), len(res)
    lo, hi = wilson_ci(k, n)
    return {"resolved": k, "tasks": n, "resolved_rate": k / n if n else None, "ci95": [lo, hi],
            "behaviour": behaviour({i: [r] for i, r in recs.items()}),
            "repeated_replies": repeated_replies(run, recs),
            "stop_reasons": dict(Counter((r.get("efficiency") or {}).get("stop_reason") for r in recs.values())),
            "errors": sum(1 for r in recs.values() if r.get("status") != "ok"), "eval_dir": str(run)}


def variant(spec: str) -> tuple[str, dict[str, Any]]:
    name, sep, sets = spec.partition(":")
    if not sep or not name.isidentifier():
        raise EtudeError(f"--variant expects NAME:KEY=VALUE[,KEY=VALUE...], got {spec!r}")
    return name, parse_set([s for s in sets.split(",") if s])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--baseline", required=True, metavar="EVAL_DIR", help="an earlier eval run of --model")
    ap.add_argument("--baseline-note", default="", help="what differed in code when the baseline ran")
    ap.add_argument("--variant", action="append", required=True, metavar="NAME:KEY=VALUE[,...]")
    ap.add_argument("--work", default="runs/harness_ablation")
    ap.add_argument("--out", default="bench/results/harness_ablation.json")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--eval-backend", default="hf", choices=("hf", "vllm"))
    args = ap.parse_args()
    try:
        base = Path(args.baseline)
        run = json.loads((base / "run.json").read_text())
        variants = dict(variant(v) for v in args.variant)
        if run.get("model") != args.model:
            raise EtudeError(f"--baseline {base} evaluated {run.get('model')!r}, not --model {args.model!r}")
        ids = list(run["instance_ids"])
        # a harness is chosen on validation data: the sealed test split is refused (etude.tasks.seal)
        test = {t.instance_id: t for t in builtin_curriculum("validation", 1, use="select")}
        if missing := [i for i in ids if i not in test]:
            raise EtudeError(f"--baseline {base}: {len(missing)} task(s) not in the built-in validation split "
                             "(a harness is chosen on validation tasks, never the sealed test split)")
        tasks = [test[i] for i in ids]
        old = dict(run["config"]["harness"])
        harnesses = {n: HarnessConfig(**{**old, **ch}) for n, ch in variants.items()}
    except (EtudeError, OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"harness_ablation: {e}") from None

    arms: dict[str, Any] = {"baseline": {**arm_figures(base), "harness": old, "note": args.baseline_note}}
    dirs = {"baseline": base}
    for name, hc in harnesses.items():
        out = Path(args.work) / name
        print(f"[harness_ablation {time.strftime('%H:%M:%S')}] {name}: {variants[name]}", file=sys.stderr, flush=True)
        t0 = time.time()
        cfg = EvalConfig(workers=args.workers, executor="threads", harness=hc, report=False, progress=True,
                         bootstrap=500, backend=args.eval_backend)
        run_eval(tasks, args.model, out, cfg, use="select")
        arms[name] = {**arm_figures(out), "changes": variants[name], "harness": hc.to_dict(), "wall_s": time.time() - t0}
        dirs[name] = out
    pairs = {f"{b}_vs_{a}": paired_outcomes(dirs[a], dirs[b]) for a, b in combinations(dirs, 2)}
    result = {
        "model": args.model, "tasks": len(tasks), "packages": sorted({t.instance_id.split("__")[0] for t in tasks}),
        "backend": args.eval_backend, "agent_terminal_columns": int(AGENT_COLUMNS), "arms": arms, "paired": pairs,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    for name, a in arms.items():
        b = a["behaviour"]
        print(f"{name:12s} {a['resolved']}/{a['tasks']} [{a['ci95'][0]:.1%}-{a['ci95'][1]:.1%}]  valid calls "
              f"{b['valid_call_rate']['mean']:.1%}  repeated replies {a['repeated_replies']['mean'] or 0:.1%}")
    for k, p in pairs.items():
        print(f"{k}: {p['gain_points'] * 100:+.1f} points, p = {p['mcnemar_p']:.3g} ({p['b_only']} vs {p['a_only']})")


if __name__ == "__main__":
    main()
