"""Splitting one organisation's tasks by function: held-out functions are never trained on.

A task's functions are every function whose body its gold patch touches (`touched_functions`:
the hunks' changed lines in the task's base source, mapped to the innermost enclosing function;
a change at module level counts as the file's `<module>`). The split shuffles the distinct
functions with a fixed seed and moves whole functions to the held-out side until it holds
`heldout_fraction` of the tasks. Then:

- held out: the tasks every one of whose functions is held out;
- train: the tasks none of whose functions is held out;
- dropped: tasks touching both sides, and held-out tasks past `heldout_per_function` (counted,
  never used);
- select: a slice of the *train* functions (`select_fraction`) kept out of training, on which a
  run chooses between its checkpoints, so the held-out side is read once, for the final figure.

What this does not guarantee: that two functions are unrelated (a held-out function may call a
trained one, which is the point of specialising to a codebase), or that a function renamed
between tasks is recognised as the same one.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.tasks.curriculum import enclosing_function
from etude.tasks.diffs import split_files
from etude.tasks.repo import prepare_repo
from etude.types import Task

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@")


def changed_old_lines(file_patch: str) -> list[int]:
    """Line numbers (1-based, in the old file) that a unified diff of one file removes or changes;
    a pure insertion counts as the line it follows."""
    out: list[int] = []
    line = 0
    for text in file_patch.splitlines():
        if m := _HUNK.match(text):
            line = int(m.group(1))
            continue
        if not line or text.startswith(("---", "+++")):
            continue
        if text.startswith("-"):
            out.append(line)
            line += 1
        elif text.startswith("+"):
            out.append(max(1, line - 1))
        elif text.startswith(" "):
            line += 1
    return sorted(set(out))


def touched_functions(task: Task, base_root: Path | None = None) -> frozenset[str]:
    """`file::Qualified.name` of every function whose body the gold patch touches (see the
    module doc). `base_root`: the task's base tree (default: `prepare_repo(task)`); a level-1
    curriculum task names its function in `meta`, so no tree is read for it."""
    meta_fn, meta_file = task.meta.get("function"), task.meta.get("file")
    if meta_fn and meta_file and len(split_files(task.patch)) == 1:
        return frozenset({f"{meta_file}::{meta_fn}"})
    if base_root is None:

        base_root = prepare_repo(task)
    out: set[str] = set()
    for fp in split_files(task.patch):
        path = base_root / fp.path
        src = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
        for ln in changed_old_lines(fp.text) or [0]:
            fn = enclosing_function(src, ln) if src else None
            out.add(f"{fp.path}::{fn or '<module>'}")
    return frozenset(out)


@dataclass(frozen=True)
class FunctionSplit:
    train: tuple[Task, ...]
    select: tuple[Task, ...]
    heldout: tuple[Task, ...]
    dropped: tuple[str, ...]  # instance ids touching both sides
    functions: dict[str, tuple[str, ...]] = field(default_factory=dict)  # side -> functions

    def to_dict(self, seed: int) -> dict[str, Any]:
        sides = {"train": self.train, "select": self.select, "heldout": self.heldout}
        return {
            "seed": seed,
            "rule": "by function: no held-out task's function, nor any function a training task's patch touches, "
                    "is on the other side; `select` is a slice of train functions kept out of training for "
                    "choosing checkpoints",
            **{side: {"functions": list(self.functions.get(side, ())), "tasks": [t.instance_id for t in ts],
                      "n_functions": len(self.functions.get(side, ())), "n_tasks": len(ts)}
               for side, ts in sides.items()},
            "dropped": list(self.dropped),
        }


def split_by_function(tasks: Sequence[Task], touched: dict[str, frozenset[str]], *, heldout_fraction: float = 0.5,
                      select_fraction: float = 0.15, seed: int = 0,
                      heldout_per_function: int | None = None) -> FunctionSplit:
    """The split of the module doc. `touched`: instance id -> its functions (`touched_functions`).
    `heldout_per_function`: at most this many held-out tasks per function (seeded pick; the rest of
    that function's tasks are dropped, never trained on), so one function with many mutants does
    not fill the held-out side; the fraction then counts tasks up to that cap."""
    fns = sorted({f for t in tasks for f in touched[t.instance_id]})
    rng = random.Random(seed)
    rng.shuffle(fns)
    per_fn: dict[str, int] = {f: 0 for f in fns}
    for t in tasks:
        for f in touched[t.instance_id]:
            per_fn[f] += 1
    cap = heldout_per_function or max(per_fn.values(), default=0)
    held: set[str] = set()
    goal = heldout_fraction * sum(min(n, cap) for n in per_fn.values())
    count = 0
    for f in fns:
        if count >= goal:
            break
        held.add(f)
        count += min(per_fn[f], cap)
    rest = [f for f in fns if f not in held]
    n_select = round(select_fraction * len(rest))
    if select_fraction > 0 and len(rest) >= 2:
        n_select = max(1, n_select)  # a choice needs at least one function to choose on
    select_fns = set(rest[:n_select])
    taken: dict[str, int] = {}
    heldout_l: list[Task] = []
    for t in sorted((t for t in tasks if touched[t.instance_id] <= held), key=lambda t: rng.random()):
        fs = touched[t.instance_id]
        if all(taken.get(f, 0) < cap for f in fs):
            heldout_l.append(t)
            for f in fs:
                taken[f] = taken.get(f, 0) + 1
    keep = {t.instance_id for t in heldout_l}
    heldout = tuple(t for t in tasks if t.instance_id in keep)  # in the input's order
    clean = [t for t in tasks if not (touched[t.instance_id] & held)]
    dropped = tuple(t.instance_id for t in tasks if t.instance_id not in keep and t not in clean)
    select = tuple(t for t in clean if touched[t.instance_id] & select_fns)
    train = tuple(t for t in clean if not (touched[t.instance_id] & select_fns))
    functions = {"heldout": tuple(sorted(held)), "select": tuple(sorted(select_fns)),
                 "train": tuple(sorted(set(rest) - select_fns))}
    return FunctionSplit(train, select, heldout, dropped, functions)


def check_disjoint(train: Sequence[Task], heldout: Sequence[Task], touched: dict[str, frozenset[str]]) -> None:
    """AssertionError when a held-out function is touched by a training task (the split's promise)."""
    held = {f for t in heldout for f in touched[t.instance_id]}
    for t in train:
        leak = touched[t.instance_id] & held
        assert not leak, f"{t.instance_id} trains on held-out function(s) {sorted(leak)}"
