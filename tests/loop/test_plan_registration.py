"""The canary's plan is registered before traffic (issue 46 item 2): the store keeps it, the same
plan again (a resumed cycle) is accepted, a different one — or a first plan after users arrived —
is refused, and the readout decides on the registered plan, not on the config it is handed."""

import dataclasses

import pytest

from etude.errors import EtudeError
from etude.loop.config import GuardrailSpec, LoopConfig
from etude.loop.plan import LATER_FIELDS, as_registered_before, canary_of, registered_plan
from etude.serve import registry
from etude.store.sql import open_store


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path / 'etude.db'}")
    registry.register_checkpoint(s, "prod", "tiny", version=1, org=None)
    registry.register_checkpoint(s, "cand", "tiny", version=2, org="acme")
    registry.set_experiment(s, "exp1", [("control", "prod", 0.5), ("canary", "cand", 0.5)], org="acme")
    return s


def _plan(cfg, exp="exp1"):
    return registered_plan(cfg, {"mode": "ab", "source": "[canary] mde", "users_per_arm": [40, 40],
                                 "reach": [8, 8]}, exp)


def test_a_plan_changed_after_registration_is_refused_and_the_same_plan_is_not(store, tmp_path):
    cfg = LoopConfig(root=str(tmp_path))
    first = registry.register_plan(store, "exp1", _plan(cfg))
    assert registry.register_plan(store, "exp1", _plan(cfg)) == first  # a resumed cycle
    looser = dataclasses.replace(cfg, canary=dataclasses.replace(cfg.canary, alpha=0.2))
    with pytest.raises(EtudeError, match=r"changing it is refused \(alpha: 0.05 -> 0.2"):
        registry.register_plan(store, "exp1", _plan(looser))
    moved = dataclasses.replace(cfg, canary=dataclasses.replace(
        cfg.canary, guardrails=(GuardrailSpec("dissatisfied_rate", False, 5.0),)))
    with pytest.raises(EtudeError, match="guardrails"):
        registry.register_plan(store, "exp1", _plan(moved))
    assert registry.registered_plan(store, "exp1")["plan"]["alpha"] == 0.05


def test_a_first_plan_after_traffic_started_is_refused(store, tmp_path):
    store.log_interaction({"org_id": "acme", "checkpoint": "cand", "policy_version": 2, "experiment_id": "exp1",
                           "arm": "canary", "user_id": "u1", "session_id": "s1", "model": "auto"})
    with pytest.raises(EtudeError, match="after traffic started"):
        registry.register_plan(store, "exp1", _plan(LoopConfig(root=str(tmp_path))))


def test_the_readout_decides_on_the_registered_plan(tmp_path):
    cfg = LoopConfig(root=str(tmp_path))
    plan = _plan(cfg)
    edited = dataclasses.replace(cfg, canary=dataclasses.replace(cfg.canary, primary="latency_s",
                                                                 primary_higher_is_better=False, alpha=0.3))
    c = canary_of(plan, edited)
    assert (c.primary, c.alpha, c.primary_higher_is_better) == ("accept_rate", 0.05, True)
    assert [g.metric for g in c.guardrails] == ["dissatisfied_rate", "latency_s"]
    assert plan["users_per_arm"] == [40, 40] and plan["guardrail_rule"] == "sequential"


def test_a_plan_registered_before_a_later_field_existed_resumes_and_a_real_change_is_still_refused(store, tmp_path):
    cfg = LoopConfig(root=str(tmp_path))
    old = {k: v for k, v in _plan(cfg).items() if k not in LATER_FIELDS}  # as an older etude registered it
    registry.register_plan(store, "exp1", old)
    same = as_registered_before(_plan(cfg), old)  # min_look_users at the default it decided with
    assert registry.register_plan(store, "exp1", same)["plan"] == registry.registered_plan(store, "exp1")["plan"]
    assert canary_of(registry.registered_plan(store, "exp1")["plan"], cfg).min_look_users == 0
    burned = dataclasses.replace(cfg, canary=dataclasses.replace(cfg.canary, min_look_users=10))
    with pytest.raises(EtudeError, match=r"min_look_users: None -> 10"):
        registry.register_plan(store, "exp1", as_registered_before(_plan(burned), old))
    assert as_registered_before(_plan(cfg), None) == _plan(cfg)  # nothing registered yet: the plan as it is
