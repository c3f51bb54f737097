"""`etude train --config FILE [--out DIR] [--set key=value ...]`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError


def _parse_set(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise EtudeError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw  # a bare string
    return out


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        config: Annotated[Path, typer.Option("--config", help="TOML training config (see configs/tiny.toml).")],
        out: Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/<config name>).")] = None,
        set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set steps=3 --set loss.kl_coef=0.1")] = None,
        fresh: Annotated[bool, typer.Option("--fresh", help="Start over: delete --out's checkpoints (default: resume).")] = False,
        backend: Annotated[str | None, typer.Option("--backend", help="Rollout engine: hf or vllm (sets rollout_backend; vllm needs `make setup-vllm`).")] = None,
    ) -> None:
        """Train a policy with RL (GRPO/PPO, importance-corrected); resumes from OUT's latest checkpoint."""
        from etude.train import load_config, train

        overrides = _parse_set(set_ or [])
        if backend is not None:
            overrides["rollout_backend"] = backend
        cfg = load_config(config, overrides)
        run_dir = out or Path("runs") / config.stem
        res = train(cfg, run_dir, resume=not fresh)
        last = res["last"] or {}
        evals = res["evals"]
        print(json.dumps({
            "out": str(run_dir), "steps": res["steps"], "checkpoint": res["checkpoint"],
            "resumed_from": res["resumed_from"], "reward": last.get("reward"),
            "eval_resolved": [e["eval/resolved"] for e in evals],
        }))
