"""Mining real changes from two releases of a PyPI package.

The old release's source is run against the new release's tests, in the sandbox: tests that fail
there and pass on the new release are FAIL_TO_PASS, tests passing on both are PASS_TO_PASS. The
source diff is the gold `patch`, the test diff is `test_patch`. A release bundling several fixes
is split: each hunk of the source diff (then each file) is tried alone, and every failing test it
fixes on its own, without breaking a PASS_TO_PASS test, becomes part of a task whose gold patch is
that hunk (or file). Tests no single hunk or file fixes stay together in one task with the whole
diff. Each state is run twice (flaky tests are excluded). What this does not guarantee: that a
release's test changes are bug fixes rather than new features — a new feature with its tests is a
valid task too ("implement X so these tests pass").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from etude.errors import EtudeError
from etude.tasks import describe, diffs, layout
from etude.tasks.fetch import Sdist, fetch_sdist, normalise
from etude.tasks.repo import base_commit_id
from etude.tasks.runner import TestRun
from etude.tasks.validate import classify, hang_timeout, run_state, verdict_from_runs
from etude.types import Task

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ReleasePair:
    old: Sdist
    new: Sdist
    patch: str
    test_patch: str
    proto: Task  # base task: the whole release diff, F2P/P2P not yet measured


def release_pair(package: str, v_from: str, v_to: str, extra_deps: Sequence[str] = ()) -> ReleasePair:
    """Fetch both releases and build the diffs and the proto task."""
    old, new = fetch_sdist(package, v_from), fetch_sdist(package, v_to)
    tests = sorted(set(layout.test_files(old.root)) | set(layout.test_files(new.root)))
    if not layout.test_files(new.root):
        raise EtudeError(f"{package}=={v_to} ships no tests in its sdist; cannot mine it")
    src = sorted(set(layout.source_files(old.root)) | set(layout.source_files(new.root)))
    patch = diffs.tree_diff(old.root, new.root, src)
    test_patch = diffs.tree_diff(old.root, new.root, tests)
    if not patch:
        raise EtudeError(f"{package} {v_from} -> {v_to}: no source change between the releases")
    setup = {
        "sdist": {"package": package, "version": v_from, "sha256": old.sha256},
        "base_patch": "",
        "pythonpath": layout.import_root(new.root),
        "test_paths": layout.test_paths(new.root),
        "test_deps": sorted(set(layout.declared_requirements(new.root)) | set(extra_deps)),
    }
    proto = Task(
        instance_id=f"{normalise(package)}__{v_from}-{v_to}",
        repo=f"pypi/{normalise(package)}",
        base_commit=base_commit_id(package, v_from, old.sha256, ""),
        patch=patch,
        test_patch=test_patch,
        problem_statement="",
        created_at=new.upload_time,
        version=v_from,
        environment_setup_commit=base_commit_id(package, v_from, old.sha256, ""),
        source={
            "package": package,
            "version": v_from,
            "sha256": old.sha256,
            "to_version": v_to,
            "to_sha256": new.sha256,
        },
        strategy="release-diff",
        test_cmd="python -m pytest " + " ".join(setup["test_paths"]),
        timeout_s=300.0,
        setup=setup,
    )
    return ReleasePair(old, new, patch, test_patch, proto)


def _units(files: list[diffs.FilePatch], max_trials: int) -> list[list[tuple[int, int]]]:
    """Candidate hunk subsets: each hunk alone (when within the budget), then each whole file."""
    singles = [[(fi, hi)] for fi, fp in enumerate(files) for hi in range(len(fp.hunks))]
    over = len(singles) > max_trials
    whole = [[(fi, hi) for hi in range(len(fp.hunks))] for fi, fp in enumerate(files) if over or len(fp.hunks) > 1]
    return ([] if over else singles) + whole


def _trial(proto: Task, patch: str, timeout_s: float) -> TestRun | None:
    try:
        return run_state(proto, [proto.test_patch, patch], 1, timeout_s=timeout_s)[0]
    except EtudeError:
        return None  # this subset does not apply on its own


def split_release(
    proto: Task, f2p: list[str], p2p: list[str], max_trials: int, progress: Progress, timeout_s: float
) -> list[tuple[str, list[TestRun]]]:
    """(gold patch, its trial runs) per split; the last one is the remainder with the full diff."""
    files = diffs.split_files(proto.patch)
    claimed: set[str] = set()
    out: list[tuple[str, list[TestRun]]] = []
    units = _units(files, max_trials)
    for i, unit in enumerate(units):
        remaining = [t for t in f2p if t not in claimed]
        if not remaining:
            break
        progress(f"split trial {i + 1}/{len(units)}")
        sub = diffs.subset(files, unit)
        run = _trial(proto, sub, timeout_s)
        if run is None or run.timed_out:
            continue
        fixed = {t for t in remaining if run.status.get(t) == "passed"}
        broken = [t for t in p2p if run.status.get(t) != "passed"]
        if fixed and not broken and sub != proto.patch:
            claimed |= fixed
            out.append((sub, [run]))
    if any(t not in claimed for t in f2p):
        out.append((proto.patch, []))
    return out


def _statement(pair: ReleasePair, f2p: Sequence[str], patch: str, messages: dict[str, str]) -> tuple[str, str]:
    entries = describe.changelog_entries(layout.changelog_text(pair.new.root), pair.new.version)
    if patch == pair.patch and len(entries) > 1:
        entry = "\n".join(f"- {e}" for e in entries)  # the whole release: all of its changes
    else:
        entry = describe.match_entry(entries, f2p, patch)
    text = describe.release_statement(pair.proto.source["package"], pair.new.version, entry, f2p, messages)
    return text, ("changelog" if entry else "tests")


def mine(package: str, v_from: str, v_to: str, *, split: bool = True, max_trials: int = 60,
         extra_deps: Sequence[str] = (), progress: Progress | None = None) -> list[Task]:  # fmt: skip
    """Validated tasks from one release pair (see the module docstring)."""
    say = progress or (lambda _msg: None)
    pair = release_pair(package, v_from, v_to, extra_deps)
    proto = pair.proto
    t0 = time.monotonic()
    say("gold runs (new source, new tests)")
    gold = run_state(proto, [proto.test_patch, proto.patch], 2)
    if any(r.timed_out for r in gold):
        raise EtudeError(f"{package}=={v_to}: its test suite timed out ({proto.timeout_s:.0f} s)")
    say("base runs (old source, new tests)")
    base = run_state(proto, [proto.test_patch], 2, timeout_s=hang_timeout(gold, proto))
    if any(r.timed_out for r in base):
        raise EtudeError(f"{package}: the new tests hang on the old source (no per-test timeout to isolate them)")
    f2p, p2p, _flaky = classify(base, gold)
    if not f2p:
        raise EtudeError(f"{package} {v_from} -> {v_to}: no test fails on the old source and passes on the new")
    messages = {k: v for r in base for k, v in r.messages.items()}
    splits = (
        split_release(proto, f2p, p2p, max_trials, say, hang_timeout(gold, proto)) if split else [(proto.patch, [])]
    )
    tasks: list[Task] = []
    for i, (patch, trial) in enumerate(splits, 1):
        say(f"validating split {i}/{len(splits)}")
        task = dataclasses.replace(proto, instance_id=f"{proto.instance_id}__{i}", patch=patch)
        g = (
            trial + run_state(task, [task.test_patch, patch], 2 - len(trial), timeout_s=hang_timeout(gold, proto))
            if patch != proto.patch
            else gold
        )
        v = verdict_from_runs(task, base, g, time.monotonic() - t0)
        if v.kept and v.task is not None:
            tasks.append(_finish(pair, v.task, messages, len(splits)))
    return tasks


def _finish(pair: ReleasePair, task: Task, messages: dict[str, str], n_splits: int) -> Task:
    text, origin = _statement(pair, task.FAIL_TO_PASS, task.patch, messages)
    meta = {
        **task.meta,
        "statement_from": origin,
        "splits": n_splits,
        "hunks": sum(len(f.hunks) for f in diffs.split_files(task.patch)),
    }
    return dataclasses.replace(task, problem_statement=text, meta=meta)
