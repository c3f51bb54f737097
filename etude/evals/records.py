"""results.jsonl: one record per finished episode, appended durably, read back tolerantly.

Each record is written as one line with a single write, then flushed and fsync'ed before the next
episode is counted as done, so a run killed at any instant leaves every finished episode on disk
and at most one partial last line. On open, a partial last line (no newline) is cut off; when
reading, the last record of an (instance_id, sample) wins (a retried error is superseded).
What this does not guarantee: safety against two *processes* writing the same file at once (one
run per output folder; threads of one run share a lock).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from etude.evals.stats import paired_summary

Key = tuple[str, int]


def key_of(rec: dict[str, Any]) -> Key:
    return str(rec["instance_id"]), int(rec.get("sample", 0))


def read_records(path: Path) -> dict[Key, dict[str, Any]]:
    """Every complete record of a results file, the last per (instance_id, sample)."""
    out: dict[Key, dict[str, Any]] = {}
    if not path.is_file():
        return out
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a line cut by a crash: the episode is not done
            try:
                rec = json.loads(line)
                out[key_of(rec)] = rec
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue
    return out


def outcome_by_task(run: Path, outcome: Callable[[dict[str, Any]], bool]) -> dict[str, int]:
    """1 or 0 per instance id of an eval run's first sample: `outcome` of its record, 0 for an
    errored episode. The paired outcomes McNemar's test and the demo compare."""
    return {iid: int(r.get("status") == "ok" and bool(outcome(r)))
            for (iid, k), r in read_records(Path(run) / "results.jsonl").items() if k == 0}


def resolved_by_task(run: Path) -> dict[str, int]:
    """Was the task resolved (see `outcome_by_task`)?"""
    return outcome_by_task(run, lambda r: r.get("resolved"))


def tool_use_by_task(run: Path) -> dict[str, int]:
    """Did the agent run at least one well-formed tool call (see `outcome_by_task`)? A behaviour
    outcome: the base model may run none, a warm-started one nearly always does."""
    return outcome_by_task(run, lambda r: (r.get("efficiency") or {}).get("calls_well_formed", 0) > 0)


def paired_outcomes(a: Path, b: Path, only: Sequence[str] | None = None) -> dict[str, Any]:
    """Run `b` against run `a` on the tasks both evaluated (and in `only`, if given): the change in
    resolved rate, the tasks only `b` and only `a` resolved, and the exact McNemar p."""
    ra, rb = resolved_by_task(a), resolved_by_task(b)
    ids = sorted(set(ra) & set(rb) & set(only if only is not None else ra))
    return paired_summary([ra[i] for i in ids], [rb[i] for i in ids])


class ResultsWriter:
    """Appends records to results.jsonl; thread-safe; each append is durable when it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        _cut_partial_tail(path)

    def append(self, rec: dict[str, Any]) -> None:
        line = (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)


def _cut_partial_tail(path: Path) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    # NOTE: a crash mid-write leaves a line without its newline; appending after it would glue
    # the next record onto it, so I drop it (that episode runs again).
    with path.open("r+b") as f:
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
