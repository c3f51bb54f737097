"""Guardrails that do not fire on noise (issue 46 item 3): the sequential rule rolls back only on
always-valid evidence of harm past the margin; the old non-inferiority rule rolled an A/A cycle
back at 8 users an arm (dissatisfied_rate)."""

import dataclasses

import numpy as np

from etude.experiments.aa import rerandomised
from etude.experiments.analysis import ABConfig, Guardrail, analyze
from etude.loop.config import CanarySection
from etude.loop.decision import decide


def _users(rng, n, p_dissat, p_accept=0.5, start=0, arm=None, sessions=3):
    rows = []
    for u in range(start, start + n):
        a = arm or ("treatment" if u % 2 else "control")
        rows.append({"user_id": u, "arm": a, "metric": "dissatisfied_rate",
                     "numerator": int(rng.binomial(sessions, p_dissat)), "denominator": sessions, "ts": float(u)})
        acc = int(rng.binomial(sessions, p_accept))
        rows.append({"user_id": u, "arm": a, "metric": "accept_rate", "numerator": acc, "denominator": sessions,
                     "ts": float(u)})
    return rows


GUARD = (Guardrail("dissatisfied_rate", higher_is_better=False, margin=0.5),)


def test_the_old_rule_fires_on_aa_noise_at_8_users_an_arm_and_the_sequential_rule_does_not():
    rng = np.random.default_rng(0)
    old_fired = new_fired = 0
    for _ in range(200):
        rows = _users(rng, 16, 0.3)
        old = analyze(rows, ABConfig(guardrails=GUARD, guardrail_rule="noninferiority"))["guardrails"][0]
        new = analyze(rows, ABConfig(guardrails=GUARD))["guardrails"][0]
        old_fired += old["ok"] is False
        new_fired += new["ok"] is False
    assert old_fired > 60  # the old rule: no evidence of no harm at 8 users is a failure
    assert new_fired <= 10  # at most alpha (5% of 200)


def test_the_sequential_guardrail_catches_real_harm():
    rng = np.random.default_rng(1)
    rows = _users(rng, 400, 0.2, arm="control") + _users(rng, 400, 0.6, start=400, arm="treatment")
    g = analyze(rows, ABConfig(guardrails=GUARD))["guardrails"][0]
    assert g["ok"] is False and g["least_plausible_harm"] > 0.5


def test_rerandomised_aa_splits_neither_promote_nor_roll_back_more_than_alpha():
    rng = np.random.default_rng(2)
    rows = _users(rng, 60, 0.3, arm="control")  # one model's traffic
    canary = CanarySection()
    cfg = ABConfig(alpha=canary.alpha, guardrails=tuple(Guardrail(g.metric, g.higher_is_better, g.margin)
                                                       for g in canary.guardrails if g.metric == "dissatisfied_rate"))
    res = rerandomised(rows, lambda rd: decide(rd, dataclasses.replace(canary, primary="accept_rate")), cfg, 200)
    assert res["false_promotion"]["rate"] <= canary.alpha
    assert res["false_guardrail_rollback"]["rate"] <= canary.alpha
    old = rerandomised(rows, lambda rd: decide(rd, canary), dataclasses.replace(cfg, guardrail_rule="noninferiority"),
                       200)
    assert old["false_guardrail_rollback"]["rate"] > res["false_guardrail_rollback"]["rate"]


def test_the_loops_whole_rule_on_aa_splits_reports_alarm_rollbacks_too():
    """`etude.loop.readout.aa_rates`: the loop's decision (guardrails, hack alarms, primary) on
    re-dealt A/A traffic. The hack alarms are fixed thresholds on pooled ratios, not tests: their
    false-rollback rate is reported beside the others so a bench can show it."""
    from etude.loop.config import LoopConfig
    from etude.loop.readout import aa_rates, ratios_from_rows

    rng = np.random.default_rng(4)
    rows = []
    for u in range(60):
        for m, p in (("accept_rate", 0.5), ("dissatisfied_rate", 0.2), ("tool_error_rate", 0.15),
                     ("clarification_rate", 0.05), ("edit_rate", 0.6), ("latency_s", None)):
            num = float(rng.gamma(2.0, 1.0) * 3) if p is None else int(rng.binomial(3, p))
            rows.append({"user_id": u, "arm": "control", "metric": m, "numerator": num, "denominator": 3,
                         "ts": float(u)})
    r = ratios_from_rows(rows)
    assert r["control"]["interactions"] == 180 and 0 < r["control"]["tool_error_rate"] < 1
    res = aa_rates(rows, LoopConfig(), splits=100)
    assert res["false_promotion"]["rate"] <= 0.05 and res["false_guardrail_rollback"]["rate"] <= 0.05
    assert 0 <= res["false_alarm_rollback"]["rate"] <= 1 and res["splits"] == 100
