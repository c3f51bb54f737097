"""`etude loop --config FILE`: run (or resume) real-time RL cycles. Logic lives in etude.loop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def loop(
    config: Annotated[Path, typer.Option("--config", help="loop TOML (see configs/loop_tiny.toml, docs/loop.md)")],
    cycles: Annotated[int, typer.Option("--cycles", help="cycles to run one after another")] = 1,
    cycle_dir: Annotated[Path | None, typer.Option("--cycle-dir", help="run/resume this cycle directory")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress output")] = False,
) -> None:
    """Run one real-time RL cycle (resuming an unfinished one) and print its report as JSON."""
    from etude.errors import EtudeError
    from etude.loop import LoopConfig, run_cycle

    if cycles < 1:
        raise EtudeError("--cycles must be at least 1")
    if cycle_dir is not None and cycles != 1:
        raise EtudeError("--cycle-dir runs exactly one cycle; drop --cycles")
    cfg = LoopConfig.from_toml(config)
    for _ in range(cycles):
        report = run_cycle(cfg, cycle_dir=cycle_dir, progress=not quiet)
        print(json.dumps(report.to_dict(), indent=1, default=str))


def register(app: typer.Typer) -> None:
    app.command("loop")(loop)
