"""The sealed test split: task sources that hold a test-split package never reach training,
selection or gating.

The built-in curriculum's "test" packages (and the built-in suite's "eval" packages, which are the
same code) are read once, for a final figure. Every command that trains, selects a checkpoint or
gates (`etude sft`, `etude train`, `etude specialise`, `etude loop`, the demo's training stages)
calls `check_source` / `check_tasks` on each task source it is given. A sealed package there is
one line and exit 2, unless the caller passes the explicit override (`allow_test_split`), which
prints a warning and returns a `contamination` record the caller writes into its outputs, so a
contaminated run says so wherever its figures go.

What this does not guarantee: that a model was never trained on a test package before this check
existed (docs/agent.md lists the figures that predate it), or that a package's code does not also
appear under another name (a fork or a vendored copy).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.tasks.curriculum import BUILTIN
from etude.tasks.fetch import normalise
from etude.tasks.schema import load_tasks
from etude.tasks.suite import PACKAGES
from etude.types import Task

OVERRIDE_FLAG = "--allow-test-split"


def sealed_packages() -> frozenset[str]:
    """Normalised names of every package in a held-out test split."""

    names = {m.spec.split("==", 1)[0] for m in BUILTIN if m.split == "test"}
    names |= {p.name for p in PACKAGES if p.split == "eval"}
    return frozenset(normalise(n) for n in names)


def task_package(task: Task) -> str:
    """The package a task's code comes from (normalised): its sdist's name, else its repo's name."""
    name = task.source.get("package") or str(task.repo).rstrip("/").rsplit("/", 1)[-1]
    return normalise(str(name))


def _sealed_builtin(spec: str) -> bool:
    """builtin:test, builtin:curriculum:test[:L] and builtin:eval (the suite's eval = test packages)."""
    if not spec.startswith("builtin:"):
        return False
    parts = spec.split(":")
    split = parts[2] if len(parts) > 2 and parts[1] == "curriculum" else parts[1] if len(parts) > 1 else ""
    return split in ("test", "eval")


def _refuse_or_record(found: Sequence[str], where: str, allow: bool) -> dict[str, Any] | None:
    if not found:
        return None
    names = ", ".join(found)
    if not allow:
        raise EtudeError(f"{where}: tasks from the sealed test split ({names}) cannot be used to train, "
                         f"select or gate; they are read once, for final figures ({OVERRIDE_FLAG} overrides "
                         "and marks the run contaminated)")
    print(f"etude: warning: {where} uses test-split packages ({names}); this run is marked contaminated",
          file=sys.stderr)
    return {"contaminated": True, "where": where, "packages": list(found)}


def check_tasks(tasks: Iterable[Task], where: str, allow: bool = False) -> dict[str, Any] | None:
    """Refuse `tasks` holding a sealed package (EtudeError), or with `allow` return the
    contamination record (None when clean)."""
    sealed = sealed_packages()
    found = sorted({p for t in tasks if (p := task_package(t)) in sealed})
    return _refuse_or_record(found, where, allow)


def check_source(spec: str | Path | None, where: str, allow: bool = False) -> dict[str, Any] | None:
    """`check_tasks` for a task source given by name: builtin:... by its split (nothing is built),
    a JSONL by the packages of its tasks. A source that does not exist is left to its loader."""
    if spec is None or spec == "":
        return None
    text = str(spec)
    if text.startswith("builtin:"):
        if _sealed_builtin(text):
            return _refuse_or_record([text], where, allow)
        return None
    p = Path(text)
    if not p.is_file():
        return None

    try:
        tasks = load_tasks(p)
    except EtudeError:
        return None  # its loader says what is wrong with it
    return check_tasks(tasks, where, allow)


def check_sources(specs: Iterable[tuple[str, str | Path | None]], allow: bool = False) -> dict[str, Any] | None:
    """`check_source` over (where, spec) pairs; the merged contamination record or None."""
    records = [r for where, spec in specs if (r := check_source(spec, where, allow)) is not None]
    if not records:
        return None
    return {"contaminated": True, "where": [r["where"] for r in records],
            "packages": sorted({p for r in records for p in r["packages"]})}
