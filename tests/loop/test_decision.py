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


def test_always_valid_interval_excluding_harm_promotes() -> None:
    c = CanarySection(harm_margin=0.05)
    ok = {"delta": 0.01, "ci_low": -0.02, "ci_high": 0.04, "msprt_p": 0.9, "msprt_ci_low": -0.04, "msprt_ci_high": 0.06}
    verdict, reason = decide(_ab(ok), c)
    assert verdict == "promote" and "always-valid interval" in reason
    wide = dict(ok, msprt_ci_low=-0.08)
    assert decide(_ab(wide), c)[0] is None


def test_a_fixed_horizon_interval_alone_never_promotes() -> None:
    """Rule 7 runs after every round: the fixed-horizon interval there would be naive peeking."""
    c = CanarySection(harm_margin=0.0)
    verdict, reason = decide(_ab({"delta": 0.05, "ci_low": 0.01, "ci_high": 0.09, "msprt_p": 0.2}), c)
    assert verdict is None and "not yet decisive" in reason
    with_av = {"delta": 0.05, "ci_low": 0.01, "ci_high": 0.09, "msprt_p": 0.2, "msprt_ci_low": -0.03,
               "msprt_ci_high": 0.13}
    assert decide(_ab(with_av), c)[0] is None


def test_an_inconclusive_gate_never_promotes() -> None:
    from etude.loop.decision import gate_status, gated

    inconclusive = {"gate": "inconclusive", "gate_passed": False, "inconclusive": ["resolved"], "tasks": 2,
                    "regressions": []}
    verdict, reason = gated("promote", "significantly better: accept_rate +30%", inconclusive)
    assert verdict == "rollback" and "not promoted" in reason and "inconclusive on 2 task(s)" in reason
    assert "accept_rate +30%" in reason  # what the readout said is kept
    verdict, reason = gated("rollback", "guardrail failed: latency_s", inconclusive)
    assert verdict == "rollback" and reason.startswith("guardrail failed: latency_s;")
    passed = {"gate": "passed", "gate_passed": True}
    assert gated("promote", "ok", passed) == ("promote", "ok")
    # verdicts written before the three-way gate
    assert gate_status({"gate_passed": True}) == "passed" and gate_status({"gate_passed": False}) == "failed"


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
    cfg = AlarmSection(min_interactions=2, evidence="threshold",
                       rules=(AlarmSpec("clarification_rate", "up", 0.2), AlarmSpec("edit_rate", "down", 0.2),
                              AlarmSpec("answer_length", "up", 0.5, relative=True)))
    ratios = {"control": {"interactions": 5, "clarification_rate": 0.1, "edit_rate": 0.6, "answer_length": 100.0},
              "canary": {"interactions": 5, "clarification_rate": 0.5, "edit_rate": 0.9, "answer_length": 160.0}}
    got = {a["metric"]: a["fired"] for a in alarms(ratios, cfg)}
    assert got == {"clarification_rate": True, "edit_rate": False, "answer_length": True}
    # sequential evidence: past the threshold is not enough without an always-valid p below alpha / rules
    import dataclasses

    seq = dataclasses.replace(cfg, evidence="sequential")
    ab = {"metrics": {"clarification_rate": {"msprt_p": 0.001}, "answer_length": {"msprt_p": 0.2},
                      "edit_rate": {"msprt_p": 0.001}}}
    got = {a["metric"]: a["fired"] for a in alarms(ratios, seq, ab, alpha=0.05)}
    assert got == {"clarification_rate": True, "edit_rate": False, "answer_length": False}
    assert not any(a["fired"] for a in alarms(ratios, seq))  # no readout: no evidence
    ratios["canary"]["interactions"] = 1
    assert all(a["fired"] is None for a in alarms(ratios, cfg))


def test_eval_section_refuses_a_suite_below_its_minimum_and_defaults_to_30() -> None:
    import pytest

    from etude.errors import EtudeError
    from etude.loop.config import EvalSection

    assert EvalSection().min_tasks == 30 and EvalSection().max_tasks >= 30
    with pytest.raises(EtudeError, match="max_tasks 2 < min_tasks 30"):
        EvalSection(max_tasks=2)
    assert EvalSection(max_tasks=2, min_tasks=2).min_tasks == 2  # explicit, allowed
    with pytest.raises(EtudeError, match="on_inconclusive"):
        EvalSection(on_inconclusive="promote")


def test_shipped_configs_make_their_small_gate_explicit() -> None:
    from pathlib import Path

    from etude.loop import LoopConfig

    root = Path(__file__).resolve().parents[2] / "configs"
    for name in ("loop_tiny.toml", "loop_demo.toml"):
        cfg = LoopConfig.from_toml(root / name)
        assert cfg.eval.max_tasks >= cfg.eval.min_tasks
        if cfg.eval.max_tasks < 30:  # below the default: stated in the file, and the gate cannot promote
            text = (root / name).read_text()
            assert "min_tasks = " in text and cfg.eval.required


def test_canary_plan_sets_users_per_arm_and_refuses_an_unreachable_window() -> None:
    import pytest

    from etude.errors import EtudeError
    from etude.experiments.power import plan
    from etude.loop import LoopConfig
    from etude.loop.config import TrafficConfig

    c = CanarySection(mde=0.2, user_cv=1.0)
    p = c.plan()
    assert p.users_per_arm == plan(0.2, 1.0).users_per_arm == (393, 393)
    with pytest.raises(EtudeError, match=r"the plan needs 393/393 users per arm .* users = 4 reaches about 2/2"):
        LoopConfig(canary=c)
    ok = LoopConfig(canary=c, traffic=TrafficConfig(users=800))
    assert ok.canary.plan().users == 786
    assert LoopConfig(canary=c, traffic=TrafficConfig(kind="none")).canary.mde == 0.2  # real traffic: not checked here
    with pytest.raises(EtudeError, match="user_cv needs an mde"):
        CanarySection(user_cv=1.0)
    with pytest.raises(EtudeError, match=r"\[canary\] user_cv must be a positive"):
        CanarySection(mde=0.1, user_cv=-1.0)


def test_cycle_rolls_back_an_inconclusive_gate_before_the_canary(tmp_path) -> None:
    """Resumed after eval with an inconclusive gate (default on_inconclusive = "rollback"): the
    candidate is registered, canary and readout are skipped, decide retires it."""
    from etude.loop import LoopConfig, run_cycle
    from etude.loop.state import CycleState
    from etude.serve import registry
    from etude.store import open_store

    cfg = LoopConfig(root=str(tmp_path / "root"), org="acme", model="tiny", name="t")
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    st = CycleState.load_or_create(tmp_path / "root" / "cycle-0001", 1, cfg.to_dict())
    st.data["production"] = {"name": "tiny", "path": "tiny", "version": 0}
    for name in ("collect", "distill", "train", "eval"):
        st.start(name)
        st.finish(name)
    st.progress("train", checkpoint=str(tmp_path / "ckpt"))
    st.progress("eval", verdict={"gate": "inconclusive", "gate_passed": False, "regressions": [],
                                 "inconclusive": ["resolved"], "tasks": 30})

    rep = run_cycle(cfg, traffic=lambda ctx: (_ for _ in ()).throw(AssertionError("traffic")), progress=False).to_dict()
    assert [rep["stages"][s]["status"] for s in ("register", "canary", "readout", "decide")] == \
        ["done", "skipped", "skipped", "done"]
    assert rep["decision"] == "rollback" and "eval gate inconclusive on 30 task(s)" in rep["reason"]
    assert registry.get_checkpoint(store, "t-c0001").state == "retired"
    assert rep["production_after"] == {"name": "tiny", "version": 0}


def test_a_promotion_is_held_while_an_alarm_is_past_its_threshold_without_evidence():
    """A candidate that quits at once: repeat_rate significantly better (it makes no call), edit_rate
    down 100% but with too little evidence to fire its alarm. It must not promote (issue 46 item 4)."""
    from types import SimpleNamespace

    from etude.loop.decision import decide, past_threshold

    canary = SimpleNamespace(primary="repeat_rate", primary_higher_is_better=False, alpha=0.05, harm_margin=0.0)
    ab = {"srm_ok": True, "guardrails": [], "metrics": {"repeat_rate": {
        "delta": -1.0, "ci_low": -1.6, "ci_high": -0.4, "msprt_p": 0.004, "msprt_ci_low": -1.9, "msprt_ci_high": -0.1}}}
    quiet = {"metric": "edit_rate", "direction": "down", "threshold": 0.5, "change": -0.1, "fired": False}
    warned = {**quiet, "change": -1.0, "msprt_p": 0.033}
    assert decide({"ab": ab, "alarms": [quiet]}, canary)[0] == "promote"
    verdict, reason = decide({"ab": ab, "alarms": [warned]}, canary)
    assert verdict is None and reason.startswith("promotion held: hack alarm edit_rate past its threshold")
    assert past_threshold(warned) and not past_threshold(quiet) and not past_threshold({"change": None})
    # a rollback is never held, and a fired alarm still rolls back
    worse = {**ab, "metrics": {"repeat_rate": {**ab["metrics"]["repeat_rate"], "delta": 1.0}}}
    assert decide({"ab": worse, "alarms": [warned]}, canary)[0] == "rollback"
    assert decide({"ab": ab, "alarms": [{**warned, "fired": True}]}, canary) == ("rollback", "hack alarm: edit_rate")
