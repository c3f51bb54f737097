"""`run_eval`: a policy on a suite, in sandboxes, in parallel, resumable.

For each (task, sample) not already in OUT/results.jsonl: one episode with a policy from the
model spec, scored and measured (etude.evals.episode), its record appended durably
(etude.evals.records). Then summary.json and report.html.

OUT also holds run.json (model, suite hash, config: a resumed run must match it), tasks.jsonl
(the suite as run, for the report and `compare`) and trajectories/ (one file per episode,
rewritten after every turn by the harness; under Ray written once, when the episode ends).

Episodes run on one of two executors (`EvalConfig.executor`), which write the same files:
"ray" (the default: each episode a Ray task, the policy in one Ray actor; etude.evals.raypool)
or "threads" (a thread pool in this process sharing one in-process policy). Either way at most
`workers` episodes are in flight and the records are written here, by the driver, as they finish.

Guarantees: a run killed at any point and started again with the same arguments runs only the
episodes without a record (and, with `retry_errors`, those whose record is an infrastructure
error); one failing episode never stops the others (its record has status "error"); on Ctrl-C
the episodes in flight finish and are recorded, queued ones are cancelled. A policy that
raises inside the harness is the model's failure (stop reason "error"), not an infrastructure one.
Not guaranteed: identical results on a rerun of a sampled model (sampling is not seeded here).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from etude.errors import EtudeError
from etude.evals.config import EvalConfig
from etude.evals.episode import episode_record
from etude.evals.models import policy_factory
from etude.evals.raypool import RayEpisodes
from etude.evals.records import ResultsWriter, atomic_write, read_records
from etude.evals.report import write_report
from etude.evals.summary import summarise
from etude.harness import HarnessConfig
from etude.paths import dir_sha256
from etude.policy import check_backend
from etude.tasks import builtin_suite, load_tasks, save_tasks, seal
from etude.tasks.curriculum import builtin_curriculum
from etude.tasks.history_suite import builtin_history
from etude.types import Task

RESULTS, SUMMARY, MANIFEST, TASKS = "results.jsonl", "summary.json", "run.json", "tasks.jsonl"


def resolve_suite(suite: str | Path | Sequence[Task], max_tasks: int | None = None, *, use: str,
                  where: str = "the suite") -> list[Task]:
    """Tasks from a file, `builtin:SPLIT` (the built-in suite), `builtin:curriculum:SPLIT[:LEVEL]`,
    `builtin:history[:before=D][:after=D]` (tasks mined from real histories,
    etude.tasks.history_suite), or a list of Tasks. `use` says why they are loaded
    (etude.tasks.seal.USES): sealed test-split tasks are refused for every use but "final"."""
    if isinstance(suite, (str, Path)):
        text = str(suite)
        if text == "builtin:history" or text.startswith("builtin:history:"):
            tasks = builtin_history(text, max_tasks)
        elif text.startswith("builtin:curriculum:"):  # builtin:curriculum:SPLIT[:LEVEL]
            split, _, level = text.removeprefix("builtin:curriculum:").partition(":")
            tasks = builtin_curriculum(split, int(level or 1) if (level or "1").isdigit() else -1, max_tasks=max_tasks,
                                       use=use)
        elif text.startswith("builtin:"):
            tasks = builtin_suite(text.split(":", 1)[1] or "eval", max_tasks, use=use)
        else:
            tasks = load_tasks(suite)
    else:
        tasks = list(suite)
    tasks = seal.guard(tasks[:max_tasks] if max_tasks is not None else tasks, use=use, where=where)
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


def _weights(name: str) -> bool:
    return PurePosixPath(name).suffix in (".safetensors", ".bin")


def model_sha256(model: str) -> str | None:
    """sha256 of a local model directory's weight files (names and bytes), None for anything
    else (a registry name, an URL): a path alone does not say which weights it held, and a
    pipeline that rewrites OUT/merged must not resume an evaluation of the earlier weights."""
    # NOTE: no separator after the name: the digests already in run.json files were made so.
    return dir_sha256(model, _weights, recursive=False, sep=b"")


def manifest_model_sha256(out: str | Path) -> str | None:
    """The weights digest an evaluation in `out` was run with (None: none recorded)."""
    path = Path(out) / MANIFEST
    return json.loads(path.read_text()).get("model_sha256") if path.is_file() else None


def harness_changes(out: Path, harness: Any) -> list[str]:
    """The harness fields whose values differ between the run recorded in `out` and `harness`
    (a HarnessConfig). A field the recorded run predates counts as it behaved then: its default,
    or `_LEGACY_HARNESS`'s value."""
    path = out / MANIFEST
    if not path.is_file():
        return []
    old = (json.loads(path.read_text()).get("config") or {}).get("harness")
    if not isinstance(old, dict):
        return []
    new, default = harness.to_dict(), HarnessConfig().to_dict()
    before = {**default, **_LEGACY_HARNESS, **old}  # what a field the run predates behaved as
    changed = [k for k in new if before.get(k) != new[k]]
    if int(before.get("verify_edits") or 0) <= 1 and int(new.get("verify_edits") or 0) <= 1:
        changed = [k for k in changed if not k.startswith("verify_")]  # verification off in both
    return sorted(changed)


# Harness fields whose behaviour before the field existed was not its default.
_LEGACY_HARNESS = {"verify_scope": "tests"}


def _manifest(out: Path, tasks: list[Task], model: str, digest: str | None, cfg: EvalConfig) -> dict[str, Any]:
    """Write run.json, or check a resumed run matches the one already in `out`."""
    new = {"model": model, "model_sha256": digest, "suite_sha256": suite_hash(tasks),
           "instance_ids": [t.instance_id for t in tasks], "samples": cfg.samples, "config": cfg.to_dict(),
           "sealed_read": seal.sealed_in(tasks)}  # fmt: skip
    path = out / MANIFEST
    if path.is_file():
        old = json.loads(path.read_text())
        for k in ("model", "suite_sha256", "model_sha256"):
            if k == "model_sha256" and (old.get(k) is None or new[k] is None):
                continue  # a run recorded before digests (or a model that is not a directory)
            if old.get(k) != new[k]:
                raise EtudeError(f"{out} holds a run with {k}={old.get(k)!r}, not {new[k]!r}; use another --out")
        if changed := harness_changes(out, cfg.harness_config()):
            raise EtudeError(f"{out} holds a run with another harness ({', '.join(changed)}); use another --out")
        new["created"] = old.get("created")
    new["created"] = new.get("created") or datetime.now(UTC).isoformat(timespec="seconds")
    atomic_write(path, json.dumps(new, indent=2) + "\n")
    save_tasks(tasks, out / TASKS)
    return new


def _todo(tasks: list[Task], samples: int, done: dict, retry_errors: bool) -> list[tuple[Task, int]]:
    out = []
    for t in tasks:
        for k in range(samples):
            rec = done.get((t.instance_id, k))
            if rec is None or (retry_errors and rec.get("status") == "error"):
                out.append((t, k))
    return out


def run_eval(
    suite: str | Path | Sequence[Task], model: str, out_dir: str | Path, config: EvalConfig | None = None,
    *, use: str, fresh_for_new_weights: bool = False,
) -> dict[str, Any]:
    """Evaluate `model` (see etude.evals.models) on `suite`; returns the summary (also in
    OUT/summary.json). Resumes a run already in `out_dir` (refused when it ran another harness);
    with `fresh_for_new_weights`, a folder holding an evaluation of other weights or another
    harness (or no run.json) is deleted and run afresh instead (a pipeline stage whose model
    directory was rewritten or whose harness changed). `use` says what the figures are for
    (etude.tasks.seal.USES): a sealed test split is read only for a "final" figure, and run.json
    records the sealed packages read, so a gate can refuse them (etude.evals.compare)."""
    cfg = config or EvalConfig()
    if cfg.backend != "hf":  # a missing engine is one line before the suite is prepared
        check_backend(cfg.backend)
    tasks = resolve_suite(suite, cfg.max_tasks, use=use)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise EtudeError(f"--out {out} exists and is not a folder")
    digest = model_sha256(model)  # once: hashing a model's weights reads all of them
    if fresh_for_new_weights and out.is_dir() and (
            not (out / MANIFEST).is_file() or manifest_model_sha256(out) != digest
            or harness_changes(out, cfg.harness_config())):
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    episodes = _executor(model, cfg, out)  # a bad spec or an unreachable cluster fails before anything is written
    try:
        manifest = _manifest(out, tasks, model, digest, cfg)
        todo = _todo(tasks, cfg.samples, read_records(out / RESULTS), cfg.retry_errors)
        skipped = len(tasks) * cfg.samples - len(todo)
        _run_all(todo, episodes, ResultsWriter(out / RESULTS).append, cfg, skipped)
    finally:
        episodes.close()
    summary = summarise(list(read_records(out / RESULTS).values()), tasks, cfg, manifest)
    summary["resumed_skipped"] = skipped
    atomic_write(out / SUMMARY, json.dumps(summary, indent=2) + "\n")
    if summary["episodes"] and summary["errors"] == summary["episodes"]:
        first = next(r for r in read_records(out / RESULTS).values() if r.get("status") == "error")
        raise EtudeError(f"every episode failed ({summary['errors']}); first: {first['error'][:300]}")
    if cfg.report:
        summary["report"] = str(write_report(out))
    return summary


class Episodes(Protocol):
    """Runs episodes and hands each record to `record` as it finishes (see the module docstring
    for what happens on Ctrl-C); `close` releases what the executor holds (its policy, its Ray)."""

    def run(self, todo: list[tuple[Task, int]], record: Callable[[dict[str, Any]], None]) -> None: ...

    def close(self) -> None: ...


def _executor(model: str, cfg: EvalConfig, out: Path) -> Episodes:
    if cfg.executor == "threads":
        return ThreadEpisodes(model, cfg, out)
    return RayEpisodes(model, cfg, out)  # Ray itself is imported only here, when it runs episodes


class ThreadEpisodes:
    """Episodes on a thread pool of `cfg.workers` threads in this process, sharing one policy
    (a local model answers concurrent episodes in batches, etude.evals.models)."""

    def __init__(self, model: str, cfg: EvalConfig, out: Path):
        self.factory = policy_factory(model, cfg.model_name, cfg.backend)
        self.model, self.cfg, self.out = model, cfg, out

    def run(self, todo: list[tuple[Task, int]], record: Callable[[dict[str, Any]], None]) -> None:
        pool = ThreadPoolExecutor(max_workers=self.cfg.workers, thread_name_prefix="etude-eval")
        pending: set[Future] = {
            pool.submit(episode_record, t, k, self.factory, self.cfg, self.out, self.model) for t, k in todo
        }
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    record(fut.result())
        finally:
            # On Ctrl-C, queued episodes are cancelled; those in flight finish and are recorded,
            # so a resumed run does not pay for them twice.
            pool.shutdown(wait=True, cancel_futures=True)
            for fut in pending:
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    record(fut.result())

    def close(self) -> None:
        pass


def _run_all(todo: list, episodes: Episodes, sink: Callable, cfg: EvalConfig, skipped: int) -> None:
    """Run the episodes, appending each record as it finishes, with a progress bar."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    resolved = 0
    with Progress(*cols, console=Console(stderr=True), disable=not cfg.progress) as bar:
        job = bar.add_task(f"eval ({skipped} already done)", total=len(todo) + skipped, completed=skipped)

        def record(rec: dict[str, Any]) -> None:
            nonlocal resolved
            sink(rec)
            resolved += bool(rec.get("resolved"))
            bar.update(job, advance=1, description=f"eval: {resolved} resolved")

        episodes.run(todo, record)
