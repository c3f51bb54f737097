"""Validation: run a task's tests at base and with the gold patch, in the sandbox, and derive
FAIL_TO_PASS / PASS_TO_PASS from what actually happened.

Each state (base + test_patch; base + test_patch + patch) is run `runs` times (at least twice),
each time in a fresh copy-on-write workspace. A test is
  * FAIL_TO_PASS when it passes in every gold run and fails, errors or is missing (its file does
    not even import at base) in every base run;
  * PASS_TO_PASS when it passes in every run of both states;
  * flaky when its pass/fail outcome differs between runs of one state, or when it belongs to a
    parametrized function whose ids change from run to run — excluded from both.
Skipped and xfail tests are in neither. A task is kept only if FAIL_TO_PASS >= 1, PASS_TO_PASS >= 1
and no run timed out. What this does not guarantee: that a test failing at base fails *because
of* the bug (it may fail for an unrelated reason the gold patch also fixes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from etude.errors import EtudeError
from etude.sandbox import Workspace
from etude.tasks.diffs import apply_patch
from etude.tasks.repo import prepare_repo, task_env
from etude.tasks.runner import TestRun, run_tests
from etude.types import Task


@dataclass(frozen=True)
class Verdict:
    instance_id: str
    kept: bool
    reason: str  # "ok" or why it was dropped
    task: Task | None = None  # the task with F2P / P2P as measured (when kept)
    flaky: tuple[str, ...] = ()
    wall_s: float = 0.0
    runs: dict[str, list[dict[str, str]]] = field(default_factory=dict)

    def summary(self) -> dict:
        t = self.task
        return {
            "instance_id": self.instance_id,
            "kept": self.kept,
            "reason": self.reason,
            "fail_to_pass": len(t.FAIL_TO_PASS) if t else 0,
            "pass_to_pass": len(t.PASS_TO_PASS) if t else 0,
            "flaky": len(self.flaky),
            "wall_s": round(self.wall_s, 2),
        }


@contextmanager
def workspace_with(template: Path, patches: Sequence[str]):
    """A fresh copy-on-write workspace of `template` with `patches` applied in order."""
    with Workspace.create(template) as ws:
        for p in patches:
            apply_patch(ws.path, p)
        yield ws.path


def run_state(task: Task, patches: Sequence[str], runs: int, targets: Sequence[str] | None = None,
              timeout_s: float | None = None) -> list[TestRun]:  # fmt: skip
    """Run the tests `runs` times, each in a fresh workspace at base + patches."""
    template, venv = prepare_repo(task), task_env(task)
    out = []
    for _ in range(runs):
        with workspace_with(template, patches) as ws:
            out.append(run_tests(ws, task, venv, targets, timeout_s))
    return out


def hang_timeout(reference: Sequence[TestRun], task: Task) -> float:
    """A timeout for a changed state, from how long the known-good state took: a mutant or an old
    release can loop forever, and we would rather drop it in a minute than wait `task.timeout_s`."""
    slowest = max((r.wall_s for r in reference), default=task.timeout_s)
    return min(task.timeout_s, max(60.0, 5.0 * slowest))


def _ok(status: str) -> bool:
    return status == "passed"


def _file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _func(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def unstable_functions(runs: Sequence[TestRun]) -> set[str]:
    """Test functions whose parametrized ids change between runs (ids built from unordered data,
    e.g. a set of objects): no id of theirs can be graded reliably."""
    ids_by_run: list[dict[str, set[str]]] = []
    for r in runs:
        by_func: dict[str, set[str]] = {}
        for t in r.status:
            by_func.setdefault(_func(t), set()).add(t)
        ids_by_run.append(by_func)
    funcs = set().union(*ids_by_run) if ids_by_run else set()
    return {f for f in funcs if len({frozenset(d[f]) for d in ids_by_run if f in d}) > 1}


def _status_in(run: TestRun, test_id: str) -> str:
    """The run's status for a test; "missing" only when its whole file reported nothing (it did
    not import), "absent" when the file ran but this id was not among its tests."""
    if test_id in run.status:
        return run.status[test_id]
    f = _file(test_id)
    return "absent" if any(_file(t) == f for t in run.status) else "missing"


def _bad(status: str) -> bool:
    return status in ("failed", "error", "missing")


def classify(base: Sequence[TestRun], gold: Sequence[TestRun]) -> tuple[list[str], list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS, flaky) from repeated runs of the two states."""
    runs = [*base, *gold]
    ids = sorted(set().union(*(r.status for r in runs)))
    unstable = unstable_functions(runs)
    f2p, p2p, flaky = [], [], []
    for t in ids:
        b = [_status_in(r, t) for r in base]
        g = [_status_in(r, t) for r in gold]
        if _func(t) in unstable or len({_ok(s) for s in b}) > 1 or len({_ok(s) for s in g}) > 1:
            flaky.append(t)
        elif all(map(_ok, g)) and all(map(_bad, b)):
            f2p.append(t)
        elif all(map(_ok, g)) and all(map(_ok, b)):
            p2p.append(t)
    return f2p, p2p, flaky


def _timed_out(runs: Sequence[TestRun]) -> bool:
    return any(r.timed_out for r in runs)


def _nothing_ran(runs: Sequence[TestRun]) -> bool:
    return all(not r.status for r in runs)


def validate_task(task: Task, runs: int = 2) -> Verdict:
    """Validate one task from scratch (see the module docstring for the rules)."""
    import time

    if runs < 2:
        raise EtudeError("validation needs at least two runs of each state")
    t0 = time.monotonic()
    try:
        gold = run_state(task, [task.test_patch, task.patch], runs)
        base = run_state(task, [task.test_patch], runs, timeout_s=hang_timeout(gold, task))
    except EtudeError as e:
        return Verdict(task.instance_id, False, f"error: {e}", wall_s=time.monotonic() - t0)
    return verdict_from_runs(task, base, gold, time.monotonic() - t0)


def verdict_from_runs(task: Task, base: Sequence[TestRun], gold: Sequence[TestRun], wall_s: float) -> Verdict:
    if _timed_out([*base, *gold]):
        return Verdict(task.instance_id, False, "timed out", wall_s=wall_s)
    if _nothing_ran(gold):
        tail = gold[0].log_tail.strip().splitlines()[-1:] if gold else []
        return Verdict(task.instance_id, False, f"no tests ran ({tail[0] if tail else 'empty output'})", wall_s=wall_s)
    f2p, p2p, flaky = classify(base, gold)
    if not f2p:
        return Verdict(task.instance_id, False, "no FAIL_TO_PASS test", flaky=tuple(flaky), wall_s=wall_s)
    if not p2p:
        return Verdict(task.instance_id, False, "no PASS_TO_PASS test", flaky=tuple(flaky), wall_s=wall_s)
    meta = {**task.meta, "flaky_excluded": flaky, "validated_runs": len(base)}
    # Grading a hanging patch should cost a minute or so, not the default five.
    new = dataclasses.replace(task, FAIL_TO_PASS=tuple(f2p), PASS_TO_PASS=tuple(p2p), meta=meta,
                              timeout_s=hang_timeout(gold, task))  # fmt: skip
    return Verdict(task.instance_id, True, "ok", task=new, flaky=tuple(flaky), wall_s=wall_s)
