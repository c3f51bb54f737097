"""`etude demo`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from etude.configfile import given_flags
from etude.demo.config import QUICK, DemoConfig, load_demo_config


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        ctx: typer.Context,
        quick: bool = typer.Option(False, "--quick", help="tiny random model, smallest slices (~5 minutes on 2 cores)"),
        config: Path = typer.Option(None, "--config", help="TOML file of DemoConfig fields (docs/demo.md); the flags here override it, and with --quick it overrides the quick settings"),
        out: Path = typer.Option(Path("runs/demo"), "--out", help="output folder (report.html is written there)"),
        model: str = typer.Option(None, "--model", help="base model: smollm2 (default), tiny, or a model directory"),
        backend: str = typer.Option(None, "--backend", help="engine of the evaluations and RL rollouts: auto (vllm when installed, the default), hf or vllm"),
        record: bool = typer.Option(False, "--record", help="also write bench/results/demo.json (+ its per-task records), the figures docs/demo.md quotes"),
        full: bool = typer.Option(False, "--full", help="also the agent-level specialisation on the org's held-out functions (about 70 minutes on 2 cores); its adapter is then what the cycle canaries"),
    ) -> None:
        """The whole system on this machine: eval, sandbox RL, serving, scripted traffic, one real-time cycle, report."""
        base = replace(QUICK, out="runs/demo-quick") if quick else DemoConfig()
        over = given_flags(ctx, {"out": str(out), "model": model, "backend": backend, "record": record, "full": full})
        cfg = load_demo_config(config, base, over) if config is not None else replace(base, **over)
        # NOTE: lazy on purpose: etude.demo.run imports train, evals and loop (torch, scipy, libcst);
        # `etude demo --help` must not load them, and a bad config file is one line at once.
        from etude.demo.run import run_demo

        run_demo(cfg)
