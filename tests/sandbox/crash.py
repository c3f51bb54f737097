"""A process that dies holding a workspace: what `sweep_stale` and the next `Workspace.create`
must clean up (the overlay and disk-cap tests both need one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def crash_leaving_workspace(template: Path, root: Path, **create: object) -> tuple[Path, Path]:
    """A child process makes a workspace of `template` under `root` (`create`: more keyword
    arguments of Workspace.create) and exits without closing it; returns its (base, path)."""
    args = "".join(f", {k}={v!r}" for k, v in create.items())
    code = (
        "import os\nfrom etude.sandbox import Workspace\n"
        f"w = Workspace.create({str(template)!r}, root={str(root)!r}{args})\n"
        "print(w.base, w.path, flush=True)\nos._exit(1)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False).stdout.split()
    return Path(out[0]), Path(out[1])
