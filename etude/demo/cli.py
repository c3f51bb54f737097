"""`etude demo`."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("demo")
    def demo(
        quick: bool = typer.Option(False, "--quick", help="tiny random model, smallest slices (~5 minutes on 2 cores)"),
        out: Path = typer.Option(Path("runs/demo"), "--out", help="output folder (report.html is written there)"),
        model: str = typer.Option(None, "--model", help="base model: smollm2 (default), tiny, or a model directory"),
        backend: str = typer.Option(None, "--backend", help="engine of the evaluations and RL rollouts: auto (vllm when installed, the default), hf or vllm"),
        record: bool = typer.Option(False, "--record", help="also write bench/results/demo.json (+ its per-task records), the figures docs/demo.md quotes"),
    ) -> None:
        """The whole system on this machine: eval, sandbox RL, serving, scripted traffic, one real-time cycle, report."""
        from dataclasses import replace

        # NOTE: lazy on purpose: etude.demo.run imports train, evals and loop (torch, scipy, libcst);
        # `etude demo --help` must not load them.
        from etude.demo.run import QUICK, DemoConfig, run_demo

        cfg = QUICK if quick else DemoConfig()
        cfg = replace(cfg, out=str(out if out != Path("runs/demo") or not quick else Path("runs/demo-quick")))
        if model:
            cfg = replace(cfg, model=model)
        if backend:
            cfg = replace(cfg, backend=backend)
        if record:
            cfg = replace(cfg, record=True)
        run_demo(cfg)
