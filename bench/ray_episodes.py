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
                                 [--note TEXT]   # writes bench/results/ray_episodes.json
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

from etude.evals import EvalConfig, run_eval
from etude.evals.runner import resolve_suite
from etude.tasks import prepare_repo

console = Console()
EXECUTORS = ("threads", "ray")


def one_run(tasks: list, executor: str, workers: int, out: Path) -> dict:
    cfg = EvalConfig(workers=workers, executor=executor, report=False, progress=False)
    t0 = time.perf_counter()
    summary = run_eval(tasks, "oracle", out, cfg)
    wall = time.perf_counter() - t0
    n = summary["episodes"]
    episode_s = [json.loads(ln)["episode_s"] for ln in (out / "results.jsonl").read_text().splitlines()]
    return {"wall_s": wall, "episodes": n, "eps_per_s": n / wall, "episode_s_median": statistics.median(episode_s),
            "errors": summary["errors"], "resolved_rate": summary["correctness"]["resolved_rate"]["mean"]}  # fmt: skip


def actor_start_s(tasks: list, out: Path) -> float:
    """Median time to start and stop the policy actor of one run (a fixed cost per `run_eval`)."""
    from etude.evals.raypool import RayEpisodes

    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        RayEpisodes("oracle", EvalConfig(workers=2), out).close()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--suite", default="builtin:eval")
    ap.add_argument("--max-tasks", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--note", default="", help="What else ran on the machine (saved with the figures).")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ray_episodes.json")
    args = ap.parse_args()
    import ray

    load0 = os.getloadavg()
    tasks = resolve_suite(args.suite, args.max_tasks)
    for t in tasks:
        prepare_repo(t)  # templates and venvs built before anything is timed
    t0 = time.perf_counter()
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0
    runs: dict[str, list[dict]] = {f"{ex}-w{w}": [] for w in args.workers for ex in EXECUTORS}
    try:
        with tempfile.TemporaryDirectory(prefix="etude-bench-ray-") as tmp:
            for ex in EXECUTORS:  # warm-up: Ray's worker processes import etude once
                one_run(tasks, ex, max(args.workers), Path(tmp) / f"warmup-{ex}")
            actor_s = actor_start_s(tasks, Path(tmp))
            for rep in range(args.repeats):
                for w in args.workers:
                    for ex in EXECUTORS if rep % 2 == 0 else EXECUTORS[::-1]:
                        r = one_run(tasks, ex, w, Path(tmp) / f"{ex}-w{w}-r{rep}")
                        runs[f"{ex}-w{w}"].append(r)
                        console.print(f"{ex} workers={w} repeat={rep}: {r['eps_per_s']:.3f} episodes/s")
    finally:
        ray.shutdown()
    per_workers = {}
    for w in args.workers:
        med = {ex: statistics.median(r["eps_per_s"] for r in runs[f"{ex}-w{w}"]) for ex in EXECUTORS}
        per_workers[str(w)] = {"threads_eps_per_s": med["threads"], "ray_eps_per_s": med["ray"],
                               "ray_over_threads": med["ray"] / med["threads"]}  # fmt: skip
    ok = all(r["resolved_rate"] == 1.0 and r["errors"] == 0 for rs in runs.values() for r in rs)
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "ray": ray.__version__,
            "load_start": load0,
            "load_end": os.getloadavg(),
            "note": args.note,
        },
        "policy": "oracle (scripted gold patch through the real tools)",
        "tasks": [t.instance_id for t in tasks],
        "repeats": args.repeats,
        "ray_init_s": ray_init_s,
        "policy_actor_start_s": actor_s,
        "ray_task_cpus": EvalConfig().ray_task_cpus,
        "median_by_workers": per_workers,
        "every_run_resolved_everything": ok,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    table = Table("workers", "threads ep/s", "ray ep/s", "ray / threads")
    for w, m in per_workers.items():
        table.add_row(w, f"{m['threads_eps_per_s']:.3f}", f"{m['ray_eps_per_s']:.3f}", f"{m['ray_over_threads']:.2f}")
    console.print(table)
    console.print(f"ray.init {ray_init_s:.1f} s, policy actor {actor_s:.2f} s per run; "
                  f"every run resolved everything: {ok}; wrote {args.out}")  # fmt: skip


if __name__ == "__main__":
    main()
