"""Trajectory files: JSONL, one `Trajectory.to_dict()` per line, one line per episode.

The harness rewrites its episode's line in place after every step, so the file always holds the
latest state of a running episode (`meta.complete` is false until it ends). Several episodes may
share one file *sequentially* (each appends its own line); concurrent writers to one file are not
supported. The line is written with one `pwrite` then a truncate, so a killed process leaves
either the previous state or the new one (a power cut may leave a torn last line, which
`load_trajectories` skips and reports).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.types import Generation, Message, NativeGeneration, ToolCall, ToolExecution, ToolResult, Trajectory, Turn


class TrajectoryWriter:
    """Owns the last line of `path` for one episode."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            os.pwrite(self._fd, b"\n", size)  # I don't want to glue our line onto a torn one
            size += 1
        self._offset = size

    def write(self, traj: Trajectory | dict[str, Any]) -> None:
        """Replace this episode's line with `traj` (a Trajectory or its `to_dict()`)."""
        d = traj.to_dict() if isinstance(traj, Trajectory) else traj
        data = (json.dumps(d, ensure_ascii=False) + "\n").encode()
        os.pwrite(self._fd, data, self._offset)
        os.ftruncate(self._fd, self._offset + len(data))

    def close(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


def load_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a trajectory file, as dicts (torn lines are skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def trajectory_from_dict(d: dict[str, Any]) -> Trajectory:
    """Rebuild a Trajectory (with its turns, generations and tool executions) from `to_dict()`.
    Keys this version does not know are ignored, so older readers can load newer files."""
    fields = {f.name for f in dataclasses.fields(Trajectory)}
    kw = {k: v for k, v in d.items() if k in fields}
    kw["messages"] = tuple(Message.from_dict(m) for m in d.get("messages") or ())
    kw["turns"] = tuple(_turn(t) for t in d.get("turns") or ())
    return Trajectory(**kw)


def load_trajectory(path: str | Path, episode_id: str | None = None) -> Trajectory:
    """The last episode of a trajectory file (or the one named `episode_id`)."""
    try:
        rows = load_trajectories(path)
    except OSError as e:
        raise EtudeError(f"cannot read trajectory file {path}: {e.strerror}") from e
    rows = [r for r in rows if episode_id is None or r.get("episode_id") == episode_id]
    if not rows:
        raise EtudeError(f"no {'episode ' + episode_id if episode_id else 'trajectory'} in {path}")
    return trajectory_from_dict(rows[-1])


def _turn(d: dict[str, Any]) -> Turn:
    execs = tuple(
        ToolExecution(call=ToolCall.from_dict(x["call"]), result=ToolResult.from_dict(x["result"]),
                      started_s=float(x.get("started_s", 0.0)), duration_s=float(x.get("duration_s", 0.0)))
        for x in d.get("tool_executions") or ()
    )
    return Turn(index=int(d["index"]), generation=_generation(d["generation"]), tool_executions=execs,
                parse_errors=tuple(d.get("parse_errors") or ()))


def _generation(d: dict[str, Any]) -> Generation:
    # the subclass carries a superset of fields
    cls = NativeGeneration if {"tool_call_errors", "response_id"} & d.keys() else Generation
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in d.items() if k in names}
    for k in ("prompt_token_ids", "token_ids", "logprobs", "tool_call_errors"):
        if k in kw:
            kw[k] = tuple(kw[k] or ())
    if kw.get("tool_calls") is not None:
        kw["tool_calls"] = tuple(ToolCall.from_dict(c) for c in kw["tool_calls"])
    return cls(**kw)
