"""`etude tasks mine | synth | validate | build-suite` (typer/rich/stdlib at top level only).

Results go to the --out file; progress goes to stderr, and each command prints one JSON summary
on stdout.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError
from etude.tasks.curriculum import LEVELS, build, builtin_curriculum, read_packages
from etude.tasks.history import HistoryConfig, mine_history, summary
from etude.tasks.mine import mine
from etude.tasks.schema import load_tasks_report, save_tasks
from etude.tasks.suite import build_suite, package_tasks, select_packages
from etude.tasks.synth import SynthConfig, synthesise
from etude.tasks.validate import validate_task

tasks_app = typer.Typer(help="Tasks from real packages: mine release diffs, synthesise bugs, validate, build the suite.",
                        no_args_is_help=True)  # fmt: skip


@contextmanager
def _status(title: str) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr whose text follows the work's progress messages."""
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(title) as st:
        yield lambda msg: st.update(f"{title}: {msg}")


def _emit(obj: object) -> None:
    print(json.dumps(obj, indent=2))


@tasks_app.command("mine", no_args_is_help=True)
def mine_cmd(
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write the tasks to.")],
    package: Annotated[str | None, typer.Option("--package", help="PyPI package name.")] = None,
    v_from: Annotated[str | None, typer.Option("--from", help="The older release (its source is the task's base).")] = None,
    v_to: Annotated[str | None, typer.Option("--to", help="The newer release (its tests and source diff).")] = None,
    repo: Annotated[Path | None, typer.Option("--repo", help="Instead of --package: mine a local git repository's commits.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="With --repo: only commits after this revision.")] = None,
    until: Annotated[str, typer.Option("--until", help="With --repo: the newest commit to mine.")] = "HEAD",
    max_tasks: Annotated[int | None, typer.Option("--max", help="With --repo: most tasks to keep.")] = None,
    split: Annotated[bool, typer.Option(help="Split the release into one task per fixing hunk/file.")] = True,
    max_trials: Annotated[int, typer.Option(help="Most single-hunk trials when splitting.")] = 60,
    extra_dep: Annotated[list[str] | None, typer.Option(help="Extra test requirement (repeatable).")] = None,
) -> None:  # fmt: skip
    """Tasks from a release pair (old source against new tests) or from a git repository's commits."""
    if repo is not None:
        if package or v_from or v_to:
            raise EtudeError("give either --repo DIR or --package NAME --from V --to V, not both")
        _mine_repo(repo, out, since, until, max_tasks, extra_dep or ())
        return
    if not (package and v_from and v_to):
        raise EtudeError("give --package NAME --from V --to V, or --repo DIR")
    with _status(f"mining {package} {v_from} -> {v_to}") as say:
        tasks = mine(
            package, v_from, v_to, split=split, max_trials=max_trials, extra_deps=extra_dep or (), progress=say
        )
    save_tasks(tasks, out)
    _emit({"out": str(out), "tasks": len(tasks), "instances": {t.instance_id: len(t.FAIL_TO_PASS) for t in tasks}})


def _mine_repo(repo: Path, out: Path, since: str | None, until: str, max_tasks: int | None,
               extra_deps: Sequence[str]) -> None:  # fmt: skip
    """`mine --repo`: the tasks to --out, one summary line of skips on stderr, JSON on stdout."""
    import sys

    if max_tasks is not None and max_tasks < 1:
        raise EtudeError(f"--max must be at least 1, got {max_tasks}")
    cfg = HistoryConfig(max_tasks=max_tasks, since=since, until=until, extra_deps=tuple(extra_deps))
    with _status(f"mining the history of {repo}") as say:
        tasks, skipped = mine_history(repo, cfg, progress=say)
    save_tasks(tasks, out)
    print(f"etude tasks mine: {summary(len(tasks) + sum(skipped.values()), len(tasks), skipped)}", file=sys.stderr)
    _emit({"out": str(out), "tasks": len(tasks), "skipped": dict(skipped),
           "instances": {t.instance_id: len(t.FAIL_TO_PASS) for t in tasks}})  # fmt: skip


@tasks_app.command("synth", no_args_is_help=True)
def synth_cmd(
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write the tasks to.")],
    package: Annotated[str | None, typer.Option("--package", help="NAME==VERSION of a PyPI package.")] = None,
    repo: Annotated[Path | None, typer.Option("--repo", help="A local repository directory instead.")] = None,
    max_tasks: Annotated[int, typer.Option("--max", help="Most tasks to produce.")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the order of mutation sites.")] = 0,
    extra_dep: Annotated[list[str] | None, typer.Option(help="Extra test requirement (repeatable).")] = None,
) -> None:
    """Synthesise bugs (libcst mutations, and 2-3 combined) that the package's tests catch."""
    if (package is None) == (repo is None):
        raise EtudeError("give exactly one of --package NAME==VERSION or --repo DIR")
    if max_tasks < 1:
        raise EtudeError(f"--max must be at least 1, got {max_tasks}")
    cfg = SynthConfig(max_tasks=max_tasks, seed=seed, extra_deps=tuple(extra_dep or ()))
    with _status(f"synthesising bugs in {package or repo}") as say:
        tasks = synthesise(package, repo, cfg, progress=say)
    save_tasks(tasks, out)
    by: dict[str, int] = {}
    for t in tasks:
        by[t.strategy] = by.get(t.strategy, 0) + 1
    _emit({"out": str(out), "tasks": len(tasks), "by_strategy": by})


@tasks_app.command("validate", no_args_is_help=True)
def validate_cmd(
    file: Annotated[Path, typer.Argument(help="JSONL (etude or SWE-bench) or parquet task file.")],
    out: Annotated[Path | None, typer.Option("--out", help="Write the kept tasks (F2P/P2P as measured) here.")] = None,
    runs: Annotated[int, typer.Option(help="Runs of each state (at least 2).")] = 2,
) -> None:
    """Re-run every task at base and with its gold patch in the sandbox; keep the valid ones."""
    from rich.progress import Progress

    tasks, errors = load_tasks_report(file)
    verdicts = []
    with Progress(transient=True, console=_stderr_console()) as bar:
        job = bar.add_task("validating", total=len(tasks))
        for t in tasks:
            verdicts.append(validate_task(t, runs=runs))
            bar.advance(job)
    kept = [v.task for v in verdicts if v.kept and v.task is not None]
    if out is not None:
        save_tasks(kept, out)
    _emit({"file": str(file), "tasks": len(tasks), "kept": len(kept), "dropped": len(tasks) - len(kept),
           "bad_lines": errors, "verdicts": [v.summary() for v in verdicts]})  # fmt: skip


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


@tasks_app.command("build-suite")
def build_suite_cmd(
    out: Annotated[Path, typer.Option("--out", help="Directory for train.jsonl, eval.jsonl, summary.json.")],
    package: Annotated[list[str] | None, typer.Option(help="Only these built-in packages (repeatable).")] = None,
) -> None:
    """Build the built-in suite (cached per package; resumes) and write its train / eval splits."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


    chosen = select_packages(package)
    cols = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*cols, console=_stderr_console()) as bar:
        job = bar.add_task("suite", total=len(chosen))
        for p in chosen:
            bar.update(job, description=f"{p.name}=={p.version}")
            package_tasks(p, lambda m, job=job: bar.update(job, description=m))
            bar.advance(job)
    _emit(build_suite(out, package or None))


@tasks_app.command("curriculum")
def curriculum_cmd(
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write the tasks to.")],
    packages: Annotated[str | None, typer.Option("--packages", help="NAME==V[,NAME==V...] or a file with one requirement a line.")] = None,
    split: Annotated[str | None, typer.Option("--split", help="Instead of --packages: the built-in split train | validation | test.")] = None,
    level: Annotated[int, typer.Option("--level", help="1: bug named by test, file and function; 2: failing tests only; 3: multi-site and mined.")] = 1,
    max_tasks: Annotated[int | None, typer.Option("--max", help="Most tasks to produce.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for the order of mutation sites.")] = 0,
) -> None:
    """Validated curriculum tasks at one level, from packages or from the built-in split (cached)."""
    if level not in LEVELS:
        raise EtudeError(f"--level must be 1, 2 or 3, not {level}")
    if (packages is None) == (split is None):
        raise EtudeError("give exactly one of --packages NAME==V[,...] or --split train|validation|test")
    with _status(f"curriculum level {level}") as say:
        if packages is not None:
            tasks = build(read_packages(packages), level, max_tasks or 50, seed, progress=say)
        else:
            tasks = builtin_curriculum(split or "", level, seed, max_tasks, progress=say, use="build")
    save_tasks(tasks, out)
    by: dict[str, int] = {}
    for t in tasks:
        key = t.source.get("package", t.repo)
        by[key] = by.get(key, 0) + 1
    _emit({"out": str(out), "tasks": len(tasks), "level": level, "packages": by})


def register(app: typer.Typer) -> None:
    app.add_typer(tasks_app, name="tasks")
