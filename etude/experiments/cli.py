"""`etude ab analyze`."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    ab = typer.Typer(help="A/B experiment readout.", no_args_is_help=True)

    @ab.command("analyze")
    def analyze_cmd(
        events: Path = typer.Option(..., "--events", help="CSV or JSONL rows: user_id, arm, metric, numerator, denominator [, pre_numerator, pre_denominator, ts]"),
        out: Path = typer.Option(..., "--out", help="where to write the JSON readout"),
        alpha: float = typer.Option(0.05, help="two-sided significance level"),
        weights: str = typer.Option("0.5,0.5", help="expected share of users in control,treatment (for the SRM check)"),
        guardrail: list[str] = typer.Option([], help="METRIC:higher|lower:MARGIN, e.g. latency_p95:lower:0.05 (repeatable)"),
    ) -> None:
        """Analyse an experiment's events and write per-metric results plus the SRM check."""
        from etude.errors import EtudeError
        from etude.experiments.analysis import ABConfig, Guardrail, analyze, load_events

        try:
            w = tuple(float(x) for x in weights.split(","))
        except ValueError:
            raise EtudeError(f"--weights must be two numbers like 0.9,0.1, got {weights!r}") from None
        if len(w) != 2 or min(w) <= 0:
            raise EtudeError(f"--weights must be two positive numbers, got {weights!r}")
        guards = []
        for g in guardrail:
            parts = g.split(":")
            if len(parts) != 3 or parts[1] not in ("higher", "lower"):
                raise EtudeError(f"--guardrail must look like METRIC:higher|lower:MARGIN, got {g!r}")
            guards.append(Guardrail(parts[0], parts[1] == "higher", float(parts[2])))
        res = analyze(load_events(events), ABConfig(alpha=alpha, weights=w, guardrails=tuple(guards)))
        out.parent.mkdir(parents=True, exist_ok=True)
        flat = {"srm_p": res["srm_p"], **res}
        out.write_text(json.dumps(flat, indent=2))
        for m, r in res["metrics"].items():
            if r.get("delta") is None:
                typer.echo(f"{m}: {r.get('note')}")
                continue
            typer.echo(f"{m}: control {r['control']:.4g}  treatment {r['treatment']:.4g}  lift {r['delta']:+.2%} "
                       f"[{r['ci_low']:+.2%}, {r['ci_high']:+.2%}]  p={r['p_value']:.3g}  msprt_p={r['msprt_p']:.3g}")
        typer.echo(f"SRM p={res['srm_p']:.3g}  -> {out}")

    app.add_typer(ab, name="ab")
