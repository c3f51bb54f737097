"""`etude sft --config FILE [--out DIR] [--set key=value ...]` (typer at top level only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from etude.train.overrides import parse_set
from etude.train.sft import load_sft_config, run_sft


def register_sft(app: typer.Typer) -> None:
    @app.command("sft")
    def sft_cmd(
        config: Annotated[Path, typer.Option("--config", help="TOML SFT config (see configs/agent_sft.toml).")],
        out: Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/<config name>).")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set epochs=2 --set sources.self=0.5")] = None,
        allow_test_split: Annotated[bool, typer.Option("--allow-test-split", help="Train on sealed test-split packages anyway; the run is marked contaminated.")] = False,
    ) -> None:
        """Supervised warm start on agent trajectories (expert, own successes, production); resumes from OUT."""
        overrides = parse_set(set_ or [])
        if allow_test_split:
            overrides["allow_test_split"] = True
        cfg = load_sft_config(config, overrides)
        res = run_sft(cfg, out or Path("runs") / config.stem)
        keys = ("out", "final", "steps", "sequences", "trajectories", "resumed_from_step", "adapter", "contamination")
        print(json.dumps({k: res[k] for k in keys if k in res}))
