"""`etude eval --suite FILE --model M --out DIR`, `etude eval compare A B`, `etude eval report DIR`.

The etude imports sit at the top: importing `etude.evals.cli` imports the `etude.evals` package
first anyway, so deferring them would not make `etude eval --help` faster.

The run prints its summary as JSON on stdout (progress on stderr). `compare` prints the verdict as
JSON and exits 1 when the gate fails, so a script can use it as a gate directly.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import typer

from etude.configfile import given_flags, load_with
from etude.errors import EtudeError
from etude.evals import EvalConfig, run_eval
from etude.evals.compare import CompareConfig, _default_margins, compare
from etude.evals.report import write_report
from etude.harness import HarnessConfig
from etude.tasks import seal

eval_app = typer.Typer(help="Evaluate a model on a suite (correctness, adherence, efficiency) and compare runs.",
                       invoke_without_command=True, no_args_is_help=False)  # fmt: skip


@eval_app.callback()
def eval_cmd(
    ctx: typer.Context,
    suite: Annotated[str | None, typer.Option("--suite", help="Task file (JSONL/parquet), builtin:eval, builtin:curriculum:SPLIT[:LEVEL], or builtin:history[:before=YYYY-MM-DD][:after=YYYY-MM-DD].")] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="oracle | noop | scripted:FILE | URL\\[#NAME] | model name or path.")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder (an existing run there is resumed).")] = None,
    workers: Annotated[int, typer.Option(help="Episodes at once.")] = 2,
    executor: Annotated[str, typer.Option("--executor", help="ray (each episode a Ray task, the model in one actor) or threads (in this process).")] = "ray",
    ray_address: Annotated[str | None, typer.Option("--ray-address", help="Ray cluster HOST:PORT (`ray start --head`); default: a local Ray for this run.")] = None,
    samples: Annotated[int, typer.Option(help="Episodes per task (pass@k for k up to this).")] = 1,
    max_tasks: Annotated[int | None, typer.Option(help="Only the first N tasks.")] = None,
    max_steps: Annotated[int, typer.Option(help="Turns per episode.")] = 30,
    model_name: Annotated[str | None, typer.Option(help="Served model name for a URL model.")] = None,
    backend: Annotated[str, typer.Option("--backend", help="Engine of a local model: hf or vllm (`make setup-vllm`).")] = "hf",
    report: Annotated[bool, typer.Option(help="Write report.html.")] = True,
    agent_config: Annotated[Path | None, typer.Option("--agent-config", help="A TOML whose \\[harness] table sets the agent (e.g. configs/agent_sft.toml): evaluate with the harness a model was trained with.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="A TOML of EvalConfig fields (\\[harness] and \\[reward] tables for theirs; docs/evals.md); the flags given here override it.")] = None,
) -> None:
    """Run a model on a suite in sandboxes; write results.jsonl, summary.json and report.html."""
    if ctx.invoked_subcommand is not None:
        return
    missing = [n for n, v in (("--suite", suite), ("--model", model), ("--out", out)) if not v]
    if missing:
        raise EtudeError(f"etude eval needs {', '.join(missing)} (or a subcommand: compare, report)")
    flags = {"workers": workers, "executor": executor, "ray_address": ray_address, "samples": samples,
             "max_tasks": max_tasks, "max_steps": max_steps, "model_name": model_name, "backend": backend,
             "report": report}
    cfg = EvalConfig.from_toml(config, given_flags(ctx, flags)) if config is not None else EvalConfig(**flags)
    if agent_config is not None:
        harness = load_with(lambda d: HarnessConfig.from_table(d.get("harness", {})), agent_config, "agent config")
        cfg = dataclasses.replace(cfg, harness=harness)
    if cfg.ray_address and cfg.executor != "ray":
        raise EtudeError("--ray-address needs --executor ray")
    # `etude eval` is a reading: of the sealed test split only for a final figure, which run.json
    # records (`sealed_read`) so that a gate over it is refused (`etude eval compare`)
    print(json.dumps(run_eval(suite, model, out, cfg, use="final"), indent=2))  # type: ignore[arg-type]


def _margins(items: list[str] | None) -> dict[str, float] | None:
    if not items:
        return None
    margins = _default_margins()
    for item in items:
        name, _, value = item.partition("=")
        if value.strip().lower() in ("off", "none"):
            margins.pop(name, None)  # METRIC=off: reported, not gated
            continue
        try:
            margins[name] = float(value)
        except ValueError:
            raise EtudeError(f"--margin wants METRIC=NUMBER or METRIC=off, got {item!r}") from None
    return margins


@eval_app.command("compare", no_args_is_help=True)
def compare_cmd(
    run_a: Annotated[Path, typer.Argument(help="Baseline run folder.")],
    run_b: Annotated[Path, typer.Argument(help="Candidate run folder.")],
    out: Annotated[Path | None, typer.Option("--out", help="Also write the verdict to this JSON file.")] = None,
    margin: Annotated[list[str] | None, typer.Option(help="METRIC=TOLERANCE (or METRIC=off); repeatable.")] = None,
    rule: Annotated[str, typer.Option(help="ci (interval must be worse than 0) or point.")] = "ci",
    final: Annotated[bool, typer.Option("--final", help="A final figure, not a gate: runs on the sealed test split are read (once) instead of refused.")] = False,
    allow_test_split: Annotated[bool, typer.Option("--allow-test-split", help="Gate on sealed test-split runs anyway; the verdict is marked contaminated.")] = False,
) -> None:
    """Compare two runs on the same suite (B - A per metric); exit 1 if a gated metric regressed."""
    m = _margins(margin)
    cfg = CompareConfig(rule=rule) if m is None else CompareConfig(margins=m, rule=rule)
    if allow_test_split and not final:
        seal.grant("etude eval compare")
    verdict = compare(run_a, run_b, cfg, use="final" if final else "gate")
    text = json.dumps(verdict, indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)
    if not verdict["gate_passed"]:
        raise typer.Exit(1)


@eval_app.command("report", no_args_is_help=True)
def report_cmd(run_dir: Annotated[Path, typer.Argument(help="Run folder.")]) -> None:
    """Rebuild report.html of a run folder."""
    print(write_report(run_dir))


def register(app: typer.Typer) -> None:
    app.add_typer(eval_app, name="eval")
