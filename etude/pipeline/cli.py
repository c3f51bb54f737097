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
        minutes: Annotated[float | None, typer.Option("--minutes", help="training budget in wall minutes (SFT + RL; with --until, LoRA on the cut-off's text); default 15, with --until 8")] = None,
        seed: Annotated[int, typer.Option("--seed", help="seed of the tasks and of the split")] = 0,
        register_: Annotated[bool, typer.Option("--register", help="register the adapter as the org's candidate")] = False,
        backend: Annotated[str, typer.Option("--backend", help="episodes on hf, vllm or auto")] = "auto",
        verify_edits: Annotated[int, typer.Option("--verify-edits", help="evaluations: attempts per edit turn checked against the files of the request's failing tests, for base and adapter alike (0: one greedy attempt); chosen on the select slice")] = 8,
        until: Annotated[str | None, typer.Option("--until", help="split by time: train on each repository as of this revision or date (YYYY-MM-DD), measure on the lines its commits added after (comma-separated: one per repository); --repos then takes local git repositories or builtin:history names")] = None,
        regress: Annotated[str | None, typer.Option("--regress", help="with --until: other repositories whose post-cut-off lines must not get worse")] = None,
        regress_until: Annotated[str | None, typer.Option("--regress-until", help="with --until: their cut-offs (default: --until's first)")] = None,
        items: Annotated[int, typer.Option("--items", help="with --until: held-out lines per repository")] = 320,
    ) -> None:
        """Specialise the agent to an organisation's repositories: a LoRA adapter, measured on held-out functions (or, with --until, on the code written after a cut-off)."""
        from etude.pipeline.specialise import SpecialiseConfig, check_base, check_org, run_specialise

        if until is not None:
            from etude.pipeline.specialise_time import TimeSpecialiseConfig, run_time_specialise

            def split(x: str | None) -> tuple[str, ...]:
                return tuple(v.strip() for v in (x or "").split(",") if v.strip())

            if minutes is not None and minutes <= 0:
                raise EtudeError("--minutes must be positive")
            if items < 20:
                raise EtudeError("--items must be at least 20")
            tcfg = TimeSpecialiseConfig(org=check_org(org), repos=split(repos), until=split(until), out=str(out),
                                        base=check_base(base, check_org(org)), minutes=minutes or TimeSpecialiseConfig.minutes, seed=seed,
                                        regress=split(regress), regress_until=split(regress_until), items=items,
                                        register=register_)
            rep = run_time_specialise(tcfg)
            print(json.dumps({"org": org, "adapter": rep["adapter"], "targets": rep["targets"],
                              "registered": rep.get("registered"), "report": str(out / "report.json")}, default=str))
            return
        minutes = SpecialiseConfig.minutes if minutes is None else minutes
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
