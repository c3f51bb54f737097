"""`state.json` of one cycle: each stage's status, outputs and timings, written atomically.

A stage is "pending", "running", "done" or "skipped". The file is rewritten (temp file, fsync,
rename) when a stage starts and when it finishes, so after a crash at any moment it holds either
the state before or after that change, never half of it. A stage found "running" on resume was
interrupted and is run again (every stage is written to be safe to repeat); a "done" stage is
never run again and its outputs are read from here.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STAGES = ("collect", "distill", "train", "eval", "register", "canary", "readout", "decide")


class CycleState:
    def __init__(self, path: Path, data: dict[str, Any]):
        self.path, self.data = path, data

    @classmethod
    def load_or_create(cls, cycle_dir: Path, index: int, config: dict[str, Any]) -> CycleState:
        path = cycle_dir / "state.json"
        if path.is_file():
            return cls(path, json.loads(path.read_text()))
        cycle_dir.mkdir(parents=True, exist_ok=True)
        data = {"cycle": index, "created_at": time.time(), "config": config, "finished": False,
                "stages": {s: {"status": "pending", "attempts": 0, "outputs": {}} for s in STAGES}}
        st = cls(path, data)
        st.save()
        return st

    def stage(self, name: str) -> dict[str, Any]:
        return self.data["stages"][name]

    def status(self, name: str) -> str:
        return str(self.stage(name)["status"])

    def start(self, name: str) -> dict[str, Any]:
        s = self.stage(name)
        s.update(status="running", started_at=time.time(), attempts=int(s.get("attempts", 0)) + 1)
        self.save()
        return s

    def progress(self, name: str, **outputs: Any) -> None:
        """Record partial outputs of a running stage (what a rerun needs to continue)."""
        self.stage(name)["outputs"].update(outputs)
        self.save()

    def finish(self, name: str, status: str = "done", **outputs: Any) -> None:
        s = self.stage(name)
        now = time.time()
        s["outputs"].update(outputs)
        s.update(status=status, finished_at=now, wall_s=round(now - s.get("started_at", now), 3))
        s["total_wall_s"] = round(float(s.get("total_wall_s", 0.0)) + s["wall_s"], 3)
        self.save()

    def skip(self, name: str, reason: str) -> None:
        s = self.stage(name)
        s.update(status="skipped", wall_s=0.0, reason=reason)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as fh:
            fh.write(json.dumps(self.data, indent=1, default=str))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
