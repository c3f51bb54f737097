"""`etude loop --config FILE`: run (or resume) real-time RL cycles; `etude distill`: one org's
interactions + feedback -> scored samples. Logic lives in etude.loop."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError
from etude.loop import LoopConfig, run_cycle
from etude.loop.distill import DistillConfig
from etude.loop.distill import distill as run_distill
from etude.store import open_store


def loop(
    config: Annotated[Path, typer.Option("--config", help="loop TOML (see configs/loop_tiny.toml, docs/loop.md)")],
    cycles: Annotated[int, typer.Option("--cycles", help="cycles to run one after another")] = 1,
    cycle_dir: Annotated[Path | None, typer.Option("--cycle-dir", help="run/resume this cycle directory")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress output")] = False,
    org: Annotated[str | None, typer.Option("--org", help="specialise for this organisation: a LoRA adapter from its "
                                            "interactions only, gated on its held-out tasks, canaried to its users")] = None,
    allow_test_split: Annotated[bool, typer.Option("--allow-test-split", help="let users or the gate draw on sealed "
                                                   "test-split packages; the cycle is marked contaminated")] = False,
    candidate: Annotated[Path | None, typer.Option("--candidate", help="canary this model directory (trained "
                                                   "elsewhere) instead of training one from the cycle's traffic")] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="engine of the loop's server: hf or vllm (overrides "
                                                "\\[server] backend; vllm needs `make setup-vllm`)")] = None,
) -> None:
    """Run one real-time RL cycle (resuming an unfinished one) and print its report as JSON."""
    if cycles < 1:
        raise EtudeError("--cycles must be at least 1")
    if cycle_dir is not None and cycles != 1:
        raise EtudeError("--cycle-dir runs exactly one cycle; drop --cycles")
    cfg = LoopConfig.from_toml(config)
    if org is not None:
        cfg = cfg.for_org(org)
    if allow_test_split:
        cfg = dataclasses.replace(cfg, allow_test_split=True)
    if candidate is not None:
        if not candidate.is_dir():
            raise EtudeError(f"--candidate {candidate}: not a model directory")
        cfg = dataclasses.replace(cfg, candidate=str(candidate.resolve()))
    if backend is not None:
        cfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, backend=backend))
    for _ in range(cycles):
        report = run_cycle(cfg, cycle_dir=cycle_dir, progress=not quiet)
        print(json.dumps(report.to_dict(), indent=1, default=str))


def distill(
    org: Annotated[str, typer.Option("--org")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file of scored samples")],
    since: Annotated[float | None, typer.Option("--since", help="epoch seconds")] = None,
    until: Annotated[float | None, typer.Option("--until", help="epoch seconds")] = None,
    max_staleness: Annotated[int, typer.Option("--max-staleness", help="policy versions behind production allowed")] = 2,
    db: Annotated[str | None, typer.Option("--db", help="store URL (default $ETUDE_DB, then sqlite:///~/.etude/etude.db)")] = None,
) -> None:
    """Interactions + feedback of ORG -> scored samples (token ids, behaviour log-probs, rewards)."""
    res = run_distill(open_store(db), org, (since, until), DistillConfig(max_staleness=max_staleness))
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        for s in res:
            fh.write(json.dumps(s.to_dict()) + "\n")
    print(json.dumps(res.summary(), indent=2, default=str))


def register(app: typer.Typer) -> None:
    app.command("loop")(loop)
    app.command("distill")(distill)
