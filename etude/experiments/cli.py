"""`etude ab analyze`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from etude.errors import EtudeError
from etude.experiments.analysis import ABConfig, Guardrail, analyze, load_events
from etude.experiments.power import estimate_user_cv, plan


def register(app: typer.Typer) -> None:
    ab = typer.Typer(help="A/B experiment readout.", no_args_is_help=True)

    @ab.command("analyze")
    def analyze_cmd(
        events: Path = typer.Option(..., "--events", help="CSV or JSONL rows: user_id, arm, metric, numerator, denominator [, pre_numerator, pre_denominator, ts]"),
        out: Path = typer.Option(..., "--out", help="where to write the JSON readout"),
        alpha: float = typer.Option(0.05, help="two-sided significance level"),
        weights: str = typer.Option("0.5,0.5", help="expected share of users in control,treatment (for the SRM check)"),
        guardrail: list[str] = typer.Option([], help="METRIC:higher|lower:MARGIN, e.g. latency_p95:lower:0.05 (repeatable)"),
        mde: float = typer.Option(None, help="relative minimum detectable effect the experiment was planned for; "
                                             "tunes the mSPRT's mixture variance (see `etude ab plan`)"),
        power: float = typer.Option(0.8, help="power the experiment was planned for (with --mde)"),
        tau_rel: float = typer.Option(None, help="mSPRT mixture sd / control ratio, overriding --mde's tuning"),
        looks: int = typer.Option(20, help="interim looks (in ts or file order) the mSPRT running minimum is taken over"),
    ) -> None:
        """Analyse an experiment's events and write per-metric results plus the SRM check."""
        w = _weights(weights)
        guards = []
        for g in guardrail:
            parts = g.split(":")
            if len(parts) != 3 or parts[1] not in ("higher", "lower"):
                raise EtudeError(f"--guardrail must look like METRIC:higher|lower:MARGIN, got {g!r}")
            guards.append(Guardrail(parts[0], parts[1] == "higher", float(parts[2])))
        cfg = ABConfig(alpha=alpha, weights=w, guardrails=tuple(guards), mde=mde, power=power, tau_rel=tau_rel,
                       looks=looks)
        res = analyze(load_events(events), cfg)
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

    @ab.command("plan")
    def plan_cmd(
        mde: float = typer.Option(..., help="relative minimum detectable effect, e.g. 0.06 for a 6% lift"),
        user_cv: float = typer.Option(None, "--user-cv", help="per-user coefficient of variation of the metric"),
        events: Path = typer.Option(None, "--events", help="pre-period rows to measure --user-cv from (CSV/JSONL)"),
        metric: str = typer.Option(None, help="with --events: the metric to plan for"),
        alpha: float = typer.Option(0.05, help="two-sided significance level"),
        power: float = typer.Option(0.8, help="fixed-horizon power at the MDE"),
        weights: str = typer.Option("0.5,0.5", help="share of users in control,treatment"),
    ) -> None:
        """Users per arm for a minimum detectable effect, and the mSPRT tau tuned for it (JSON on stdout)."""
        if (user_cv is None) == (events is None):
            raise EtudeError("etude ab plan needs exactly one of --user-cv or --events (with --metric)")
        if events is not None:
            if not metric:
                raise EtudeError("--events needs --metric")
            user_cv = estimate_user_cv(load_events(events), metric)
        typer.echo(json.dumps(plan(mde, user_cv, alpha=alpha, power=power, weights=_weights(weights)).to_dict(),
                              indent=2))

    app.add_typer(ab, name="ab")


def _weights(text: str) -> tuple[float, float]:
    try:
        w = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise EtudeError(f"--weights must be two numbers like 0.9,0.1, got {text!r}") from None
    if len(w) != 2 or min(w) <= 0:
        raise EtudeError(f"--weights must be two positive numbers, got {text!r}")
    return w  # type: ignore[return-value]
