"""Trajectory files: JSONL, one `Trajectory.to_dict()` per line, one line per episode.

The harness rewrites its episode's line in place after every step, so the file always holds the
latest state of a running episode (`meta.complete` is false until it ends). Several episodes may
share one file *sequentially* (each appends its own line); concurrent writers to one file are not
supported. The line is written with one `pwrite` then a truncate, so a killed process leaves
either the previous state or the new one (a power cut may leave a torn last line, which
`load_trajectories` skips and reports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from etude.types import Trajectory


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

    def write(self, traj: Trajectory) -> None:
        data = (traj.to_json() + "\n").encode()
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
