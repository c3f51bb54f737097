"""Grading a patch on a task in a clean workspace, with the task's own tests.

Steps: a fresh copy-on-write workspace of the task's template at base; the patch is applied
*without* its edits to protected paths (tests, conftest.py, top-level pytest/tox/setup.cfg/
pyproject configuration, files that would shadow pytest or hook start-up such as sitecustomize.py
or *.pth — see etude.tasks.layout.is_protected_path); every protected file that still differs from
the template afterwards is restored from it (or deleted if the template lacks it); then the
task's `test_patch` is applied and the files holding FAIL_TO_PASS and PASS_TO_PASS are run in the
sandbox. resolved = every FAIL_TO_PASS and PASS_TO_PASS test passed; partial = not resolved but
at least one FAIL_TO_PASS test passed. The agent's own workspace is never touched.

What this does not guarantee: that the patch is a *good* fix (only that these tests pass), or
that it does not special-case the tests — reward-hack detectors (etude.rewards) look for that.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from etude.sandbox import Workspace
from etude.tasks import diffs, layout
from etude.tasks.repo import prepare_repo, task_env
from etude.tasks.runner import files_of, run_tests, statuses_for
from etude.types import Outcome, Task


@dataclass(frozen=True)
class Grading:
    outcome: Outcome
    ignored_paths: tuple[str, ...]  # protected files the patch touched (their edits did not count)


def strip_protected(patch: str) -> tuple[str, list[str]]:
    """The patch without file sections that touch protected paths or create symlinks (a link
    could point a restored test file's directory outside the workspace), and those paths."""
    kept, dropped = [], []
    for fp in diffs.split_files(patch):
        paths = {fp.path, *_header_paths(fp.header)}
        if any(layout.is_protected_path(p) for p in paths if p) or "120000" in fp.header:
            dropped.append(fp.path)
        else:
            kept.append(fp)
    return diffs.join(kept), dropped


def _header_paths(header: str) -> list[str]:
    out = []
    for line in header.splitlines():
        for prefix in ("--- a/", "+++ b/", "rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(prefix):
                out.append(line[len(prefix) :].strip())
    return out


def _inside(root: Path, p: Path) -> bool:
    try:
        p.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def restore_protected(ws: Path, template: Path) -> list[str]:
    """Make every protected file in `ws` equal to the template's; returns what it changed.
    Never writes through a symlink: a path whose parent resolves outside `ws` is left alone."""
    changed = []
    ws_files, tpl_files = set(layout.iter_files(ws)), set(layout.iter_files(template))
    for rel in sorted(ws_files | tpl_files):
        if not layout.is_protected_path(rel):
            continue
        src, dst = template / rel, ws / rel
        if dst.is_symlink() or not _inside(ws, dst.parent):
            continue  # NOTE: strip_protected drops symlink patches; this guards anything else
        if rel not in tpl_files:
            dst.unlink(missing_ok=True)
            changed.append(rel)
        elif rel not in ws_files or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            changed.append(rel)
    return changed


def _fail(task: Task, error: str, t0: float, applied: bool = False) -> Outcome:
    f2p = dict.fromkeys(task.FAIL_TO_PASS, "missing")
    p2p = dict.fromkeys(task.PASS_TO_PASS, "missing")
    return Outcome(task.instance_id, False, False, f2p, p2p, applied, error, time.monotonic() - t0)


def grade(task: Task, patch_text: str) -> Grading:
    """Grade `patch_text` on `task` (see the module docstring)."""
    t0 = time.monotonic()
    template, venv = prepare_repo(task), task_env(task)
    patch, dropped = strip_protected(patch_text)
    with Workspace.create(template) as ws:
        ok, msg = diffs.apply_patch(ws.path, patch, check=False)
        if not ok:
            first = msg.splitlines()[0] if msg else "git apply failed"
            return Grading(_fail(task, f"patch does not apply: {first}", t0), tuple(dropped))
        restored = restore_protected(ws.path, template)
        ok, msg = diffs.apply_patch(ws.path, task.test_patch, check=False)
        if not ok:
            return Grading(_fail(task, f"task test_patch does not apply: {msg[:200]}", t0, True), tuple(dropped))
        ids = [*task.FAIL_TO_PASS, *task.PASS_TO_PASS]
        run = run_tests(ws.path, task, venv, files_of(ids))
    f2p, p2p = statuses_for(run, task.FAIL_TO_PASS), statuses_for(run, task.PASS_TO_PASS)
    resolved = bool(f2p) and all(s == "passed" for s in [*f2p.values(), *p2p.values()])
    partial = not resolved and any(s == "passed" for s in f2p.values())
    error = f"tests timed out after {task.timeout_s:.0f} s" if run.timed_out else None
    out = Outcome(
        task.instance_id, resolved, partial, f2p, p2p, True, error, time.monotonic() - t0, run.log_tail[-2000:]
    )
    return Grading(out, tuple(sorted(set(dropped) | set(restored))))


def grade_patch(task: Task, patch_text: str) -> Outcome:
    """The verdict of `patch_text` on `task` from a clean workspace (contract in docs/contracts.md)."""
    return grade(task, patch_text).outcome
