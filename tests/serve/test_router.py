"""Registry states, promotion, rollback, and the `auto` router's sticky weighted assignment."""

from __future__ import annotations

import pytest

from etude.errors import EtudeError, NotFound
from etude.serve import registry as reg
from etude.serve.registry import Arm, Experiment
from etude.serve.router import Router, bucket, choose_arm
from etude.store import open_store


@pytest.fixture
def store(tmp_path):
    return open_store(f"sqlite:///{tmp_path / 'r.db'}")


def _exp(*weights: float, salt: str = "s") -> Experiment:
    arms = tuple(Arm(f"a{i}", f"c{i}", w) for i, w in enumerate(weights))
    return Experiment(id="e", org_id=None, salt=salt, arms=arms, status="active")


def test_assignment_is_deterministic_and_follows_the_weights():
    exp = _exp(0.9, 0.1)
    users = [f"user-{i}" for i in range(4000)]
    first = [choose_arm(exp, u).name for u in users]
    assert first == [choose_arm(exp, u).name for u in users]
    share = first.count("a1") / len(users)
    assert 0.08 < share < 0.12  # 10% canary, binomial sd ~0.5%
    assert bucket("s", "x") != bucket("t", "x")  # the salt re-randomises


def test_growing_the_last_arm_only_moves_users_into_it():
    small, big = _exp(0.9, 0.1), _exp(0.5, 0.5)
    users = [f"u{i}" for i in range(2000)]
    moved_out = [u for u in users if choose_arm(small, u).name == "a1" and choose_arm(big, u).name != "a1"]
    assert moved_out == []
    assert sum(choose_arm(big, u).name == "a1" for u in users) > 800


def test_zero_weight_arm_gets_nobody():
    exp = _exp(1.0, 0.0)
    assert {choose_arm(exp, f"u{i}").name for i in range(500)} == {"a0"}


def test_promote_retires_the_old_production_and_rollback_restores_it(store):
    reg.register_checkpoint(store, "v1", "tiny", state="production")
    reg.register_checkpoint(store, "v2", "tiny", version=1)
    assert reg.production(store, None).name == "v1"
    reg.promote(store, "v2")
    assert reg.production(store, None).name == "v2"
    assert reg.get_checkpoint(store, "v1").state == "retired"
    restored = reg.rollback(store)
    assert restored.name == "v1"
    assert reg.get_checkpoint(store, "v2").state == "retired"
    with pytest.raises(EtudeError):
        reg.rollback(store, "v2")


def test_registry_refuses_bad_input(store):
    reg.register_checkpoint(store, "v1", "tiny")
    for bad in (lambda: reg.register_checkpoint(store, "v1", "tiny"),
                lambda: reg.register_checkpoint(store, "auto", "tiny"),
                lambda: reg.set_state(store, "v1", "shiny"),
                lambda: reg.set_experiment(store, "e", []),
                lambda: reg.set_experiment(store, "e", [("a", "v1", -1.0)]),
                lambda: reg.set_experiment(store, "e", [("a", "missing", 1.0)])):
        with pytest.raises(EtudeError):
            bad()


def test_org_checkpoints_stay_inside_their_org(store):
    reg.register_checkpoint(store, "shared", "tiny", state="production")
    reg.register_checkpoint(store, "acme-lora", "tiny", org="acme")
    with pytest.raises(EtudeError):
        reg.set_experiment(store, "e", [("c", "shared", 1), ("t", "acme-lora", 1)], org="globex")
    r = Router(store)
    assert r.resolve("acme", "acme-lora", "u", None).checkpoint.name == "acme-lora"
    with pytest.raises(NotFound):
        r.resolve("globex", "acme-lora", "u", None)
    reg.set_experiment(store, "acme-exp", [("c", "shared", 0.0), ("t", "acme-lora", 1.0)], org="acme")
    assert r.resolve("acme", "auto", "u", None).checkpoint.name == "acme-lora"
    assert r.resolve("globex", "auto", "u", None).checkpoint.name == "shared"
    assert reg.get_checkpoint(store, "acme-lora").state == "canary"


def test_sessions_are_pinned_and_a_retired_pin_is_replaced(store):
    reg.register_checkpoint(store, "v1", "tiny", state="production")
    reg.register_checkpoint(store, "v2", "tiny")
    reg.set_experiment(store, "e", [("control", "v1", 0.0), ("canary", "v2", 1.0)])
    r = Router(store)
    assert r.resolve("acme", "auto", "u", "s").checkpoint.name == "v2"
    reg.set_experiment(store, "e", [("control", "v1", 1.0), ("canary", "v2", 0.0)])
    assert r.resolve("acme", "auto", "u", "s").checkpoint.name == "v2"  # never switches mid-session
    assert r.resolve("acme", "auto", "u", "s2").checkpoint.name == "v1"
    reg.set_state(store, "v2", "retired")
    route = r.resolve("acme", "auto", "u", "s")
    assert route.checkpoint.name == "v1"
    assert store.session_pin("acme", "s")["checkpoint"] == "v1"


def test_auto_without_any_production_is_not_found(store):
    with pytest.raises(NotFound):
        Router(store).resolve("acme", "auto", "u", None)


def test_retiring_a_checkpoint_stops_the_experiments_that_route_to_it(store):
    reg.register_checkpoint(store, "v1", "tiny", state="production")
    reg.register_checkpoint(store, "v2", "tiny", version=1)
    reg.set_experiment(store, "e", [("control", "v1", 0.5), ("canary", "v2", 0.5)])
    reg.promote(store, "v2")  # v1, the control arm, is retired by the promotion
    assert reg.get_experiment(store, "e").status == "stopped"
    r = Router(store)
    assert {r.resolve("acme", "auto", f"u{i}", None).checkpoint.name for i in range(20)} == {"v2"}


def test_an_org_sees_its_own_production_and_experiment_else_the_shared_ones(store):
    """production and active_experiment share one own-or-shared lookup (registry._own_or_shared)."""
    store.ensure_org("acme")
    store.ensure_org("globex")
    reg.register_checkpoint(store, "shared", "tiny", state="production")
    reg.register_checkpoint(store, "acme-1", "tiny", org="acme", version=1, state="production")
    assert [reg.production(store, o).name for o in (None, "acme", "globex")] == ["shared", "acme-1", "shared"]
    assert reg.active_experiment(store, "acme") is None
    reg.register_checkpoint(store, "shared-2", "tiny", version=2)
    reg.set_experiment(store, "shared-exp", [("control", "shared", 0.9), ("canary", "shared-2", 0.1)])
    assert [reg.active_experiment(store, o).id for o in (None, "acme", "globex")] == ["shared-exp"] * 3
    reg.register_checkpoint(store, "acme-2", "tiny", org="acme", version=2)
    reg.set_experiment(store, "acme-exp", [("control", "acme-1", 0.9), ("canary", "acme-2", 0.1)], org="acme")
    assert [reg.active_experiment(store, o).id for o in (None, "acme", "globex")] == ["shared-exp", "acme-exp",
                                                                                        "shared-exp"]
