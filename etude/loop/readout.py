"""The live A/B readout of one organisation's experiment, assembled as the loop's canary stage
assembles it (`etude.loop.metrics` rows → `etude.experiments.analyze`, the plan of the
`[canary]` section, the hack alarms), for the server's `/dashboard`.

```python
app = create_app(cfg, store, pool, readout=dashboard_readout(LoopConfig.from_toml("loop.toml")))
```

It lives here, not in `etude.serve`, because `etude.loop` imports `etude.serve` (see
tests/test_layers.py): the dashboard is handed this function. Not guaranteed: that it matches a
cycle's own readout figure for figure when the config differs from the one the cycle ran with
(alpha, weights, mde and guardrails come from `cfg`); experiments whose arms are not the loop's
`control` and `canary` get no `ab` (their rows are not mapped onto analyze's arms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from etude.experiments import ABConfig, Guardrail, analyze
from etude.experiments.aa import rerandomised
from etude.loop.config import LoopConfig
from etude.loop.decision import decide
from etude.loop.metrics import ab_rows, alarms, arm_ratios, interaction_facts, ratios_from_rows


def ab_config(cfg: LoopConfig, canary: Any = None) -> ABConfig:
    """The readout's settings: of `canary` (a cycle's registered plan, etude.loop.plan) or the config's."""
    c = canary or cfg.canary
    return ABConfig(alpha=c.alpha, weights=c.weights, mde=c.mde, power=c.power, guardrail_rule=c.guardrail_rule,
                    min_look_users=c.min_look_users,
                    guardrails=tuple(Guardrail(g.metric, g.higher_is_better, g.margin) for g in c.guardrails))


def loop_rule(cfg: LoopConfig) -> Callable[[dict[str, Any]], tuple[str | None, str]]:
    """The loop's decision on a readout {"ab", "rows"}: its hack alarms computed from the rows
    (`ratios_from_rows`), then `decide` with the config's canary."""
    return lambda rd: decide({**rd, "alarms": alarms(ratios_from_rows(rd["rows"]), cfg.alarms, rd["ab"],
                                                     cfg.canary.alpha)}, cfg.canary)


def aa_rates(rows: list[dict[str, Any]], cfg: LoopConfig, splits: int = 200, seed: int = 0) -> dict[str, Any]:
    """The loop's readout and decision rule (guardrails, hack alarms, primary) over `splits` A/A
    re-deals of one model's per-user rows (etude.experiments.aa.rerandomised): false promotion,
    guardrail rollback and alarm rollback rates, each with its exact interval."""
    return rerandomised(rows, loop_rule(cfg), ab_config(cfg), splits, seed)


def live_readout(store: Any, org: str, experiment_id: str, cfg: LoopConfig | None = None) -> dict[str, Any]:
    """{"ab": analyze's readout or None, "plan": the planned users per arm or None, "primary",
    "arm_ratios", "alarms"} of `org`'s traffic in the experiment."""
    cfg = cfg or LoopConfig()
    facts = interaction_facts(store, org, experiment_id)
    rows = ab_rows(facts)
    ab = analyze(rows, ab_config(cfg)) if {r["arm"] for r in rows} == {"control", "treatment"} else None
    plan = cfg.canary.plan()
    ratios = arm_ratios(facts)
    return {"ab": ab, "plan": plan.to_dict() if plan is not None else None, "primary": cfg.canary.primary,
            "arm_ratios": ratios, "alarms": alarms(ratios, cfg.alarms, ab, cfg.canary.alpha)}


def dashboard_readout(cfg: LoopConfig | None = None) -> Callable[[Any, str, Any], dict[str, Any]]:
    """The `ReadoutFn` for `etude.serve.app.create_app(readout=...)` (or `app.state.readout`)."""
    return lambda store, org, exp: live_readout(store, org, exp.id, cfg)
