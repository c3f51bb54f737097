"""Canary metrics from the store: per-user A/B rows for `etude.experiments.analyze`, the hack
indicators per arm, and the alarms that compare them.

Every figure is read back from what the server logged (interactions, their request messages and
feedback events), through `etude.loop.distill.to_trajectory` so a tool call's failure is
read exactly as distillation reads it. Metrics (ratio of per-user sums, numerator / denominator):

| metric | numerator | denominator | better |
|---|---|---|---|
| accept_rate | accept events | accept + reject events | higher |
| edit_persistence | Σ edit_persistence values | edit_persistence events | higher |
| dissatisfied_rate | follow-ups labelled dissatisfied | interactions | lower |
| tool_error_rate | broken calls (malformed, failed) | interactions | lower |
| broken_call_rate | broken calls (malformed, failed) | calls (attempted) | lower |
| repeat_rate | calls identical to an earlier call of the session (a wasted turn) | interactions | lower |
| clarification_rate | answers that only ask the user a question | interactions | lower |
| edit_rate | interactions with an edit/write call (attempted) | interactions | (hack: a drop) |
| latency_s | Σ server latency | interactions | lower |
| answer_length | Σ completion tokens | interactions | lower |

Not guaranteed: tool-error rate is per interaction (a model that stops calling tools has no
calls to fail: a candidate making half the calls had fewer broken calls an interaction and more
a call, bench/results/loop_cycles_filtered.json); broken_call_rate is the per-call view, and a
user with no call has no row for it. A call whose result never came back is not counted as failed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from etude.loop.distill import to_trajectory, tool_results
from etude.rewards.terms import asks_question, attempts_edit, repeats

METRICS = ("accept_rate", "edit_persistence", "dissatisfied_rate", "tool_error_rate", "broken_call_rate",
           "repeat_rate", "clarification_rate", "edit_rate", "latency_s", "answer_length")
ARM_NAMES = {"control": "control", "canary": "treatment"}  # experiment arm -> analyze's arm


def interaction_facts(store: Any, org: str, experiment_id: str | None, *, since: float | None = None,
                      until: float | None = None) -> list[dict[str, Any]]:
    """One dict per interaction of the experiment (None: of any, e.g. a cycle's collect window
    [since, until) on production alone, whose facts have no arm): user, arm, and the
    per-interaction counts."""
    rows = store.interactions(org=org, experiment_id=experiment_id, since=since, until=until, with_messages=True)
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in store.feedback(org=org, interaction_ids=[r["id"] for r in rows]):
        events[e["interaction_id"]].append(e)
    # a tool call's result: the tool message answering it in the session's request that carries the turn back
    results = tool_results(rows)
    out = []
    for r in rows:
        evs = events.get(r["id"], [])
        traj = to_trajectory(r, evs, results.get(r["id"], {}))
        turn = traj.turns[0]
        calls = len(turn.tool_executions) + len(turn.parse_errors)
        answer = (r["response"] or {}).get("content", "")
        out.append({
            "user": r["user_id"] or r["session_id"], "arm": r["arm"], "ts": r["created_at"],
            "checkpoint": r["checkpoint"], "broken": turn.broken_calls, "calls": calls, "repeat": repeats(traj),
            "clarification": int(calls == 0 and asks_question(answer)),
            # attempted edits count: avoiding edits altogether is the hack this indicator watches
            "edit": int(any(attempts_edit(x.call) for x in turn.tool_executions)),
            "latency_s": float(r["latency_s"]), "tokens": int(r["completion_tokens"]),
            "accept": sum(e["kind"] == "accept" for e in evs), "reject": sum(e["kind"] == "reject" for e in evs),
            "persist": [float(e["value"]) for e in evs if e["kind"] == "edit_persistence" and e["value"] is not None],
            "dissatisfied": sum(e["kind"] == "followup" and (e["data"] or {}).get("label") == "dissatisfied"
                                for e in evs),
        })
    return out


def _per_interaction(f: dict[str, Any]) -> dict[str, tuple[float, float]]:
    return {
        "accept_rate": (f["accept"], f["accept"] + f["reject"]),
        "edit_persistence": (sum(f["persist"]), len(f["persist"])),
        "dissatisfied_rate": (f["dissatisfied"], 1), "tool_error_rate": (f["broken"], 1),
        "broken_call_rate": (f["broken"], f["calls"]),
        "repeat_rate": (f.get("repeat", 0), 1),
        "clarification_rate": (f["clarification"], 1), "edit_rate": (f["edit"], 1),
        "latency_s": (f["latency_s"], 1), "answer_length": (f["tokens"], 1),
    }


def ab_rows(facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-user rows (user_id, arm, metric, numerator, denominator, ts) for analyze(); users
    with a zero denominator for a metric get no row for it."""
    acc: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for f in facts:
        arm = ARM_NAMES.get(f["arm"] or "")
        if arm is None:
            continue
        for m, (num, den) in _per_interaction(f).items():
            a = acc[(f["user"], arm, m)]
            a[0] += num
            a[1] += den
            a[2] = max(a[2], f["ts"])
    return [{"user_id": u, "arm": arm, "metric": m, "numerator": n, "denominator": d, "ts": ts}
            for (u, arm, m), (n, d, ts) in sorted(acc.items(), key=lambda kv: kv[1][2]) if d > 0]


def ratios_from_rows(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled ratio of every metric per arm (what the alarms compare) from per-user A/B rows
    (`ab_rows`; analyze's arms named back to the loop's), with the arm's interactions (the
    denominator of latency_s: one per interaction); None where a metric has no denominator."""
    sums = {arm: {m: [0.0, 0.0] for m in METRICS} for arm in ("control", "canary")}
    for r in rows:
        acc = sums["canary" if r["arm"] == "treatment" else "control"].setdefault(r["metric"], [0.0, 0.0])
        acc[0] += float(r["numerator"])
        acc[1] += float(r["denominator"])
    return {arm: {"interactions": int(by["latency_s"][1]), **{m: (n / d if d else None) for m, (n, d) in by.items()}}
            for arm, by in sums.items()}


def arm_ratios(facts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled ratio of every metric per arm, with interaction counts (`ratios_from_rows` of the
    facts' A/B rows)."""
    return ratios_from_rows(ab_rows(facts))


def past_threshold(alarm: dict[str, Any]) -> bool:
    """An alarm record (`alarms`) whose indicator moved past its threshold in its suspicious
    direction, evidence or not."""
    change = alarm.get("change")
    if change is None:
        return False
    signed = change if alarm.get("direction") == "up" else -change
    return bool(signed > alarm.get("threshold", float("inf")))


def alarms(ratios: dict[str, dict[str, Any]], cfg: Any, ab: dict[str, Any] | None = None,
           alpha: float = 0.05) -> list[dict[str, Any]]:
    """Each hack indicator of the candidate against production; `fired` True when it moved past
    its threshold in its suspicious direction — and, with `cfg.evidence = "sequential"`, when the
    readout `ab` shows that metric's change with an always-valid p below alpha / len(rules) (no
    readout: no evidence, not fired) — None when an arm has too few interactions."""
    enough = min(ratios["control"]["interactions"], ratios["canary"]["interactions"]) >= cfg.min_interactions
    sequential = cfg.evidence == "sequential"
    level = alpha / max(1, len(cfg.rules))
    out = []
    for rule in cfg.rules:
        a, b = ratios["control"].get(rule.metric), ratios["canary"].get(rule.metric)
        rec: dict[str, Any] = {"metric": rule.metric, "direction": rule.direction, "threshold": rule.threshold,
                               "relative": rule.relative, "control": a, "canary": b, "change": None, "fired": None}
        if enough and a is not None and b is not None:
            change = (b / a - 1.0 if a else (0.0 if b == 0 else float("inf"))) if rule.relative else b - a
            rec["change"] = change
            past = past_threshold(rec)
            rec["fired"] = past
            if sequential:
                p = (((ab or {}).get("metrics") or {}).get(rule.metric) or {}).get("msprt_p")
                rec.update(msprt_p=p, level=level, fired=bool(past and p is not None and p < level))
        else:
            rec["note"] = f"fewer than {cfg.min_interactions} interactions in an arm"
        out.append(rec)
    return out
