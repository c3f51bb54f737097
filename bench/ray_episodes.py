"""Evaluation episodes per second: Ray tasks (policy in one actor) vs the thread pool, same tasks.

Measured in one run, on the same tasks (default: the first 8 of the built-in eval split), with
the oracle (a scripted policy writing the gold patch through the real tools), so the model is
not the bottleneck and what differs is the executor: for each worker count (1, 2, 4) and each
repeat, one `run_eval` per executor, interleaved so that a change of load hits both alike.
Episodes per second = episodes / wall time of `run_eval` (workspace + harness + grading +
adherence, and on Ray the policy actor's start, `policy_actor_start_s`, every turn's round trip
to it, and any Ray worker process it has to spawn: a node keeps about as many idle workers as it
has CPUs, so more episodes at once than cores start fresh processes that import etude). The bench
starts Ray once (its start, `ray_init_s`, is reported apart, as a long-lived process such as the
loop pays it once); `run_eval` then uses that Ray. One untimed run per executor first spawns Ray's
worker processes and builds the task templates. Both executors must resolve every task.

    python bench/ray_episodes.py [--suite FILE.jsonl | --max-tasks 8] [--workers 1 2 4] [--repeats 3]
                                 [--note TEXT] [--quick]   # writes bench/results/ray_episodes.json

Written through `etude.evals.results.write_result`: ray_episodes.json and
ray_episodes.records.jsonl, one record per run (executor, workers, repeat, wall seconds, episodes
per second), per episode (resolved), per policy-actor start and for `ray.init`; `bench/verify.py`
recomputes per worker count the median episodes per second of each executor and their ratio (Ray
over threads), and each executor's resolved rate. `--note` is kept in `meta` (what else ran on the
machine), never in a figure. Run it alone on the machine. `--quick` is a smoke run (2 tasks,
workers 1 and 2, one repeat).
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

from etude.evals import EvalConfig, run_eval
from etude.evals.raypool import RayEpisodes
from etude.evals.results import write_result
from etude.evals.runner import resolve_suite
from etude.provenance import provenance
from etude.tasks import prepare_repo

console = Console()
EXECUTORS = ("threads", "ray")


def one_run(tasks: list, executor: str, workers: int, out: Path, repeat: int | None = None) -> list[dict]:
    """One `run_eval`: its record (wall seconds, episodes per second) and one per episode (resolved);
    `repeat` None is a warm-up, whose records are not kept."""
    cfg = EvalConfig(workers=workers, executor=executor, report=False, progress=False)
    t0 = time.perf_counter()
    summary = run_eval(tasks, "oracle", out, cfg, use="final")
    wall = time.perf_counter() - t0
    n = summary["episodes"]
    rows = [json.loads(ln) for ln in (out / "results.jsonl").read_text().splitlines() if ln.strip()]
    at = {"executor": executor, "workers": workers, "repeat": repeat}
    return [{"measure": "run", **at, "seconds": wall, "episodes": n, "eps_per_s": n / wall,
             "errors": summary["errors"]},
            *({"measure": "episode", **at, "task": r["instance_id"], "seconds": r["episode_s"],
               "resolved": int(bool(r.get("resolved")))} for r in rows)]


def actor_start(out: Path) -> list[dict]:
    """Time to start and stop the policy actor of one run (a fixed cost per `run_eval`), 3 times."""
    recs = []
    for i in range(3):
        t0 = time.perf_counter()
        RayEpisodes("oracle", EvalConfig(workers=2), out).close()
        recs.append({"measure": "policy_actor_start", "trial": i, "seconds": time.perf_counter() - t0})
    return recs


def figures(workers: list[int]) -> dict[str, dict]:
    figs: dict[str, dict] = {}
    for w in workers:
        figs[f"w{w}.ray_over_threads_eps_per_s"] = {
            "kind": "ratio", "num": {"measure": "run", "executor": "ray", "workers": w},
            "den": {"measure": "run", "executor": "threads", "workers": w}, "field": "eps_per_s", "stat": "median"}
    for ex in EXECUTORS:
        figs[f"{ex}.resolved"] = {"kind": "rate", "of": {"measure": "episode", "executor": ex}, "field": "resolved"}
    figs["ray_init_s"] = {"kind": "quantile", "of": {"measure": "ray_init"}, "field": "seconds", "q": 0.5}
    figs["policy_actor_start_s"] = {"kind": "quantile", "of": {"measure": "policy_actor_start"}, "field": "seconds",
                                    "q": 0.5}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="builtin:eval")
    ap.add_argument("--max-tasks", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--note", default="", help="What else ran on the machine (saved in meta).")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 tasks, workers 1 and 2, one repeat")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ray_episodes.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.max_tasks, args.workers, args.repeats = 2, [1, 2], 1
    import ray

    started = time.time()
    load0 = os.getloadavg()
    tasks = resolve_suite(args.suite, args.max_tasks, use="final")  # the oracle and noop: nothing is chosen
    for t in tasks:
        prepare_repo(t)  # templates and venvs built before anything is timed
    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    records: list[dict] = [{"measure": "ray_init", "seconds": time.perf_counter() - t0}]
    try:
        with tempfile.TemporaryDirectory(prefix="etude-bench-ray-") as tmp:
            for ex in EXECUTORS:  # warm-up: Ray's worker processes import etude once
                one_run(tasks, ex, max(args.workers), Path(tmp) / f"warmup-{ex}")
            records += actor_start(Path(tmp))
            for rep in range(args.repeats):
                for w in args.workers:
                    for ex in EXECUTORS if rep % 2 == 0 else EXECUTORS[::-1]:
                        recs = one_run(tasks, ex, w, Path(tmp) / f"{ex}-w{w}-r{rep}", rep)
                        records += recs
                        console.print(f"{ex} workers={w} repeat={rep}: {recs[0]['eps_per_s']:.3f} episodes/s")
    finally:
        ray.shutdown()
    meta = {"policy": "oracle (scripted gold patch through the real tools)", "suite": args.suite,
            "tasks": [t.instance_id for t in tasks], "workers": args.workers, "repeats": args.repeats,
            "ray": ray.__version__, "ray_task_cpus": EvalConfig().ray_task_cpus, "cpus": os.cpu_count(),
            "load_start": load0, "load_end": os.getloadavg(), "note": args.note}
    prov = provenance(started=started, argv=["bench/ray_episodes.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(args.out, figures(args.workers), records, prov, meta=meta)
    f = doc["figures"]
    table = Table("workers", "threads ep/s", "ray ep/s", "ray / threads")
    for w in args.workers:
        r = f[f"w{w}.ray_over_threads_eps_per_s"]
        table.add_row(str(w), f"{r['den_value']:.3f}", f"{r['num_value']:.3f}", f"{r['value']:.2f}")
    console.print(table)
    console.print(f"ray.init {f['ray_init_s']['value']:.1f} s, policy actor {f['policy_actor_start_s']['value']:.2f} s "
                  f"per run; resolved: threads {f['threads.resolved']['k']}/{f['threads.resolved']['n']}, "
                  f"ray {f['ray.resolved']['k']}/{f['ray.resolved']['n']}; wrote {args.out}")


if __name__ == "__main__":
    main()
