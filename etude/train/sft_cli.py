"""`etude sft --config FILE [--out DIR] [--set key=value ...]` (typer at top level only)."""

from __future__ import annotations

import json

import typer

from etude.train.overrides import ConfigOpt, OutOpt, SetOpt, TestSplitOpt, run_dir, run_overrides
from etude.train.sft import load_sft_config, run_sft


def register_sft(app: typer.Typer) -> None:
    @app.command("sft")
    def sft_cmd(
        config: ConfigOpt("SFT", "configs/agent_sft.toml"),
        out: OutOpt = None,
        set_: SetOpt("--set epochs=2 --set sources.self=0.5") = None,
        allow_test_split: TestSplitOpt("Train") = False,
    ) -> None:
        """Supervised warm start on agent trajectories (expert, own successes, production); resumes from OUT."""
        cfg = load_sft_config(config, run_overrides(set_, allow_test_split))
        res = run_sft(cfg, run_dir(out, config))
        keys = ("out", "final", "steps", "sequences", "trajectories", "resumed_from_step", "adapter", "contamination")
        print(json.dumps({k: res[k] for k in keys if k in res}))
