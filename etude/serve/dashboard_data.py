"""What `/dashboard` shows, read from the store: per scope (an organisation, or None for the
shared checkpoints) the production checkpoint, the candidates, the active experiment's arms
with their traffic split and the users and interactions each arm has logged, the live readout,
the cycle history (every registry transition with its reason) and the hack alarms.

The readout (intervals, planned sample size, alarms) is not computed here: the metric
definitions live in `etude.loop.metrics`, which imports `etude.serve` (tests/test_layers.py
forbids the way back). So `etude serve` (no flag needed) shows the readout the loop *recorded* in
the store (`registry.record_readout`: when the canary starts — the plan — and after each round,
with the round's interim decision), marked with its round and time; the arms table beside it
counts users and interactions live. A server handed a `ReadoutFn` (`create_app(readout=...)` or
`app.state.readout`, e.g. `etude.loop.readout.dashboard_readout(loop_config)`) recomputes the
readout on every page load instead. With neither (an experiment set by hand), the page shows
what the store alone says: users and interactions per arm, and the SRM p-value
(`etude.experiments.analysis.srm_p`) when the arms are the loop's `control` and `canary`.

Not guaranteed: a consistent snapshot (each part is its own read; a promotion between two reads
can show in one part and not yet in the other); speed on large experiments (the readout is
recomputed on every page load); a readout for experiments whose arms are not control/canary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from etude.experiments.analysis import srm_p
from etude.serve import registry
from etude.store import schema as t
from etude.store.sql import SQLStore

ReadoutFn = Callable[[SQLStore, str, registry.Experiment], dict[str, Any] | None]
DECISIONS = {"production": "promote", "retired": "retire", "canary": "canary", "candidate": "register"}
HISTORY_ROWS = 50


def visible_scopes(store: SQLStore, org: str, admin: bool) -> list[str | None]:
    """The scopes a key may see: its own org, or (admin) every org and the shared scope."""
    return [*store.list_orgs(), None] if admin else [org]


def scope_view(store: SQLStore, org: str | None, readout: ReadoutFn | None) -> dict[str, Any]:
    exp = registry.active_experiment(store, org)
    if org is None and exp is not None and exp.org_id is not None:
        exp = None
    own = registry.list_checkpoints(store, org, include_retired=False, shared=False)
    return {
        "org": org,
        "production": registry.production(store, org),
        "candidates": [c for c in own if c.state in ("candidate", "canary")],
        "experiment": exp,
        "arms": arms_view(store, org, exp),
        "readout": readout_view(store, org, exp, readout),
        "history": history(store, org),
    }


def arms_view(store: SQLStore, org: str | None, exp: registry.Experiment | None) -> list[dict[str, Any]]:
    if exp is None:
        return []
    total = sum(a.weight for a in exp.arms) or 1.0
    counts = arm_counts(store, org, exp.id) if org is not None else {}
    return [{"name": a.name, "checkpoint": a.checkpoint, "weight": a.weight, "share": a.weight / total,
             **counts.get(a.name, {"users": 0, "interactions": 0})} for a in exp.arms]


def arm_counts(store: SQLStore, org: str, exp_id: str) -> dict[str, dict[str, int]]:
    """Distinct users and interactions per arm of one org's traffic in an experiment."""
    c = t.interactions.c
    user = sa.func.coalesce(sa.func.nullif(c.user_id, ""), c.session_id)
    q = (sa.select(c.arm, sa.func.count(sa.distinct(user)), sa.func.count())
         .where(c.org_id == org, c.experiment_id == exp_id).group_by(c.arm))
    with store.read() as conn:
        return {r[0]: {"users": int(r[1]), "interactions": int(r[2])} for r in conn.execute(q) if r[0] is not None}


def readout_view(store: SQLStore, org: str | None, exp: registry.Experiment | None,
                 readout: ReadoutFn | None) -> dict[str, Any] | None:
    if exp is None or org is None:
        return None
    if readout is None:
        stored = registry.latest_readout(store, exp.id)
        if stored is not None:
            return {**stored["readout"], "recorded_at": stored["at"]}
        return {"unavailable": "no readout recorded for this experiment (the loop records one when its canary starts "
                               "and after each round; see docs/serve.md)",
                "srm_p": store_srm(arms_view(store, org, exp))}
    try:
        return readout(store, org, exp) or {"unavailable": "no readout yet (both arms need traffic)"}
    except Exception as e:  # the rest of the page must still render
        return {"error": f"{type(e).__name__}: {e}"}


def store_srm(arms: list[dict[str, Any]]) -> float | None:
    """SRM p-value of the users per arm against the weights, for the loop's control/canary arms."""
    by = {a["name"]: a for a in arms}
    if set(by) != {"control", "canary"} or by["control"]["users"] + by["canary"]["users"] == 0:
        return None
    users = {"control": by["control"]["users"], "treatment": by["canary"]["users"]}
    return srm_p(users, (by["control"]["weight"], by["canary"]["weight"]))


def history(store: SQLStore, org: str | None, limit: int = HISTORY_ROWS) -> list[dict[str, Any]]:
    """The scope's registry transitions, newest first: when, checkpoint, decision, reason."""
    e, c = t.checkpoint_events.c, t.checkpoints.c
    scope = c.org_id.is_(None) if org is None else c.org_id == org
    q = (sa.select(e.at, e.checkpoint, e.from_state, e.to_state, e.reason)
         .join_from(t.checkpoint_events, t.checkpoints, e.checkpoint == c.name)
         .where(scope).order_by(e.id.desc()).limit(limit))
    with store.read() as conn:
        return [{**r._mapping, "decision": DECISIONS.get(r.to_state, r.to_state)} for r in conn.execute(q)]
