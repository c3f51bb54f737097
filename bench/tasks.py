"""Task pipeline throughput: tasks produced per minute (synthesis, release mining), validity rate
per strategy, and grading time per task — ours beside a naive baseline measured in the same run.

Baseline for grading: what a grader without copy-on-write workspaces or test selection does — a
full copy of the template (`Workspace.create(kind="copy")`) and the whole test suite, vs ours
(overlay workspace, only the files holding FAIL_TO_PASS / PASS_TO_PASS). Both reach the same
verdict (checked). Everything runs in the real sandbox on real PyPI sdists; sdists and the test
venv are cached after the first run (the first run also pays the downloads).

    python bench/tasks.py [--synth-max 8] [--grade-n 5] [--no-mine] [--suite-sample 2] [--quick] [--out FILE]

It also re-grades a sample of the cached built-in suite (gold patch must resolve, base must not).
Written through `etude.evals.results.write_result`: tasks.json and tasks.records.jsonl — per
mutant tried, its strategy and whether it was kept (from synthesis's per-strategy counts); per
synthesis and mining run, tasks, minutes and tasks per minute; per graded task, each grader's
seconds and verdict; per sampled suite task, gold and base resolved. `bench/verify.py` recomputes
the validity rates, the grading speed-up (median baseline over median ours), the verdict
agreement and the suite sample's rates from them. The machine is shared: run it alone.
`--quick` is a smoke run: 1 synthesised task, 1 graded, no mining, no suite sample.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from etude.envs.grade import grade
from etude.evals.results import write_result
from etude.provenance import provenance
from etude.tasks import diffs, prepare_repo, task_env
from etude.tasks.runner import run_tests, statuses_for

OUT = Path(__file__).parent / "results" / "tasks.json"
console = Console(stderr=True)


def bench_synth(spec: str, max_tasks: int) -> tuple[list[dict], list]:
    from etude.tasks.synth import SynthConfig, synthesise

    stats: dict[str, dict[str, int]] = {}
    t0 = time.monotonic()
    with console.status(f"synthesising on {spec}") as st:
        tasks = synthesise(spec, cfg=SynthConfig(max_tasks=max_tasks, seed=0), progress=st.update, stats=stats)
    minutes = (time.monotonic() - t0) / 60
    # synthesis counts mutants per strategy (tried, kept): one record per mutant, in that order
    recs = [{"measure": "synth_mutant", "package": spec, "strategy": k, "kept": int(i < stats.get("kept", {}).get(k, 0))}
            for k, n in sorted(stats.get("tried", {}).items()) for i in range(n)]
    recs.append({"measure": "synth_run", "package": spec, "tasks": len(tasks), "minutes": minutes,
                 "tasks_per_minute": len(tasks) / minutes})
    return recs, tasks


def bench_mine(package: str, v_from: str, v_to: str) -> list[dict]:
    from etude.tasks.mine import mine

    t0 = time.monotonic()
    with console.status(f"mining {package} {v_from} -> {v_to}") as st:
        tasks = mine(package, v_from, v_to, max_trials=0, progress=st.update)
    minutes = (time.monotonic() - t0) / 60
    return [{"measure": "mine_run", "pair": f"{package} {v_from}->{v_to}", "tasks": len(tasks), "minutes": minutes,
             "tasks_per_minute": len(tasks) / minutes},
            *({"measure": "mined_task", "task": t.instance_id, "fail_to_pass": len(t.FAIL_TO_PASS)} for t in tasks)]


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


def bench_grading(tasks: list, n: int) -> list[dict]:
    out = []
    for t in tasks[:n]:
        g = grade(t, t.patch)
        resolved, secs = baseline_grade(t, t.patch)
        out += [{"measure": "grade", "arm": "ours", "task": t.instance_id, "seconds": g.outcome.duration_s,
                 "resolved": int(g.outcome.resolved)},
                {"measure": "grade", "arm": "baseline_copy_full_suite", "task": t.instance_id, "seconds": secs,
                 "resolved": int(resolved)},
                {"measure": "grade_agree", "task": t.instance_id, "agree": int(resolved == g.outcome.resolved)}]
    return out


def bench_suite_sample(per_package: int) -> list[dict]:
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
            rows.append({"measure": "suite_sample", "task": t.instance_id,
                         "gold_resolved": int(grade(t, t.patch).outcome.resolved),
                         "base_resolved": int(grade(t, "").outcome.resolved)})  # fmt: skip
    return rows


def figures(records: list[dict]) -> dict[str, dict]:
    has = {r["measure"] for r in records}
    figs: dict[str, dict] = {
        "synth.validity": {"kind": "rate", "of": {"measure": "synth_mutant"}, "field": "kept"},
        "synth.tasks_per_minute": {"kind": "quantile", "of": {"measure": "synth_run"}, "field": "tasks_per_minute",
                                   "q": 0.5},
        "synth.tasks": {"kind": "quantile", "of": {"measure": "synth_run"}, "field": "tasks", "q": 0.5},
    }
    for k in sorted({r["strategy"] for r in records if r["measure"] == "synth_mutant"}):
        figs[f"synth.validity.{k}"] = {"kind": "rate", "of": {"measure": "synth_mutant", "strategy": k}, "field": "kept"}
    if "mine_run" in has:
        figs["mine.tasks_per_minute"] = {"kind": "quantile", "of": {"measure": "mine_run"}, "field": "tasks_per_minute",
                                         "q": 0.5}
        figs["mine.tasks"] = {"kind": "quantile", "of": {"measure": "mine_run"}, "field": "tasks", "q": 0.5}
    if "grade" in has:
        figs["grading.baseline_over_ours"] = {"kind": "ratio", "num": {"measure": "grade",
                                                                       "arm": "baseline_copy_full_suite"},
                                              "den": {"measure": "grade", "arm": "ours"}, "field": "seconds",
                                              "stat": "median"}
        figs["grading.verdicts_agree"] = {"kind": "rate", "of": {"measure": "grade_agree"}, "field": "agree"}
    if "suite_sample" in has:
        figs["suite_sample.gold_resolved"] = {"kind": "rate", "of": {"measure": "suite_sample"},
                                              "field": "gold_resolved"}
        figs["suite_sample.base_resolved"] = {"kind": "rate", "of": {"measure": "suite_sample"},
                                              "field": "base_resolved"}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth-package", default="tinydb==4.8.2")
    ap.add_argument("--synth-max", type=int, default=8)
    ap.add_argument("--grade-n", type=int, default=5)
    ap.add_argument("--no-mine", action="store_true")
    ap.add_argument("--suite-sample", type=int, default=2, help="cached suite tasks per package to re-grade (0: none)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 synthesised task, 1 graded, no mining, "
                    "no suite sample")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    if a.quick:
        a.synth_max, a.grade_n, a.no_mine, a.suite_sample = 1, 1, True, 0
    started = time.time()
    records, tasks = bench_synth(a.synth_package, a.synth_max)
    if not tasks:
        raise SystemExit(f"bench/tasks.py: synthesis on {a.synth_package} kept no task: nothing to grade")
    if not a.no_mine:
        records += bench_mine("tinydb", "4.8.2", "4.9.0")
    records += bench_grading(tasks, a.grade_n)
    if a.suite_sample:
        records += bench_suite_sample(a.suite_sample)
    meta = {"synth_package": a.synth_package, "synth_max": a.synth_max, "grade_n": a.grade_n,
            "suite_sample_per_package": a.suite_sample, "cpus": os.cpu_count(),
            "note": "load from other processes on the machine inflates every figure alike; compare ours with "
                    "baseline within a run"}
    prov = provenance(seeds={"synth": 0, "suite_sample": 7}, started=started,
                      argv=["bench/tasks.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(a.out, figures(records), records, prov, meta=meta)
    for name, f in doc["figures"].items():
        v = f.get("rate", f.get("value"))
        console.print(f"{name}: {v:.3f}" + (f" ({f['k']}/{f['n']})" if "k" in f else ""))
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
