"""`etude specialise`: logic lives in etude.pipeline.specialise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError


def register(app: typer.Typer) -> None:
    @app.command("specialise")
    def specialise_cmd(
        org: Annotated[str, typer.Option("--org", help="the organisation (a slug)")],
        repos: Annotated[str, typer.Option("--repos", help="its repositories: NAME==VERSION (PyPI) or a local git repository, comma-separated")],
        out: Annotated[Path, typer.Option("--out", help="run directory: tasks, split.json, adapter/, report.json, report.html")],
        base: Annotated[str | None, typer.Option("--base", help="model to specialise (default: the org's production checkpoint, else smollm2)")] = None,
        minutes: Annotated[float, typer.Option("--minutes", help="training budget in wall minutes (SFT + RL)")] = 15.0,
        seed: Annotated[int, typer.Option("--seed", help="seed of the tasks and of the split")] = 0,
        register_: Annotated[bool, typer.Option("--register", help="register the adapter as the org's candidate")] = False,
        backend: Annotated[str, typer.Option("--backend", help="episodes on hf, vllm or auto")] = "auto",
        verify_edits: Annotated[int, typer.Option("--verify-edits", help="evaluations: attempts per edit turn checked against the files of the request's failing tests, for base and adapter alike (0: one greedy attempt); chosen on the select slice")] = 8,
    ) -> None:
        """Specialise the agent to an organisation's repositories: a LoRA adapter, measured on held-out functions."""
        from etude.pipeline.specialise import SpecialiseConfig, run_specialise

        if minutes <= 0:
            raise EtudeError("--minutes must be positive")
        if verify_edits < 0:
            raise EtudeError("--verify-edits must be 0 or more")
        cfg = SpecialiseConfig(org=org, repos=tuple(repos.split(",")), out=str(out), base=base, minutes=minutes,
                               seed=seed, register=register_, backend=backend,
                               verify_edits=verify_edits or None)
        rep = run_specialise(cfg)
        print(json.dumps({k: rep.get(k) for k in ("org", "adapter", "split", "registered")} |
                         {"heldout": {k: rep["heldout"][k] for k in ("tasks", "gain_points", "mcnemar_p")},
                          "no_regression": rep["general"]["no_regression"], "report": str(out / "report.html")},
                         default=str))
