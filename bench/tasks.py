"""Task pipeline throughput: tasks produced per minute (synthesis, release mining), validity rate
per strategy, and grading time per task — ours beside a naive baseline measured in the same run.

Baseline for grading: what a grader without copy-on-write workspaces or test selection does — a
full copy of the template (`Workspace.create(kind="copy")`) and the whole test suite, vs ours
(overlay workspace, only the files holding FAIL_TO_PASS / PASS_TO_PASS). Both reach the same
verdict (checked). Everything runs in the real sandbox on real PyPI sdists; sdists and the test
venv are cached after the first run (the first run also pays the downloads).

    python bench/tasks.py [--synth-max 8] [--grade-n 5] [--no-mine] [--suite-sample 2]

It also re-grades a sample of the cached built-in suite (gold patch must resolve, base must not).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from rich.console import Console

from etude.envs.grade import grade
from etude.tasks import diffs, prepare_repo, task_env
from etude.tasks.runner import run_tests, statuses_for

OUT = Path(__file__).parent / "results" / "tasks.json"
console = Console(stderr=True)


def bench_synth(spec: str, max_tasks: int) -> tuple[dict, list]:
    from etude.tasks.synth import SynthConfig, synthesise

    stats: dict[str, dict[str, int]] = {}
    t0 = time.monotonic()
    with console.status(f"synthesising on {spec}") as st:
        tasks = synthesise(spec, cfg=SynthConfig(max_tasks=max_tasks, seed=0), progress=st.update, stats=stats)
    minutes = (time.monotonic() - t0) / 60
    validity = {k: {"tried": n, "kept": stats["kept"].get(k, 0), "rate": round(stats["kept"].get(k, 0) / n, 3)}
                for k, n in sorted(stats.get("tried", {}).items())}  # fmt: skip
    tried = sum(stats.get("tried", {}).values())
    return {
        "package": spec,
        "tasks": len(tasks),
        "mutants_tried": tried,
        "minutes": round(minutes, 2),
        "tasks_per_minute": round(len(tasks) / minutes, 2),
        "validity_overall": round(len(tasks) / tried, 3) if tried else None,
        "validity_per_strategy": validity,
    }, tasks


def bench_mine(package: str, v_from: str, v_to: str) -> dict:
    from etude.tasks.mine import mine

    t0 = time.monotonic()
    with console.status(f"mining {package} {v_from} -> {v_to}") as st:
        tasks = mine(package, v_from, v_to, max_trials=0, progress=st.update)
    minutes = (time.monotonic() - t0) / 60
    return {"pair": f"{package} {v_from}->{v_to}", "tasks": len(tasks), "minutes": round(minutes, 2),
            "tasks_per_minute": round(len(tasks) / minutes, 2),
            "fail_to_pass_per_task": [len(t.FAIL_TO_PASS) for t in tasks]}  # fmt: skip


def baseline_grade(task, patch: str) -> tuple[bool, float]:
    """Full copy of the template + the whole suite (what we compare our grader against)."""
    from etude.sandbox import Workspace

    t0 = time.monotonic()
    with Workspace.create(prepare_repo(task), kind="copy") as ws:
        diffs.apply_patch(ws.path, patch)
        diffs.apply_patch(ws.path, task.test_patch)
        run = run_tests(ws.path, task, task_env(task))
    f2p, p2p = statuses_for(run, task.FAIL_TO_PASS), statuses_for(run, task.PASS_TO_PASS)
    resolved = all(s == "passed" for s in [*f2p.values(), *p2p.values()])
    return resolved, time.monotonic() - t0


def bench_grading(tasks: list, n: int) -> dict:
    ours, base, agree = [], [], 0
    for t in tasks[:n]:
        g = grade(t, t.patch)
        ours.append(g.outcome.duration_s)
        resolved, secs = baseline_grade(t, t.patch)
        base.append(secs)
        agree += int(resolved == g.outcome.resolved)
    med_ours, med_base = statistics.median(ours), statistics.median(base)
    return {"tasks": len(ours), "median_s_ours": round(med_ours, 3), "median_s_baseline_copy_full_suite": round(med_base, 3),
            "speedup": round(med_base / med_ours, 2), "verdicts_agree": agree}  # fmt: skip


def bench_suite_sample(per_package: int) -> dict | None:
    """Gold patch and base of a few cached built-in-suite tasks per package, graded afresh."""
    import random

    from etude.tasks.schema import load_tasks
    from etude.tasks.suite import PACKAGES, package_file

    rng, rows = random.Random(7), []
    for pkg in PACKAGES:
        f = package_file(pkg)
        if not f.is_file():
            continue
        tasks = load_tasks(f)
        for t in rng.sample(tasks, min(per_package, len(tasks))):
            rows.append({"instance_id": t.instance_id, "gold_resolved": grade(t, t.patch).outcome.resolved,
                         "base_resolved": grade(t, "").outcome.resolved})  # fmt: skip
    if not rows:
        return None
    return {"sampled": len(rows), "gold_resolved": sum(r["gold_resolved"] for r in rows),
            "base_resolved": sum(r["base_resolved"] for r in rows), "rows": rows}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth-package", default="tinydb==4.8.2")
    ap.add_argument("--synth-max", type=int, default=8)
    ap.add_argument("--grade-n", type=int, default=5)
    ap.add_argument("--no-mine", action="store_true")
    ap.add_argument("--suite-sample", type=int, default=2, help="cached suite tasks per package to re-grade (0: none)")
    a = ap.parse_args()
    prepare_t0 = time.monotonic()
    synth, tasks = bench_synth(a.synth_package, a.synth_max)
    result = {
        "machine": {"python": platform.python_version(), "cpu_count": __import__("os").cpu_count(), "platform": platform.platform()},
        "synth": synth,
        "mine": None if a.no_mine else bench_mine("tinydb", "4.8.2", "4.9.0"),
        "grading": bench_grading(tasks, a.grade_n),
        "suite_sample": bench_suite_sample(a.suite_sample) if a.suite_sample else None,
        "wall_s": round(time.monotonic() - prepare_t0, 1),
        "note": "load from other processes on the machine inflates every figure alike; compare ours with baseline within a run",
    }  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
