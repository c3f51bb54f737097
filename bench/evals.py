"""Evaluation benchmark: what `etude eval` costs per episode beside bare grading, and what the
baselines score.

Measured in one run, on the same tasks (default: the first 3 of the built-in eval split):
- baseline: `grade_patch(task, gold)` alone — what a SWE-bench-style harness does to check a
  gold patch (a clean workspace, test patch, the tests in the sandbox);
- ours: an `etude eval --model oracle` episode (workspace + harness + tool calls + grading +
  reward + adherence), median `episode_s`, and its ratio to the baseline;
- adherence analysis alone (patch_facts of the gold patch: parse, duplicates, imports, ruff, style);
- run wall time with 1 and 2 workers (the machine has 2 shared cores, so expect < 2x);
- correctness of the baselines: oracle resolved rate (must be 1.0) and noop (must be 0.0).
The machine is shared: the load average is recorded at start and end; run it alone on the machine.

    python bench/evals.py [--suite FILE.jsonl | --max-tasks 3] [--quick] [--out FILE]

Written through `etude.evals.results.write_result`: evals.json and evals.records.jsonl, one record
per timed grading, adherence analysis and episode (with its resolved and adherence outcome) and
one per run (its wall seconds); `bench/verify.py` recomputes the medians, their ratios, the
workers' speed-up and the resolved rates from them. `--quick` is a smoke run on 1 task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from etude.envs import grade_patch
from etude.evals import EvalConfig, run_eval
from etude.evals.adherence import patch_facts
from etude.evals.results import write_result
from etude.evals.runner import resolve_suite
from etude.provenance import provenance
from etude.tasks import prepare_repo

console = Console()


def timed(fn, *a, **kw) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t0, out


RUNS = (("oracle", 1), ("oracle", 2), ("noop", 2))


def episode_records(out: Path, run: str) -> list[dict]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return [{"measure": "episode", "run": run, "task": r["instance_id"], "seconds": r["episode_s"],
             "resolved": int(bool(r.get("resolved"))), "adherence": (r.get("adherence") or {}).get("score")}
            for r in rows]


def figures(records: list[dict]) -> dict[str, dict]:
    figs: dict[str, dict] = {
        "episode_over_grade": {"kind": "ratio", "num": {"measure": "episode", "run": "oracle-w1"},
                               "den": {"measure": "grade_only"}, "field": "seconds", "stat": "median"},
        "adherence_median_s": {"kind": "quantile", "of": {"measure": "adherence_analysis"}, "field": "seconds",
                               "q": 0.5},
        "workers_speedup": {"kind": "ratio", "num": {"measure": "run_wall", "run": "oracle-w1"},
                            "den": {"measure": "run_wall", "run": "oracle-w2"}, "field": "seconds"},
    }
    for model, workers in RUNS:
        run = f"{model}-w{workers}"
        figs[f"{run}.resolved"] = {"kind": "rate", "of": {"measure": "episode", "run": run}, "field": "resolved"}
    if all(r["adherence"] is not None for r in records if r.get("run") == "oracle-w1" and r["measure"] == "episode"):
        figs["oracle-w1.adherence"] = {"kind": "mean", "of": {"measure": "episode", "run": "oracle-w1"},
                                       "field": "adherence"}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="builtin:eval")
    ap.add_argument("--max-tasks", type=int, default=3)
    ap.add_argument("--executor", default="threads", choices=("threads", "ray"),
                    help="episodes on the thread pool (default: the cost of an episode, not of Ray's round trips; "
                         "bench/ray_episodes.py compares the two) or on Ray")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 task")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "evals.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_tasks = 1
    started = time.time()
    load0 = os.getloadavg()
    tasks = resolve_suite(args.suite, args.max_tasks, use="final")  # timing of fixed policies: nothing is chosen
    for t in tasks:
        prepare_repo(t)  # templates and venvs built before anything is timed
    records = [{"measure": "grade_only", "task": t.instance_id, "seconds": timed(grade_patch, t, t.patch)[0]}
               for t in tasks]
    records += [{"measure": "adherence_analysis", "task": t.instance_id,
                 "seconds": timed(patch_facts, prepare_repo(t), t.patch)[0]} for t in tasks]
    with tempfile.TemporaryDirectory() as tmp:
        for model, workers in RUNS:
            out = Path(tmp) / f"{model}-{workers}"
            cfg = EvalConfig(workers=workers, executor=args.executor, report=False, progress=False)
            wall, _ = timed(run_eval, tasks, model, out, cfg, use="final")
            run = f"{model}-w{workers}"
            records.append({"measure": "run_wall", "run": run, "workers": workers, "seconds": wall})
            records += episode_records(out, run)
    meta = {"suite": args.suite, "executor": args.executor, "tasks": [t.instance_id for t in tasks], "cpus": os.cpu_count(),
            "load_start": load0, "load_end": os.getloadavg()}
    prov = provenance(started=started, argv=["bench/evals.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(args.out, figures(records), records, prov, meta=meta)
    f = doc["figures"]
    table = Table("figure", "value")
    eg = f["episode_over_grade"]
    table.add_row("grade only, median s (baseline)", f"{eg['den_value']:.3f}")
    table.add_row("oracle episode, median s", f"{eg['num_value']:.3f}")
    table.add_row("episode over grade", f"{eg['value']:.3f}")
    table.add_row("adherence analysis, median s", f"{f['adherence_median_s']['value']:.3f}")
    table.add_row("workers speed-up (1 -> 2)", f"{f['workers_speedup']['value']:.3f}")
    for model, workers in RUNS:
        r = f[f"{model}-w{workers}.resolved"]
        table.add_row(f"{model}-w{workers} resolved", f"{r['k']}/{r['n']}")
    console.print(table)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
