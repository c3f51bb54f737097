"""Loading and saving tasks: etude JSONL, SWE-bench JSONL and SWE-bench parquet.

A task file is one JSON object per line. SWE-bench rows (from Hugging Face dumps) carry
FAIL_TO_PASS / PASS_TO_PASS as JSON-encoded strings; we accept both that and real lists.
A bad line never stops the others from loading: `load_tasks` collects one error per bad line
and, unless `strict`, warns with them and returns the good tasks (`load_tasks_report` returns
both). What this does not do: check that a task is *valid* (that its tests fail and pass as
claimed) — that is `etude.tasks.validate`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etude.errors import EtudeError, NotFound
from etude.types import Task

_LIST_FIELDS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_DICT_FIELDS = ("source", "setup", "meta")
_REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "problem_statement")
_FIELDS = {f.name for f in dataclasses.fields(Task)}


def _as_list(value: Any, name: str) -> tuple[str, ...]:
    # SWE-bench on HF stores these lists as JSON text; files we write hold real lists.
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} is a string but not a JSON list: {e.msg}") from None
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{name} must be a list of test ids")
    return tuple(value)


def _as_dict(value: Any, name: str) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    return dict(value)


def task_from_dict(d: dict[str, Any]) -> Task:
    """A Task from one row (ours or SWE-bench's). Unknown keys go to `meta`; raises ValueError."""
    if not isinstance(d, dict):
        raise ValueError("a task must be a JSON object")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(f"missing field(s): {', '.join(missing)}")
    kw: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in d.items():
        if key not in _FIELDS:
            extra[key] = value
        elif key in _LIST_FIELDS:
            kw[key] = _as_list(value, key)
        elif key in _DICT_FIELDS:
            kw[key] = _as_dict(value, key)
        elif key == "timeout_s":
            kw[key] = float(value)
        else:
            kw[key] = "" if value is None else str(value)
    if "strategy" not in d and "source" not in d:
        kw["strategy"] = "swe-bench"  # a foreign row: we cannot build its repo from PyPI
    if extra:
        kw["meta"] = {**kw.get("meta", {}), **extra}
    return Task(**kw)


def task_to_dict(task: Task) -> dict[str, Any]:
    d = task.to_dict()
    d["FAIL_TO_PASS"] = list(task.FAIL_TO_PASS)
    d["PASS_TO_PASS"] = list(task.PASS_TO_PASS)
    return d


def _rows_jsonl(path: Path) -> Iterable[tuple[int, Any, str | None]]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line), None
            except json.JSONDecodeError as e:
                yield lineno, None, f"not JSON ({e.msg} at column {e.colno})"


def _rows_parquet(path: Path) -> Iterable[tuple[int, Any, str | None]]:
    try:
        import pandas as pd

        frame = pd.read_parquet(path)
    except ImportError:
        raise EtudeError(f"{path}: cannot read parquet: it needs pandas and pyarrow (pip install pyarrow)") from None
    except Exception as e:  # a corrupt file: the whole file is unreadable, say so in one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise EtudeError(f"{path}: cannot read parquet: {first}") from None
    for i, row in enumerate(frame.to_dict(orient="records"), 1):
        yield i, row, None


def load_tasks_report(path: str | Path) -> tuple[list[Task], list[str]]:
    """All good tasks of a file and one error line per bad row ("FILE:LINE: why")."""
    p = Path(path)
    if not p.is_file():
        raise NotFound(f"task file not found: {p}")
    rows = _rows_parquet(p) if p.suffix == ".parquet" else _rows_jsonl(p)
    tasks: list[Task] = []
    errors: list[str] = []
    seen: set[str] = set()
    for lineno, row, err in rows:
        if err is None:
            try:
                task = task_from_dict(row)
                if task.instance_id in seen:
                    raise ValueError(f"duplicate instance_id {task.instance_id!r}")
                seen.add(task.instance_id)
                tasks.append(task)
                continue
            except (ValueError, TypeError) as e:
                err = str(e)
        errors.append(f"{p}:{lineno}: {err}")
    return tasks, errors


def load_tasks(path: str | Path, *, strict: bool = False) -> list[Task]:
    """Tasks from etude/SWE-bench JSONL or SWE-bench parquet. Bad rows are reported on stderr
    (one line each) and skipped; with `strict` the first bad row raises EtudeError instead."""
    tasks, errors = load_tasks_report(path)
    if errors and strict:
        raise EtudeError(errors[0])
    for e in errors:
        print(f"etude: warning: skipped {e}", file=sys.stderr)
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | Path) -> int:
    """Write tasks as JSONL (atomically: a reader never sees half a file). Returns the count."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}-{threading.get_ident()}")  # writers never share it
    n = 0
    with tmp.open("w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps(task_to_dict(t), ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(p)
    return n


def find_task(tasks: list[Task], instance_id: str) -> Task:
    for t in tasks:
        if t.instance_id == instance_id:
            return t
    raise NotFound(f"no task {instance_id!r} in the file ({len(tasks)} tasks)")
