"""The sealed test split: tasks of a held-out test split never reach training, selection or gating.

The built-in curriculum's "test" packages (and the built-in suite's "eval" packages, which are the
same code) are read once, for a final figure. The seal sits **at the loaders**, not at the commands:
every function that turns a task source into tasks (`builtin_suite`, `builtin_curriculum`,
`etude.evals.runner.resolve_suite`, `etude.envs.tasks_env.load_task_spec`,
`etude.envs.sources.load_task_source`, an organisation's local repository) takes a keyword-only
`use` — "train", "select", "gate", "final" or "build" — with no default, and refuses sealed tasks
for any use but "final" (a final figure) and "build" (building tasks; no model involved). A new
command cannot forget the seal: it cannot load tasks without saying why.
Every source spelling reaches the same check on the tasks it yields (`builtin:test`,
`builtin:eval`, `builtin:all`, `builtin:`, `builtin:curriculum:test[:L]`, a JSONL holding one
sealed task, an environment's default, a local clone of a sealed package).

The one way through is the logged override (`--allow-test-split` on the training, selecting and
gating commands): the command calls `check_sources(..., allow=True)` before it loads anything, which
prints a warning, returns the `contamination` record the caller writes into its outputs, and grants
the override to this process's loaders (`granted()` lists every grant), so a contaminated run says
so wherever its figures go.

An organisation's held-out tasks are sealed the same way: `etude specialise` writes them marked
(`seal_heldout`: `meta["sealed"]`), and every loader refuses a marked task for any use but "final".
A held-out set on the `RETIRED` list (probed while choices were made) is reported as a development
figure, not a test figure.

What this does not guarantee: that a model was never trained on a test package before this check
existed (docs/agent.md lists the figures that predate it), or that a package's code does not also
appear under another name (a renamed fork whose distribution and import names both differ).
"""

from __future__ import annotations

import configparser
import dataclasses
import re
import sys
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.tasks.fetch import normalise
from etude.tasks.schema import load_tasks
from etude.types import Task

OVERRIDE_FLAG = "--allow-test-split"
USES = ("train", "select", "gate", "final", "build")
"""Why tasks are loaded: to train on, to select a checkpoint or setting with, to gate a release on,
to read a final figure, or to build, validate or count tasks with no model involved (`etude tasks
curriculum`, `etude grade`). Only "final" and "build" may see a sealed task."""
OPEN_USES = ("final", "build")

_granted: list[dict[str, Any]] = []  # overrides granted in this process, in order

SEAL_KEY = "sealed"  # Task.meta key of an organisation's held-out test set (`seal_heldout`)

RETIRED: dict[str, str] = {
    "click==8.1.7": "its held-out functions were probed in four demo records (s38-s44) and three edit-turn RL "
                    "variants (edit_rl, edit_rl_attempt, edit_rl_capped) while reward weights and the read cap "
                    "changed: a development set since stop 45",
}
"""Organisation held-out sets retired as test sets, with why. Their figures predate the retirement
(docs/specialise.md lists them); a new run on them reports a development figure."""


# NOTE: the curriculum's "test" members and the suite's "eval" packages, stated here because their
# loaders check against this module (tests/tasks/test_seal.py keeps the three lists equal).
SEALED: frozenset[str] = frozenset({"idna", "itsdangerous", "parse", "schema", "inflection"})


def sealed_packages() -> frozenset[str]:
    """Normalised names of every package in a held-out test split."""
    return SEALED


def task_package(task: Task) -> str:
    """The package a task's code comes from (normalised): its sdist's name, else its repo's name."""
    name = task.source.get("package") or str(task.repo).rstrip("/").rsplit("/", 1)[-1]
    return normalise(str(name))


def _check_use(use: str) -> None:
    if use not in USES:
        raise ValueError(f"use must be one of {', '.join(USES)}, not {use!r}")


def _sealed_builtin(spec: str) -> bool:
    """A builtin: source that holds a sealed split: builtin:test, builtin:eval, builtin:all, builtin:
    (the suite's eval), builtin:curriculum:test[:L] (and builtin:curriculum: alone, which names no split)."""
    if not spec.startswith("builtin:"):
        return False
    parts = spec.split(":")
    if parts[1] == "history":
        return False
    split = parts[2] if parts[1] == "curriculum" and len(parts) > 2 else "" if parts[1] == "curriculum" else parts[1]
    return split in ("test", "eval", "all", "")


def override_active() -> bool:
    """True once this process was granted the override (`check_sources(..., allow=True)`)."""
    return bool(_granted)


def granted() -> list[dict[str, Any]]:
    """The overrides granted in this process (each a contamination record)."""
    return list(_granted)


def grant(where: str) -> dict[str, Any]:
    """Grant the override to this process for a command that loads no tasks itself (it reads runs
    that did): the warning, and the record the caller writes into its output."""
    print(f"etude: warning: {where} may use the sealed test split; this run is marked contaminated", file=sys.stderr)
    record = {"contaminated": True, "where": where, "packages": []}
    _granted.append(record)
    return record


def reset() -> None:
    """Forget every grant (tests; a long-lived process between runs)."""
    _granted.clear()


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
    record = {"contaminated": True, "where": where, "packages": list(found)}
    _granted.append(record)
    return record


def sealed_in(tasks: Iterable[Task]) -> list[str]:
    """The sealed packages `tasks` come from (sorted, each once)."""
    return sorted({p for t in tasks if (p := task_package(t)) in SEALED})


def sealed_repo_names(repo: str | Path) -> list[str]:
    """The sealed packages a local repository's names match (`repo_names`), sorted."""
    return sorted(repo_names(repo) & SEALED)


def guard(tasks: Iterable[Task], *, use: str, where: str) -> list[Task]:
    """`tasks`, unless one holds a sealed package and `use` is not "final" (EtudeError naming
    `where`), or the override was granted to this process (then a warning, and `tasks`)."""
    _check_use(use)
    tasks = list(tasks)
    if use not in OPEN_USES and not override_active():
        found = sealed_in(tasks) + sorted({str(t.meta[SEAL_KEY]) for t in tasks if t.meta.get(SEAL_KEY)})
        if found:
            _refuse_or_record(found, where, False)
    return tasks


def seal_heldout(tasks: Iterable[Task], label: str) -> list[Task]:
    """`tasks` marked as an organisation's held-out test set (`meta["sealed"] = label`): every
    loader then refuses them for training, selection and gating, as it refuses the built-in test
    split. The mark travels with the tasks into any file they are saved to."""
    return [dataclasses.replace(t, meta={**t.meta, SEAL_KEY: label}) for t in tasks]


def retired(repos: Iterable[str]) -> dict[str, str]:
    """The repositories among `repos` whose held-out set was probed while choices were made (`RETIRED`):
    their held-out figures are a development set's, not a test set's."""
    return {r: RETIRED[r] for r in repos if r in RETIRED}


def guard_split(spec: str, *, use: str, where: str) -> None:
    """Refuse a builtin: split that holds sealed packages before anything of it is built."""
    _check_use(use)
    if use not in OPEN_USES and _sealed_builtin(spec) and not override_active():
        _refuse_or_record([spec], where, False)


def repo_names(repo: str | Path) -> set[str]:
    """Names a local repository's code goes by, normalised: its folder's name, its distribution's
    name (pyproject.toml, setup.cfg, setup.py) and its top-level import names (at its root or under
    src/: packages with __init__.py and single-file modules)."""
    root = Path(repo)
    names = {root.name}
    try:
        meta = tomllib.loads((root / "pyproject.toml").read_text())
        names.add(str(meta.get("project", {}).get("name") or meta.get("tool", {}).get("poetry", {}).get("name") or ""))
    except (OSError, tomllib.TOMLDecodeError, AttributeError):
        pass
    cfg = configparser.ConfigParser()
    try:
        cfg.read(root / "setup.cfg")
        names.add(cfg.get("metadata", "name", fallback=""))
    except configparser.Error:
        pass
    try:
        if m := re.search(r"""\bname\s*=\s*['"]([A-Za-z0-9_.\-]+)['"]""", (root / "setup.py").read_text()):
            names.add(m.group(1))
    except OSError:
        pass
    for base in (root, root / "src"):
        if not base.is_dir():
            continue
        for p in base.iterdir():
            if p.is_dir() and (p / "__init__.py").is_file():
                names.add(p.name)
            elif p.suffix == ".py" and p.stem not in ("setup", "conftest", "noxfile", "tasks", "docs"):
                names.add(p.stem)
    return {normalise(n) for n in names if n}


def guard_repo(repo: str | Path, *, use: str, where: str) -> None:
    """Refuse a local repository whose code is a sealed package's (by its names: `repo_names`)."""
    _check_use(use)
    if use in OPEN_USES or override_active():
        return
    if found := sealed_repo_names(repo):
        raise EtudeError(f"{where}: {repo} holds the code of a sealed test-split package ({', '.join(found)}); "
                         f"it cannot be used to train, select or gate ({OVERRIDE_FLAG} overrides and marks the "
                         "run contaminated)")


def check_tasks(tasks: Iterable[Task], where: str, allow: bool = False) -> dict[str, Any] | None:
    """Refuse `tasks` holding a sealed package (EtudeError), or with `allow` return the
    contamination record (None when clean) and grant the override to this process's loaders."""
    return _refuse_or_record(sealed_in(tasks), where, allow)


def check_source(spec: str | Path | None, where: str, allow: bool = False) -> dict[str, Any] | None:
    """`check_tasks` for a task source given by name, before anything is built or written:
    builtin:... by its split, a JSONL by the packages of its tasks, a directory by its names
    (`repo_names`). A source that does not exist is left to its loader."""
    if spec is None or spec == "":
        return None
    text = str(spec)
    if text.startswith("builtin:"):
        return _refuse_or_record([text], where, allow) if _sealed_builtin(text) else None
    p = Path(text)
    if p.is_dir():
        return _refuse_or_record(sealed_repo_names(p), where, allow)
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


def disjoint(a: Sequence[Task], b: Sequence[Task], what_a: str, what_b: str) -> None:
    """Refuse two task lists that share a task (the loop's traffic and its gate)."""
    common = sorted({t.instance_id for t in a} & {t.instance_id for t in b})
    if common:
        raise EtudeError(f"{what_a} and {what_b} share {len(common)} task(s) (first: {common[0]}): a candidate "
                         "trained on its users' traffic would be gated on tasks it trained on; give them disjoint "
                         "sources")
