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
The machine is shared: the load average is recorded at start and end.

    python bench/evals.py [--suite FILE.jsonl | --max-tasks 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from etude.envs import grade_patch
from etude.evals import EvalConfig, run_eval
from etude.evals.adherence import patch_facts
from etude.evals.runner import resolve_suite
from etude.tasks import prepare_repo

console = Console()


def timed(fn, *a, **kw) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return time.perf_counter() - t0, out


def episode_seconds(out: Path) -> list[float]:
    return [json.loads(line)["episode_s"] for line in (out / "results.jsonl").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="builtin:eval")
    ap.add_argument("--max-tasks", type=int, default=3)
    args = ap.parse_args()
    load0 = os.getloadavg()
    tasks = resolve_suite(args.suite, args.max_tasks)
    for t in tasks:
        prepare_repo(t)  # templates and venvs built before anything is timed
    grade_s = [timed(grade_patch, t, t.patch)[0] for t in tasks]
    adh_s = [timed(patch_facts, prepare_repo(t), t.patch)[0] for t in tasks]
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for model, workers in (("oracle", 1), ("oracle", 2), ("noop", 2)):
            out = Path(tmp) / f"{model}-{workers}"
            cfg = EvalConfig(workers=workers, report=False, progress=False)
            wall, summary = timed(run_eval, tasks, model, out, cfg)
            runs[f"{model}-w{workers}"] = {"wall_s": wall, "episode_s": episode_seconds(out),
                                           "resolved_rate": summary["correctness"]["resolved_rate"]["mean"],
                                           "adherence": summary["adherence"]["score"]["mean"]}  # fmt: skip
    ours = statistics.median(runs["oracle-w1"]["episode_s"])
    base = statistics.median(grade_s)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_start": load0,
            "load_end": os.getloadavg(),
        },  # fmt: skip
        "tasks": [t.instance_id for t in tasks],
        "baseline_grade_only_median_s": base,
        "oracle_episode_median_s": ours,
        "episode_over_grade_ratio": ours / base,
        "adherence_median_s": statistics.median(adh_s),
        "runs": runs,
        "workers_speedup": runs["oracle-w1"]["wall_s"] / runs["oracle-w2"]["wall_s"],
    }
    out = Path(__file__).parent / "results" / "evals.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table("figure", "value")
    for k in ("baseline_grade_only_median_s", "oracle_episode_median_s", "episode_over_grade_ratio",
              "adherence_median_s", "workers_speedup"):  # fmt: skip
        table.add_row(k, f"{result[k]:.3f}")
    for name, r in runs.items():
        table.add_row(
            f"{name} resolved / adherence / wall", f"{r['resolved_rate']} / {r['adherence']} / {r['wall_s']:.1f} s"
        )
    console.print(table)
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
