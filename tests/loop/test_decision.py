"""The canary decision rule and the hack alarms, on hand-made readouts (pure functions)."""

from __future__ import annotations

from etude.loop.config import AlarmSection, AlarmSpec, CanarySection
from etude.loop.decision import decide
from etude.loop.metrics import alarms


def _ab(primary: dict | None = None, srm_ok: bool = True, guardrails: list | None = None) -> dict:
    m = {"delta": 0.02, "ci_low": -0.1, "ci_high": 0.14, "msprt_p": 0.6, **(primary or {})}
    return {"ab": {"srm_ok": srm_ok, "srm_p": 0.5 if srm_ok else 1e-6, "metrics": {"accept_rate": m},
                   "guardrails": guardrails or []}, "alarms": []}


def test_undecided_keeps_collecting() -> None:
    verdict, reason = decide(_ab(), CanarySection())
    assert verdict is None and "not yet decisive" in reason


def test_significant_gain_promotes_and_loss_rolls_back() -> None:
    assert decide(_ab({"delta": 0.3, "ci_low": 0.1, "ci_high": 0.5, "msprt_p": 0.01}), CanarySection())[0] == "promote"
    assert decide(_ab({"delta": -0.3, "ci_low": -0.5, "ci_high": -0.1, "msprt_p": 0.01}), CanarySection())[0] == "rollback"


def test_interval_excluding_harm_promotes() -> None:
    c = CanarySection(harm_margin=0.05)
    assert decide(_ab({"delta": 0.01, "ci_low": -0.02, "ci_high": 0.04, "msprt_p": 0.9}), c)[0] == "promote"
    assert decide(_ab({"delta": 0.01, "ci_low": -0.08, "ci_high": 0.1, "msprt_p": 0.9}), c)[0] is None


def test_lower_is_better_primary_flips_the_direction() -> None:
    c = CanarySection(primary="dissatisfied_rate", primary_higher_is_better=False)
    ab = _ab()
    ab["ab"]["metrics"] = {"dissatisfied_rate": {"delta": -0.4, "ci_low": -0.6, "ci_high": -0.2, "msprt_p": 0.001}}
    assert decide(ab, c)[0] == "promote"
    ab["ab"]["metrics"]["dissatisfied_rate"].update(delta=0.4, ci_low=0.2, ci_high=0.6)
    assert decide(ab, c)[0] == "rollback"


def test_srm_alarm_and_guardrail_roll_back_before_the_primary_metric() -> None:
    good = {"delta": 0.3, "ci_low": 0.1, "ci_high": 0.5, "msprt_p": 0.01}
    assert decide(_ab(good, srm_ok=False), CanarySection())[0] == "rollback"
    with_alarm = _ab(good)
    with_alarm["alarms"] = [{"metric": "clarification_rate", "fired": True}]
    verdict, reason = decide(with_alarm, CanarySection())
    assert verdict == "rollback" and "clarification_rate" in reason
    guard = _ab(good, guardrails=[{"metric": "latency_s", "ok": False}])
    assert decide(guard, CanarySection()) == ("rollback", "guardrail failed: latency_s")


def test_no_readout_is_not_a_decision() -> None:
    assert decide({"ab": None, "alarms": []}, CanarySection())[0] is None


def test_alarms_fire_only_in_their_direction_and_with_enough_data() -> None:
    cfg = AlarmSection(min_interactions=2, rules=(AlarmSpec("clarification_rate", "up", 0.2),
                                                  AlarmSpec("edit_rate", "down", 0.2),
                                                  AlarmSpec("answer_length", "up", 0.5, relative=True)))
    ratios = {"control": {"interactions": 5, "clarification_rate": 0.1, "edit_rate": 0.6, "answer_length": 100.0},
              "canary": {"interactions": 5, "clarification_rate": 0.5, "edit_rate": 0.9, "answer_length": 160.0}}
    got = {a["metric"]: a["fired"] for a in alarms(ratios, cfg)}
    assert got == {"clarification_rate": True, "edit_rate": False, "answer_length": True}
    ratios["canary"]["interactions"] = 1
    assert all(a["fired"] is None for a in alarms(ratios, cfg))
