"""Where supervised trajectories come from (`etude sft`'s data sources, and the fix env's drills),
each cached as an append-only JSONL so a killed gathering resumes where it stopped:

- `expert_trajectories`: the scripted expert (etude.envs.expert) on curriculum tasks, through the
  real harness and sandbox, kept only when grading in a clean copy says resolved;
- `drill_trajectories`: fix drills — grep, read, the gold edit, nothing runs the tests;
- `self_trajectories`: the policy's own resolved episodes (rejection sampling, k per task, deduped);
- `production_samples`: distilled interactions with positive reward (`etude distill` JSONL), as
  (prompt ids, completion ids).

Rendering trajectories into token sequences is etude.train.sft_tokens'; mixing the sources by
weight is the SFT run's (etude.train.sft).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from etude.envs.episode import open_task_episode, run_episode, task_harness_config, task_request
from etude.envs.expert import ExpertPolicy, read_capped
from etude.errors import EtudeError
from etude.harness.config import HarnessConfig
from etude.harness.record import trajectory_from_dict
from etude.policy.batcher import BatchedPolicy
from etude.policy.local import LocalPolicy
from etude.tasks import seal
from etude.tasks.curriculum import builtin_curriculum
from etude.tasks.repo import prepare_repo
from etude.tasks.schema import load_tasks
from etude.types import Task, Trajectory

Progress = Callable[[int, int], None]


def load_task_source(spec: str, level: int = 1, max_tasks: int | None = None,
                     progress: Callable[[str], None] | None = None, seed: int = 0, *, use: str,
                     where: str = "sft tasks") -> list[Task]:
    """"builtin:<split>" → the curriculum split at `level` (built with curriculum `seed`); anything
    else → a tasks JSONL. `use` says why (etude.tasks.seal.USES): sealed tasks are refused for every
    use but "final"."""
    if spec.startswith("builtin:"):
        return builtin_curriculum(spec.split(":", 1)[1], level, seed=seed, max_tasks=max_tasks, progress=progress,
                                  use=use)

    p = Path(spec)
    if not p.is_file():
        raise EtudeError(f"no tasks file at {p} (give a JSONL or builtin:train|validation|test)")
    tasks = load_tasks(p)
    return seal.guard(tasks[:max_tasks] if max_tasks else tasks, use=use, where=where)


def new_drill_tasks(candidates: Sequence[Task], expert_tasks: Sequence[Task]) -> list[Task]:
    """The candidates worth a fix drill: one per bug (the first task of each patch), none whose
    patch is already an expert task's (the expert works that bug whole)."""
    seen = {t.patch for t in expert_tasks}
    out: list[Task] = []
    for t in candidates:
        if t.patch not in seen:
            seen.add(t.patch)
            out.append(t)
    return out


class _JsonlCache:
    """Append-only JSONL of {"task_id", "key", "resolved", "trajectory"}; resumable by key."""

    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.rows: list[dict[str, Any]] = []
        if path.is_file():
            for ln in path.read_text().splitlines():
                try:
                    self.rows.append(json.loads(ln))
                except json.JSONDecodeError:
                    continue  # a line cut by a kill: that episode is simply run again
        self.done = {r["key"] for r in self.rows}

    def add(self, row: dict[str, Any]) -> None:
        with self.lock:
            path = self.path
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            self.rows.append(row)
            self.done.add(row["key"])

    def resolved(self) -> list[Trajectory]:
        return [trajectory_from_dict(r["trajectory"]) for r in self.rows if r.get("resolved") and r.get("trajectory")]


def _per_task(tasks: Sequence[Task], out: Path, seed: int, workers: int, progress: Progress | None,
              make: Callable[[Task], tuple[bool, Trajectory | None] | None]) -> list[Trajectory]:
    """Run `make` on every task not yet in the cache at `out` (key "<task>:<seed>"); it returns
    (resolved, trajectory), or None when the expert has no plan for the task. A task that raises
    is recorded as skipped: one task the expert cannot do must not stop the gathering."""
    cache = _JsonlCache(out)
    todo = [t for t in tasks if f"{t.instance_id}:{seed}" not in cache.done]

    def one(t: Task) -> None:
        row: dict[str, Any] = {"task_id": t.instance_id, "key": f"{t.instance_id}:{seed}"}
        try:
            made = make(t)
        except Exception as e:  # noqa: BLE001 - see the docstring
            cache.add({**row, "resolved": False, "skipped": f"{type(e).__name__}: {e}"[:200]})
            return
        if made is None:
            cache.add({**row, "resolved": False, "skipped": "no plan"})
            return
        ok, traj = made
        cache.add({**row, "resolved": ok, "trajectory": traj.to_dict() if ok and traj is not None else None})

    run_all(todo, one, workers, len(tasks) - len(todo), len(tasks), progress)
    return cache.resolved()


def expert_trajectories(tasks: Sequence[Task], hc: HarnessConfig, out: Path, *, seed: int = 0, workers: int = 2,
                        progress: Progress | None = None) -> list[Trajectory]:
    """Resolved expert trajectories, one per task that the expert can plan for (cached in `out`).
    The expert writes its calls in `hc.tool_format` when that is a text format (the trained
    model's: etude.train.sft resolves "auto"), else in `<tool_call>` text."""
    capped = read_capped(hc)
    fmt = hc.text_format()  # the expert has no chat template: what the harness will read from it

    def make(t: Task) -> tuple[bool, Trajectory] | None:
        template = prepare_repo(t)
        pol = ExpertPolicy.for_task(t, template, seed, capped_reads=capped, tool_format=fmt)
        if pol is None:
            return None
        traj, outcome = run_episode(t, pol, hc)
        if pol.decoy_failed is False:  # its wrong fix passed the test: not a recovery to learn
            pol = ExpertPolicy(t, template, seed, wrong_first=False, capped_reads=capped,
                               tool_format=fmt)  # a plan without one
            traj, outcome = run_episode(t, pol, hc)
        if pol.untrained:
            traj = dataclasses.replace(traj, meta={**traj.meta, "untrained_turns": list(pol.untrained)})
        return outcome.resolved, traj

    return _per_task(tasks, out, seed, workers, progress, make)


def drill_trajectories(tasks: Sequence[Task], hc: HarnessConfig, out: Path, *, seed: int = 0, workers: int = 2,
                       progress: Progress | None = None) -> list[Trajectory]:
    """Fix drills (cached in `out`): on each task the expert greps for the function, reads it and
    makes the gold edit through the real harness and tools, and nothing runs the tests or grades
    the diff (the edit is the gold hunk, so it undoes the bug by construction). A drill costs a
    workspace and a few in-process tool calls where a full expert episode also runs the tests
    and grades, so many more bugs can be shown for the same time. Its final answer is untrained
    (`meta.untrained_turns`): it would claim a result nobody checked. A drill whose edit the tool
    refused is dropped."""
    capped = read_capped(hc)
    fmt = hc.text_format()

    def make(t: Task) -> tuple[bool, Trajectory] | None:
        pol = ExpertPolicy.for_task(t, prepare_repo(t), seed, drill=True, capped_reads=capped, tool_format=fmt)
        if pol is None:
            return None
        with open_task_episode(t) as ep:
            traj = ep.run(pol, task_request(t), task_harness_config(t, hc), task_id=t.instance_id)
            traj = dataclasses.replace(traj, diff=traj.diff or ep.diff())
        edits = [m for m in traj.messages if m.role == "tool" and m.name == "edit_file"]
        ok = len(edits) == 1 and not edits[0].content.startswith("Error")
        return ok, dataclasses.replace(traj, meta={**traj.meta, "untrained_turns": list(pol.untrained), "drill": True})

    return _per_task(tasks, out, seed, workers, progress, make)


def self_trajectories(tasks: Sequence[Task], model: str, hc: HarnessConfig, out: Path, *, k: int = 4,
                      seed: int = 0, workers: int = 8, progress: Progress | None = None) -> list[Trajectory]:
    """The policy's own resolved episodes (k per task), deduplicated by diff and call sequence."""

    cache = _JsonlCache(out)
    jobs = [(t, i) for t in tasks for i in range(k) if f"{t.instance_id}:{seed}:{i}" not in cache.done]
    if jobs:
        policy = BatchedPolicy(load_policy(model), max_batch=workers)

        def one(job: tuple[Task, int]) -> None:
            t, i = job
            traj, outcome = run_episode(t, policy, hc)
            cache.add({"task_id": t.instance_id, "key": f"{t.instance_id}:{seed}:{i}", "resolved": outcome.resolved,
                       "trajectory": traj.to_dict() if outcome.resolved else None})

        try:
            run_all(jobs, one, workers, len(tasks) * k - len(jobs), len(tasks) * k, progress)
        finally:
            policy.close()
    seen: set[tuple[str, str]] = set()
    out_trajs = []
    for tr in cache.resolved():
        sig = (tr.diff, "|".join(x.call.name for x in tr.tool_calls))
        if sig not in seen:
            seen.add(sig)
            out_trajs.append(tr)
    return out_trajs


def production_samples(path: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of `etude distill` output with positive total reward."""
    if not path.is_file():
        raise EtudeError(f"no production samples at {path} (write them with `etude distill`)")
    out = []
    for ln in path.read_text().splitlines():
        try:
            r = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if float((r.get("reward") or {}).get("total", 0.0)) > 0 and r.get("completion_token_ids"):
            out.append((list(r["prompt_token_ids"]), list(r["completion_token_ids"])))
    return out


def load_policy(model: str) -> Any:
    """A LocalPolicy for "smollm2", "tiny" or a model directory; a bad path is one clear line."""

    if model not in ("smollm2", "tiny") and not (Path(model) / "config.json").is_file():
        raise EtudeError(f"not a model directory (no config.json): {model}")
    try:
        return LocalPolicy.from_pretrained(model)
    except Exception as e:  # noqa: BLE001 - an unreadable checkpoint is the operator's error
        raise EtudeError(f"cannot load model {model!r}: {type(e).__name__}: {e}") from None


def run_all(items: Sequence[Any], fn: Callable[[Any], None], workers: int, done: int, total: int,
            progress: Progress | None) -> None:
    """`fn` on every item, `workers` at a time, reporting (done, total) after each."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for _ in pool.map(fn, items):
            done += 1
            if progress:
                progress(done, total)
