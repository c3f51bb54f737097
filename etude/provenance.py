"""Where a figure came from: the record every result file carries (`provenance`).

`provenance(seeds=..., started=..., stages=...)` gives the git commit and whether the tree was
dirty (tracked files other than bench/results/, which holds what the benchmarks themselves
write: a bench that rewrites its plot before it takes its provenance is not "dirty" for it; a
dirty tree lists its changed paths in `git_dirty_paths`), the command line, the seeds, the
machine (CPU, cores, memory, Python, torch), start and end times, and per stage its seconds and
whether this invocation resumed it (a resumed stage's seconds are those of the run that did the
work).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "bench/results"  # what benchmarks write (results, records, plots): never counts as a dirty tree


def _git(*args: str) -> str | None:
    try:
        r = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = None
    try:
        kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
        mem = round(kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    out: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem, "python": platform.python_version(),
                           "platform": platform.platform()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return out


def provenance(*, seeds: dict[str, Any] | None = None, started: float | None = None,
               stages: dict[str, Any] | None = None, argv: list[str] | None = None) -> dict[str, Any]:
    status = _git("diff", "--name-only", "HEAD", "--", ".", f":(exclude){RESULTS}")  # staged or not
    changed = status.splitlines() if status else []
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(changed) if status is not None else None,
        **({"git_dirty_paths": changed[:50]} if changed else {}),
        "command": " ".join(argv if argv is not None else sys.argv),
        "seeds": seeds or {},
        "machine": machine(),
        "started": started,
        "ended": time.time(),
        "stages": stages or {},
    }
