"""Training metrics: one JSON object per line in `OUT/metrics.jsonl`, and TensorBoard events.

On resume from step `s`, records after `s` (written by the run that was killed) are dropped
from the JSONL and TensorBoard is told to purge them, so each step appears once; `s = -1`
(a fresh run) drops them all.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class MetricsWriter:
    def __init__(self, out: Path, resume_step: int = 0, tensorboard: bool = True):
        self.path = out / "metrics.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        self._truncate(resume_step)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tb"), purge_step=resume_step + 1 if resume_step > 0 else None)
            except ImportError:  # tensorboard is a pinned dependency; if absent, JSON still works
                self.tb = None
        self.fh = self.path.open("a")

    def _truncate(self, step: int) -> None:
        if not self.path.is_file():
            return
        keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and _step_of(ln) <= step]
        self.path.write_text("".join(ln + "\n" for ln in keep))

    def write(self, record: dict[str, Any]) -> None:
        self.fh.write(json.dumps(record) + "\n")
        self.fh.flush()
        if self.tb is not None:
            step = int(record.get("step", 0))
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        self.fh.close()
        if self.tb is not None:
            self.tb.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (json.JSONDecodeError, AttributeError, ValueError):
        return 1 << 60  # a torn last line from a killed run: drop it


def read_metrics(out: Path) -> list[dict[str, Any]]:
    p = Path(out) / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.is_file() else []
