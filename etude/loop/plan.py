"""The canary's plan, settled once when a cycle starts: the effect it must find, the users per arm
that takes, and whether the window reaches them — else, one line and a gate-only decision.

The effect: `[canary] mde`, or (`mde_from`) what the offline check measured. A specialise run's
held-out resolved rates, base r0 → adapter r1, become the user model's expected signals
(`UserModel.expected`: keep rate r·p_keep_good + (1 − r)·p_keep_bad, and the dissatisfied rate),
and the primary metric's relative lift between the two is the mde. With the defaults, 18/60 →
27/60 held out is a keep rate 0.485 → 0.553, an mde of +13.9% on accept_rate. No gain (or a
loss) leaves nothing to plan for: the plan cannot be reached at any size.

Then `etude.experiments.power.plan` gives the users per arm; `LoopConfig.plan_shortfall` compares
them with the window. Unreachable: `underpowered = "refuse"` raises (one line, before anything is
written); "gate-only" prints the line and the cycle decides on its eval gate alone.

Registered before traffic (`registered_plan`): before the canary's first user, the cycle writes
the plan it will decide on — primary metric and direction, guardrails with margins and the rule
that reads them, alpha, the mde and where it came from, the users per arm planned and reachable,
sessions per user, rounds — to the store (`etude.serve.registry.register_plan`) and to the cycle's
plan.json. The readout is then computed with exactly those settings (`canary_of`), and a changed
config on resume is refused by the store (a plan differing from the registered one).

Not guaranteed: that users react as `[users]` says — the conversion is the simulated users' model,
so for real users the mde is a planning assumption, not a measurement.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.experiments.power import estimate_user_cv, plan
from etude.loop.config import GuardrailSpec, LoopConfig
from etude.loop.metrics import ab_rows, interaction_facts
from etude.loop.readout import aa_rates
from etude.serve import registry

SIGNAL = {"accept_rate": "keep_rate", "dissatisfied_rate": "dissatisfied_rate"}  # primary -> UserModel.expected key


@dataclass(frozen=True)
class CanaryPlan:
    mode: str  # "ab": the readout decides | "gate-only": the eval gate alone (the plan cannot be reached)
    mde: float | None  # relative lift on the primary metric the plan is for
    source: str  # where the mde came from, in words
    users_per_arm: tuple[int, int] | None  # control, canary; None without a plan
    reach: tuple[float, float] | None  # users per arm the window reaches; None when unknown
    line: str  # why the plan cannot be reached ("" when it can); said in one line when the cycle starts
    user_cv: float | None = None  # the per-user noise the users per arm were planned for (None: no plan)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CanaryPlan:
        tup = lambda x: tuple(x) if x is not None else None  # noqa: E731
        return cls(d["mode"], d["mde"], d["source"], tup(d["users_per_arm"]), tup(d["reach"]), d["line"],
                   d.get("user_cv"))

    def apply(self, cfg: LoopConfig) -> LoopConfig:
        """`cfg` with the settled mde (so the readout's τ and plan use the measured effect)."""
        if self.mde is None or not cfg.canary.mde_from:
            return cfg
        canary = dataclasses.replace(cfg.canary, mde=self.mde, mde_from="")
        return dataclasses.replace(cfg, canary=canary)


# the [canary] fields the readout and the decision read: what a registered plan fixes
DECISION_FIELDS = ("primary", "primary_higher_is_better", "alpha", "harm_margin", "mde", "power", "weights",
                   "rounds", "min_rounds", "guardrail_rule", "min_look_users")
# fields added after plans were first registered: a plan registered without one decided with this
LATER_FIELDS = {"min_look_users": 0}


def registered_plan(cfg: LoopConfig, settled: dict[str, Any] | None, experiment: str) -> dict[str, Any]:
    """The plan a cycle registers before its canary's first user (see the module doc)."""
    c, s = cfg.canary, settled or {}
    return {
        "experiment": experiment, "org": cfg.org,
        **{k: (list(v) if isinstance(v := getattr(c, k), tuple) else v) for k in DECISION_FIELDS},
        "guardrails": [{"metric": g.metric, "higher_is_better": g.higher_is_better, "margin": g.margin}
                       for g in c.guardrails],
        "alarms": [{"metric": a.metric, "direction": a.direction, "threshold": a.threshold, "relative": a.relative}
                   for a in cfg.alarms.rules],
        "alarm_evidence": cfg.alarms.evidence,
        "mode": s.get("mode", "ab"), "mde_source": s.get("source", "[canary] mde"),
        "users_per_arm": list(s["users_per_arm"]) if s.get("users_per_arm") else None,
        "users_reach": list(s["reach"]) if s.get("reach") else None,
        "user_cv": s.get("user_cv") if s.get("user_cv") is not None else c.user_cv,
        "sessions_per_user": cfg.traffic.sessions_per_user if cfg.traffic.kind == "scripted" else None,
    }


def as_registered_before(plan: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    """`plan` spelled as `old`, a plan registered before some `LATER_FIELDS` existed, would spell
    it: a later field `old` lacks is dropped where `plan` gives it the default `old` decided with
    (the same decision, so a cycle registered by an older etude resumes), and kept where it differs
    (a real change, which registration refuses)."""
    if old is None:
        return plan
    return {k: v for k, v in plan.items() if not (k in LATER_FIELDS and k not in old and v == LATER_FIELDS[k])}


def canary_of(plan: dict[str, Any], cfg: LoopConfig) -> Any:
    """`cfg.canary` with the registered plan's decision fields: what the readout decides on."""
    fields = {k: (tuple(plan[k]) if k == "weights" else plan.get(k, LATER_FIELDS.get(k))) for k in DECISION_FIELDS}
    guards = tuple(GuardrailSpec(g["metric"], g["higher_is_better"], g["margin"]) for g in plan["guardrails"])
    # the noise the users per arm were planned for (a plan registered before user_cv was recorded: the config's)
    cv = plan.get("user_cv", cfg.canary.user_cv) if plan.get("mde") is not None else None
    return with_user_cv(cfg.canary, cv, **fields, guardrails=guards, mde_from="")


SPECIALISED_KINDS = ("specialised", "specialised-by-time")


def specialised_candidate(store: Any, org: str) -> Any:
    """The org's newest candidate registered by `etude specialise --register` that no cycle has
    decided on yet (state "candidate", meta kind "specialised", or "specialised-by-time" from
    `etude specialise --until`), or None."""
    cands = [c for c in registry.list_checkpoints(store, org, include_retired=False)
             if c.org_id == org and c.state == "candidate" and c.meta.get("kind") in SPECIALISED_KINDS]
    return max(cands, key=lambda c: c.created_at) if cands else None


def measured_gain(source: str, store: Any, org: str) -> tuple[dict[str, Any], str]:
    """(the held-out paired table, where it came from) for `mde_from`."""
    if source == "candidate":
        cp = specialised_candidate(store, org)
        if cp is None:
            raise EtudeError(f"[canary] mde_from = \"candidate\": organisation {org!r} has no specialised candidate "
                             f"(etude specialise --register) to take the effect from")
        held, where = cp.meta.get("heldout"), f"candidate {cp.name}"
    else:
        try:
            held, where = json.loads(Path(source).read_text()).get("heldout"), source
        except (OSError, ValueError) as e:
            raise EtudeError(f"[canary] mde_from: cannot read a specialise report at {source}: {e}") from None
    if not isinstance(held, dict) or not held.get("tasks"):
        raise EtudeError(f"[canary] mde_from: {where} records no held-out measurement")
    return held, where


def mde_from_gain(held: dict[str, Any], cfg: LoopConfig) -> float:
    """The primary metric's relative lift the user model expects from the held-out gain (<= 0: none)."""
    n = held["tasks"]
    r0, r1 = held["base"]["resolved"] / n, held["adapter"]["resolved"] / n
    key = SIGNAL[cfg.canary.primary]
    e0, e1 = cfg.users.expected(r0)[key], cfg.users.expected(r1)[key]
    if e0 <= 0:
        return 0.0
    lift = e1 / e0 - 1
    return lift if cfg.canary.primary_higher_is_better else -lift


def previous_effect(cfg: LoopConfig) -> tuple[float, float, str]:
    """(mde, user_cv, where) from the newest finished cycle under `cfg.root` whose canary was read:
    the primary metric's relative lift it measured (absolute value) and the per-user coefficient of
    variation of its rows (both arms pooled). EtudeError when no cycle has a readout yet."""
    for d in sorted(Path(cfg.root).glob("cycle-[0-9][0-9][0-9][0-9]"), reverse=True):
        rd, rows_path = d / "readout.json", d / "ab_rows.jsonl"
        if not (rd.is_file() and rows_path.is_file()):
            continue
        m = ((json.loads(rd.read_text()).get("ab") or {}).get("metrics") or {}).get(cfg.canary.primary) or {}
        if m.get("delta") is None:
            continue
        rows = [json.loads(ln) for ln in rows_path.read_text().splitlines() if ln.strip()]
        cv = cfg.canary.user_cv if cfg.canary.user_cv is not None else estimate_user_cv(rows, cfg.canary.primary)
        users = len({r["user_id"] for r in rows})
        return abs(float(m["delta"])), cv, (f"previous cycle {d.name}: {cfg.canary.primary} lift {m['delta']:+.1%} "
                                             f"over {users} users (user_cv {cv:.2f})")
    raise EtudeError(f"[canary] mde_from = \"previous\": no earlier cycle under {cfg.root} read a canary on "
                     f"{cfg.canary.primary}; set [canary] mde for the first cycle (or run a pilot cycle)")


def with_user_cv(c: Any, cv: float | None, **changes: Any) -> Any:
    """`[canary]` section `c` with the noise `cv` known: `user_cv` set and the collect-window
    settings that would measure it (`user_cv_from`, `aa_check_splits`) spent."""
    return dataclasses.replace(c, user_cv=cv, user_cv_from="", aa_check_splits=0, **changes)


def settle(cfg: LoopConfig, store: Any, measured_cv: float | None = None) -> CanaryPlan:
    """The cycle's plan (see the module doc); EtudeError when unreachable under "refuse".
    `measured_cv`: the per-user noise measured on this cycle's collect window (`collect_user_cv`),
    which replaces an assumed or earlier one."""
    c = cfg.canary
    mde, source = c.mde, "[canary] mde"
    if c.mde_from == "previous":
        mde, cv, source = previous_effect(cfg)
        if mde <= 0:
            line = f"the previous cycle measured no effect to plan for ({source})"
            return _unreachable(cfg, CanaryPlan("gate-only", None, source, None, cfg.canary_reach(), line))
        c = with_user_cv(c, cv if measured_cv is None else measured_cv, mde_from="", mde=mde)
        cfg = dataclasses.replace(cfg, canary=c)
    elif measured_cv is not None:
        c = with_user_cv(c, measured_cv)
        cfg = dataclasses.replace(cfg, canary=c)
    elif c.mde_from:
        held, where = measured_gain(c.mde_from, store, cfg.org)
        mde = mde_from_gain(held, cfg)
        source = (f"{where}: held out {held['base']['resolved']}/{held['tasks']} -> "
                  f"{held['adapter']['resolved']}/{held['tasks']} resolved")
    reach = cfg.canary_reach()
    if mde is not None and mde <= 0:
        line = (f"the offline check shows no gain to plan for ({source}, {c.primary} lift {mde:+.1%}): "
                f"no number of users can find it")
        return _unreachable(cfg, CanaryPlan("gate-only", None, source, None, reach, line))
    if mde is None or c.user_cv is None:
        return CanaryPlan("ab", mde, source, None, reach, "")
    p = plan(mde, c.user_cv, alpha=c.alpha, power=c.power, weights=c.weights)
    short = cfg.plan_shortfall(p)
    out = CanaryPlan("gate-only" if short else "ab", mde, source, p.users_per_arm, reach, short or "", c.user_cv)
    return _unreachable(cfg, out) if short else out


def window_rows(store: Any, cfg: LoopConfig, since: float, until: float) -> list[dict[str, Any]]:
    """Production's per-user A/B rows of the window [since, until), every user in one arm."""
    return ab_rows([{**f, "arm": "control"} for f in interaction_facts(store, cfg.org, None, since=since, until=until)])


def collect_user_cv(rows: list[dict[str, Any]], cfg: LoopConfig) -> tuple[float | None, int]:
    """(per-user coefficient of variation of the primary metric, users) on production's collect
    window's rows (`window_rows`, `estimate_user_cv`); None when fewer than two users have the
    metric or it has no variance."""
    users = len({r["user_id"] for r in rows if r["metric"] == cfg.canary.primary})
    try:
        return estimate_user_cv(rows, cfg.canary.primary), users
    except EtudeError:
        return None, users


def aa_check(cfg: LoopConfig, p: CanaryPlan, rows: list[dict[str, Any]], seed: int) -> tuple[CanaryPlan, dict[str, Any]]:
    """`[canary] aa_check_splits` A/A re-deals of the collect window's `rows` under plan `p`'s
    rule (etude.loop.readout.aa_rates): `p` unchanged when the readout holds its error rates there,
    else gate-only with the measured rate in its line (EtudeError under "refuse"); and the rates."""
    c = cfg.canary
    planned = dataclasses.replace(cfg, canary=with_user_cv(c, p.user_cv, mde=p.mde, mde_from=""))
    aa = aa_rates(rows, planned, splits=c.aa_check_splits, seed=seed)
    rates = {k: aa[k] for k in ("splits", "users", "false_promotion", "false_guardrail_rollback")}
    bad = [(what, aa[key]) for key, what in (("false_promotion", "promote"), ("false_guardrail_rollback",
                                                                                "roll back on a guardrail"))
           if aa[key]["ci95"][0] > c.alpha]
    if not bad:
        return p, rates
    what, r = bad[0]
    line = (f"A/A re-deals of the collect window's {aa['users']} users {what} {r['k']}/{r['n']} times "
            f"({r['rate']:.1%}, exact 95% interval [{r['ci95'][0]:.1%}, {r['ci95'][1]:.1%}]), above alpha "
            f"{c.alpha:g}: the readout is not valid at this size")
    return _unreachable(cfg, dataclasses.replace(p, mode="gate-only", line=line)), rates


def resettle(cfg: LoopConfig, store: Any, settled: CanaryPlan, cv: float, users: int) -> CanaryPlan:
    """The plan settled at the cycle's start (`settled`, on `cfg` as `CanaryPlan.apply` left it),
    planned again for the noise `cv` measured on the collect window's `users`; EtudeError when
    unreachable under "refuse". A plan already gate-only (no effect to plan for) stays as it was."""
    if settled.mode == "gate-only" and settled.users_per_arm is None:
        return settled
    out = settle(cfg, store, measured_cv=cv)
    return dataclasses.replace(out, source=f"{settled.source}; user_cv {cv:.2f} measured on the collect window's "
                                           f"{users} users")


def _unreachable(cfg: LoopConfig, p: CanaryPlan) -> CanaryPlan:
    if cfg.canary.underpowered == "refuse":
        raise EtudeError(f"[canary] {p.line} (underpowered = \"refuse\"; nothing was trained, the registry and the "
                         f"router are unchanged)")
    return p
