"""`etude grade` (typer/stdlib at top level only): one patch on one task, JSON verdict + reward."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from etude.envs.grade import grade
from etude.errors import EtudeError
from etude.rewards import apply_flags, breakdown_json, score_patch
from etude.tasks.schema import find_task, load_tasks


def grade_cmd(
    tasks: Annotated[Path, typer.Option("--tasks", help="Task file (JSONL or parquet).")],
    instance: Annotated[str, typer.Option("--instance", help="instance_id of the task.")],
    patch: Annotated[Path, typer.Option("--patch", help="Unified diff to grade ('-' reads stdin).")],
) -> None:
    """Grade a patch in a clean workspace with the task's own tests; print the verdict as JSON."""
    if str(patch) == "-":
        patch_text = sys.stdin.read()
    elif not patch.is_file():
        raise EtudeError(f"patch file not found: {patch}")
    else:
        patch_text = patch.read_text(encoding="utf-8", errors="surrogateescape")
    task = find_task(load_tasks(tasks), instance)
    graded = grade(task, patch_text)
    print(json.dumps(verdict_json(task, patch_text, graded), indent=2))


def verdict_json(task, patch_text: str, graded) -> dict:
    """The `etude grade` object: the outcome, `reward` (total + terms) and `flags`."""
    breakdown = score_patch(task, patch_text, graded.outcome)
    outcome = apply_flags(graded.outcome, breakdown.flags)
    return {**outcome.to_dict(), "ignored_paths": list(graded.ignored_paths), **breakdown_json(breakdown)}


def register(app: typer.Typer) -> None:
    app.command("grade", no_args_is_help=True)(grade_cmd)
