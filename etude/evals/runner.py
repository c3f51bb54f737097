"""`run_eval`: a policy on a suite, in sandboxes, in parallel, resumable.

For each (task, sample) not already in OUT/results.jsonl: a fresh policy from the model spec, one
episode (etude.envs.run_episode: fresh workspace, harness, grading in a clean copy), the reward
breakdown and hack flags (etude.rewards), adherence against the gold patch and efficiency counts;
the record is appended durably (etude.evals.records). Then summary.json and report.html.

OUT also holds run.json (model, suite hash, config: a resumed run must match it), tasks.jsonl
(the suite as run, for the report and `compare`) and trajectories/ (one file per episode,
rewritten after every turn by the harness).

Guarantees: a run killed at any point and started again with the same arguments runs only the
episodes without a record (and, with `retry_errors`, those whose record is an infrastructure
error); one failing episode never stops the others (its record has status "error"); on Ctrl-C
the episodes in flight finish and are recorded, queued ones are cancelled. A policy that
raises inside the harness is the model's failure (stop reason "error"), not an infrastructure one.
Not guaranteed: identical results on a rerun of a sampled model (sampling is not seeded here).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etude.envs import run_episode
from etude.errors import EtudeError
from etude.evals.adherence import adherence, patch_facts
from etude.evals.config import EvalConfig
from etude.evals.models import policy_factory
from etude.evals.records import ResultsWriter, read_records
from etude.evals.report import write_report
from etude.evals.summary import summarise
from etude.policy import check_backend
from etude.rewards import apply_flags, breakdown_json, score
from etude.rewards.terms import answers, asks_question
from etude.tasks import builtin_suite, load_tasks, save_tasks
from etude.tasks.curriculum import builtin_curriculum
from etude.tasks.repo import prepare_repo
from etude.types import Task, Trajectory

RESULTS, SUMMARY, MANIFEST, TASKS = "results.jsonl", "summary.json", "run.json", "tasks.jsonl"


def resolve_suite(suite: str | Path | Sequence[Task], max_tasks: int | None = None) -> list[Task]:
    """Tasks from a file, `builtin:SPLIT` (the built-in suite), or a list of Tasks."""
    if isinstance(suite, (str, Path)):
        text = str(suite)
        if text.startswith("builtin:curriculum:"):  # builtin:curriculum:SPLIT[:LEVEL]
            split, _, level = text.removeprefix("builtin:curriculum:").partition(":")
            tasks = builtin_curriculum(split, int(level or 1) if (level or "1").isdigit() else -1, max_tasks=max_tasks)
        elif text.startswith("builtin:"):
            tasks = builtin_suite(text.split(":", 1)[1] or "eval", max_tasks)
        else:
            tasks = load_tasks(suite)
    else:
        tasks = list(suite)
    tasks = tasks[:max_tasks] if max_tasks is not None else tasks
    if not tasks:
        raise EtudeError(f"the suite {suite if isinstance(suite, (str, Path)) else '(list)'} has no tasks")
    return tasks


def suite_hash(tasks: Sequence[Task]) -> str:
    """Identity of a suite: its instance ids with their gold and test patches."""
    h = hashlib.sha256()
    for t in sorted(tasks, key=lambda t: t.instance_id):
        h.update(
            json.dumps([t.instance_id, t.patch, t.test_patch, list(t.FAIL_TO_PASS), list(t.PASS_TO_PASS)]).encode()
        )
    return h.hexdigest()[:16]


def _manifest(out: Path, tasks: list[Task], model: str, cfg: EvalConfig) -> dict[str, Any]:
    """Write run.json, or check a resumed run matches the one already in `out`."""
    new = {"model": model, "suite_sha256": suite_hash(tasks), "instance_ids": [t.instance_id for t in tasks],
           "samples": cfg.samples, "config": cfg.to_dict()}  # fmt: skip
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        for k in ("model", "suite_sha256"):
            if old.get(k) != new[k]:
                raise EtudeError(f"{out} holds a run with {k}={old.get(k)!r}, not {new[k]!r}; use another --out")
        new["created"] = old.get("created")
    new["created"] = new.get("created") or datetime.now(UTC).isoformat(timespec="seconds")
    _atomic_write(path, json.dumps(new, indent=2) + "\n")
    save_tasks(tasks, out / TASKS)
    return new


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def _todo(tasks: list[Task], samples: int, done: dict, retry_errors: bool) -> list[tuple[Task, int]]:
    out = []
    for t in tasks:
        for k in range(samples):
            rec = done.get((t.instance_id, k))
            if rec is None or (retry_errors and rec.get("status") == "error"):
                out.append((t, k))
    return out


def run_eval(
    suite: str | Path | Sequence[Task], model: str, out_dir: str | Path, config: EvalConfig | None = None
) -> dict[str, Any]:
    """Evaluate `model` (see etude.evals.models) on `suite`; returns the summary (also in
    OUT/summary.json). Resumes a run already in `out_dir`."""
    cfg = config or EvalConfig()
    if cfg.backend != "hf":  # a missing engine is one line before the suite is prepared
        check_backend(cfg.backend)
    tasks = resolve_suite(suite, cfg.max_tasks)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise EtudeError(f"--out {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    factory = policy_factory(model, cfg.model_name, cfg.backend)  # a bad spec fails before anything is written
    manifest = _manifest(out, tasks, model, cfg)
    todo = _todo(tasks, cfg.samples, read_records(out / RESULTS), cfg.retry_errors)
    skipped = len(tasks) * cfg.samples - len(todo)
    writer = ResultsWriter(out / RESULTS)
    _run_all(todo, lambda t, k: episode_record(t, k, factory, cfg, out, model), writer.append, cfg, skipped)
    summary = summarise(list(read_records(out / RESULTS).values()), tasks, cfg, manifest)
    summary["resumed_skipped"] = skipped
    _atomic_write(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    if summary["episodes"] and summary["errors"] == summary["episodes"]:
        first = next(r for r in read_records(out / RESULTS).values() if r.get("status") == "error")
        raise EtudeError(f"every episode failed ({summary['errors']}); first: {first['error'][:300]}")
    if cfg.report:
        summary["report"] = str(write_report(out))
    return summary


def _run_all(todo: list, run_one: Callable, sink: Callable, cfg: EvalConfig, skipped: int) -> None:
    """Run episodes on a thread pool, appending each record as it finishes, with a progress bar."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    resolved = 0
    with Progress(*cols, console=Console(stderr=True), disable=not cfg.progress) as bar:
        job = bar.add_task(f"eval ({skipped} already done)", total=len(todo) + skipped, completed=skipped)
        pool = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="etude-eval")
        pending: set[Future] = {pool.submit(run_one, t, k) for t, k in todo}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    rec = fut.result()
                    sink(rec)
                    resolved += bool(rec.get("resolved"))
                    bar.update(job, advance=1, description=f"eval: {resolved} resolved")
        finally:
            # On Ctrl-C, queued episodes are cancelled; those in flight finish and are recorded,
            # so a resumed run does not pay for them twice.
            pool.shutdown(wait=True, cancel_futures=True)
            for fut in pending:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    sink(fut.result())


_GOLD: dict[str, Any] = {}
_GOLD_LOCK = threading.Lock()


def _gold_facts(task: Task, template: Path, cfg: EvalConfig) -> Any:
    # Keyed by content, not id: two suites may reuse an instance id for another patch.
    key = hashlib.sha256(json.dumps([str(template), task.patch, list(cfg.ruff_select)]).encode()).hexdigest()
    with _GOLD_LOCK:
        if key not in _GOLD:
            _GOLD[key] = patch_facts(template, task.patch, cfg.ruff_select)
        return _GOLD[key]


def adherence_of(task: Task, diff: str, cfg: EvalConfig) -> dict[str, Any]:
    """The adherence block of a record (see etude.evals.adherence); never raises for a bad patch."""
    template = prepare_repo(task)
    try:
        gold = _gold_facts(task, template, cfg)
        agent = patch_facts(template, diff, cfg.ruff_select)
    except Exception as e:  # noqa: BLE001 - an analysis failure must not void the episode's record
        return {"score": None, "components": {}, "error": f"{type(e).__name__}: {e}"}
    return adherence(agent, gold, cfg.adherence_weights)


def efficiency(traj: Trajectory) -> dict[str, Any]:
    """Counts of one episode. `parallel_calls`: calls issued in a turn together with others."""
    per_turn = [sum(1 for x in t.tool_executions if x.call.name != "submit") for t in traj.turns]
    executed = [x for t in traj.turns for x in t.tool_executions]
    malformed = sum(len(t.parse_errors) for t in traj.turns) + sum(1 for x in executed if _malformed(x.result))
    all_calls = len(executed) + sum(len(t.parse_errors) for t in traj.turns)
    return {
        "turns": len(traj.turns),
        "tool_calls": sum(per_turn),
        "calls_issued": all_calls,  # every call the model wrote, well-formed or not (submit included)
        "calls_well_formed": all_calls - malformed,  # parsed, named a tool offered, arguments fit its schema
        "parallel_calls": sum(n for n in per_turn if n > 1),
        "max_calls_per_turn": max(per_turn, default=0),
        "prompt_tokens": traj.prompt_tokens,
        "completion_tokens": traj.completion_tokens,
        "tokens": traj.prompt_tokens + traj.completion_tokens,
        "wall_s": round(traj.wall_s, 3),
        "broken_calls": traj.broken_calls,
        "clarifications": sum(1 for a in answers(traj) if asks_question(a)),
        "stop_reason": traj.stop_reason,
        "token_counts": traj.meta.get("token_counts"),
    }


def _malformed(r: Any) -> bool:
    kind = (r.meta or {}).get("error_kind")
    return (not r.ok) and (kind in ("unknown_tool", "invalid_arguments", "invalid_call")
                           or (r.error or "").startswith("unknown tool"))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]


def episode_record(
    task: Task, sample: int, factory: Callable, cfg: EvalConfig, out: Path, model: str
) -> dict[str, Any]:
    """One episode, scored and measured, as a results.jsonl record (status "error" on failure)."""
    t0 = time.monotonic()
    rel = Path("trajectories") / f"{_safe(task.instance_id)}-{sample}.jsonl"
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    base = {"instance_id": task.instance_id, "sample": sample, "model": model, "pid": os.getpid()}
    try:
        policy = factory(task, sample)
        traj, outcome = run_episode(task, policy, cfg.harness_config(), trajectory_path=out / rel)
        breakdown = score(traj, task, outcome, cfg.reward_config())
        reported = apply_flags(outcome, breakdown.flags)
        adh = adherence_of(task, traj.diff, cfg)
    except Exception as e:  # noqa: BLE001 - one broken episode must not stop the run
        return {**base, "status": "error", "error": f"{type(e).__name__}: {e}", "resolved": False, "partial": False,
                "episode_s": round(time.monotonic() - t0, 3), "finished_at": _now()}  # fmt: skip
    outcome_d = dataclasses.replace(reported, log_tail=reported.log_tail[-1500:]).to_dict()
    return {
        **base, "status": "ok", "policy_id": traj.policy_id, "policy_version": traj.policy_version,
        "resolved": reported.resolved, "partial": reported.partial, "resolved_before_flags": outcome.resolved,
        "outcome": outcome_d, **breakdown_json(breakdown), "adherence": adh, "efficiency": efficiency(traj),
        "diff": traj.diff, "trajectory": str(rel), "episode_s": round(time.monotonic() - t0, 3), "finished_at": _now(),
    }  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
