"""A canary planned for the effect it must find (issue 32 item 3): the mde taken from the offline
held-out gain, the users per arm that follow, and — when the window cannot reach them — one line
up front and a gate-only decision labelled as such (or, under "refuse", one line, a non-zero
exit and nothing touched)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.experiments.power import plan
from etude.loop import LoopConfig, cycle, run_cycle
from etude.loop.config import CanarySection, TrafficConfig
from etude.loop.plan import (
    CanaryPlan,
    aa_check,
    canary_of,
    collect_user_cv,
    mde_from_gain,
    registered_plan,
    resettle,
    settle,
    window_rows,
)
from etude.loop.readout import ab_config
from etude.loop.state import CycleState
from etude.serve import registry
from etude.store import open_store
from tests.loop.org_cli import loop_cli, registry_snapshot


def _held(base: int, adapter: int, tasks: int = 60) -> dict:
    return {"tasks": tasks, "base": {"resolved": base}, "adapter": {"resolved": adapter}}


def _report(tmp_path: Path, base: int, adapter: int) -> Path:
    p = tmp_path / f"report-{base}-{adapter}.json"
    p.write_text(json.dumps({"heldout": _held(base, adapter)}))
    return p


def test_the_held_out_gain_becomes_the_primary_metrics_mde_through_the_user_model() -> None:
    cfg = LoopConfig(canary=CanarySection(mde_from="x", user_cv=1.0))
    # defaults: keep rate 0.35 + 0.45 r, so 18/60 -> 27/60 resolved is 0.485 -> 0.5525
    assert mde_from_gain(_held(18, 27), cfg) == pytest.approx(0.5525 / 0.485 - 1)
    dis = LoopConfig(canary=CanarySection(mde_from="x", user_cv=1.0, primary="dissatisfied_rate",
                                          primary_higher_is_better=False))
    # dissatisfied rate 0.85 (0.35 - 0.27 r): lower is better, so the gain is the relative drop
    assert mde_from_gain(_held(18, 27), dis) == pytest.approx(1 - (0.35 - 0.27 * 0.45) / (0.35 - 0.27 * 0.3))
    assert mde_from_gain(_held(20, 20), cfg) == 0.0 and mde_from_gain(_held(20, 14), cfg) < 0
    with pytest.raises(EtudeError, match="mde_from needs user_cv"):
        CanarySection(mde_from="candidate")
    with pytest.raises(EtudeError, match="set mde or mde_from, not both"):
        CanarySection(mde_from="candidate", mde=0.1, user_cv=1.0)
    with pytest.raises(EtudeError, match="not 'latency_s'"):
        CanarySection(mde_from="candidate", user_cv=1.0, primary="latency_s", primary_higher_is_better=False)


def test_a_reachable_plan_sets_users_per_arm_and_the_readouts_mde(tmp_path: Path) -> None:
    report = _report(tmp_path, 18, 27)
    cfg = LoopConfig(root=str(tmp_path / "root"), canary=CanarySection(mde_from=str(report), user_cv=1.0),
                     traffic=TrafficConfig(users=2000))
    p = settle(cfg, open_store(cfg.db_url()))
    mde = 0.5525 / 0.485 - 1
    assert p.mode == "ab" and p.line == "" and p.mde == pytest.approx(mde) and "18/60 -> 27/60" in p.source
    assert p.users_per_arm == plan(p.mde, 1.0).users_per_arm and p.reach == (1000.0, 1000.0)
    assert 200 < max(p.users_per_arm) <= 1000  # 811 at user_cv 1
    applied = p.apply(cfg)
    assert applied.canary.mde == p.mde and ab_config(applied).mde == p.mde  # the readout's tau follows the plan
    assert applied.canary.plan().users_per_arm == p.users_per_arm


def _resumed_after_eval(tmp_path: Path, cfg: LoopConfig, verdict: dict) -> None:
    """A cycle whose collect..eval are done (as test_decision's resumed states): only register,
    canary, readout and decide run, with no model and no traffic."""
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    st = CycleState.load_or_create(Path(cfg.root) / "cycle-0001", 1, cfg.to_dict())
    st.data["production"] = {"name": "tiny", "path": "tiny", "version": 0}
    for name in ("collect", "distill", "train", "eval"):
        st.start(name)
        st.finish(name)
    st.progress("train", checkpoint=str(tmp_path / "ckpt"))
    st.progress("eval", verdict=verdict)


def _no_traffic(ctx) -> None:
    raise AssertionError("a gate-only cycle sends no canary traffic")


@pytest.mark.parametrize(("improvements", "decision"), [(["resolved"], "promote"), ([], "rollback")])
def test_an_unreachable_plan_says_so_and_decides_on_the_gate_alone(tmp_path: Path, capsys, improvements, decision) -> None:
    report = _report(tmp_path, 18, 27)  # +13.9% keep rate needs hundreds of users per arm; 4 users reach 2/2
    cfg = LoopConfig(root=str(tmp_path / "root"), name="t", model="tiny",
                     canary=CanarySection(mde_from=str(report), user_cv=1.0, underpowered="gate-only"))
    _resumed_after_eval(tmp_path, cfg, {"gate": "passed", "gate_passed": True, "regressions": [],
                                        "inconclusive": [], "improvements": improvements, "tasks": 30})
    rep = run_cycle(cfg, traffic=_no_traffic, progress=False).to_dict()

    err = capsys.readouterr().err.strip().splitlines()
    need = plan(0.5525 / 0.485 - 1, 1.0).users_per_arm
    assert err == [f"etude loop: gate-only decision: the plan needs {need[0]}/{need[1]} users per arm for a 13.9% "
                   f"lift (user_cv 1, power 0.8) but [traffic] users = 4 reaches about 2/2: raise users or the mde"]
    assert [rep["stages"][s]["status"] for s in ("register", "canary", "readout", "decide")] == \
        ["done", "skipped", "skipped", "done"]
    assert rep["basis"] == "gate-only" and rep["plan"]["mode"] == "gate-only"
    assert tuple(rep["plan"]["users_per_arm"]) == need and rep["ab"] is None
    assert rep["decision"] == decision and rep["reason"].startswith("gate-only decision (the plan needs")
    state = json.loads((Path(cfg.root) / "cycle-0001" / "state.json").read_text())
    assert state["stages"]["canary"]["reason"].startswith("gate-only decision")
    cand = registry.get_checkpoint(open_store(cfg.db_url()), "t-c0001")
    assert cand.state == ("production" if decision == "promote" else "retired")


def test_no_offline_gain_leaves_nothing_to_plan_for(tmp_path: Path, capsys) -> None:
    report = _report(tmp_path, 0, 0)  # bench/results/specialise.json: held-out 0/60 -> 0/60
    cfg = LoopConfig(root=str(tmp_path / "root"), name="t", model="tiny",
                     canary=CanarySection(mde_from=str(report), user_cv=1.0, underpowered="gate-only"))
    _resumed_after_eval(tmp_path, cfg, {"gate": "inconclusive", "gate_passed": False, "regressions": [],
                                        "inconclusive": ["resolved"], "improvements": [], "tasks": 30})
    rep = run_cycle(cfg, traffic=_no_traffic, progress=False).to_dict()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the offline check shows no gain to plan for" in err[0] and "0/60 -> 0/60" in err[0]
    assert rep["decision"] == "rollback" and rep["basis"] == "gate-only" and "eval gate inconclusive" in rep["reason"]


CONFIG = """
[loop]
root = "{root}"
model = "tiny"
[traffic]
users = 4
[canary]
mde_from = "candidate"
user_cv = 1.0
[eval]
max_tasks = 2
min_tasks = 2
"""


def test_an_unreachable_plan_under_refuse_is_one_line_and_touches_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    cfg_path = tmp_path / "loop.toml"
    cfg_path.write_text(CONFIG.format(root=root))
    db = LoopConfig.from_toml(cfg_path).db_url()
    store = open_store(db)
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    store.create_key("acme", name="ci")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    registry.register_checkpoint(store, "acme-spec-1", str(adapter), org="acme", version=1,
                                 meta={"kind": "specialised", "base": "tiny", "heldout": _held(18, 27)})
    before = registry_snapshot(db)

    r = loop_cli(cfg_path, "acme")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("etude: error: [canary] the plan needs ") and "[traffic] users = 4 reaches about 2/2" in lines[0]
    assert "nothing was trained, the registry and the router are unchanged" in lines[0]
    assert registry_snapshot(db) == before
    assert not (root / "orgs" / "acme").exists() and registry.production(store, "acme").name == "tiny"


def _previous_cycle(root: Path, delta: float, seed: int = 0) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    d = root / "cycle-0001"
    d.mkdir(parents=True)
    (d / "readout.json").write_text(json.dumps({"ab": {"metrics": {"accept_rate": {"delta": delta}}}}))
    rows = [{"user_id": f"u{u}", "arm": ("control", "treatment")[u % 2], "metric": "accept_rate",
             "numerator": int(rng.binomial(4, 0.5)), "denominator": 4} for u in range(40)]
    (d / "ab_rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_mde_comes_from_the_previous_cycles_measured_lift(tmp_path) -> None:
    """Issue 46 item 2: the minimum detectable effect taken from the previous cycle, with the
    per-user variation measured on its rows; the first cycle has none and says so."""
    cfg = LoopConfig(root=str(tmp_path), canary=CanarySection(mde_from="previous", underpowered="gate-only"),
                     traffic=TrafficConfig(users=400))
    with pytest.raises(EtudeError, match="no earlier cycle"):
        settle(cfg, None)
    _previous_cycle(tmp_path, -0.2)
    p = settle(cfg, None)
    assert p.mde == pytest.approx(0.2) and "previous cycle cycle-0001: accept_rate lift -20.0%" in p.source
    assert p.users_per_arm and p.users_per_arm[0] > 10


def _collect_window(store, org: str, broken_per_user: list) -> None:
    """Production's collect window: one user per entry `k` (two interactions) or `(k, n)` (n
    interactions), with `k` broken calls in the first (a malformed call each)."""
    store.ensure_org(org)
    for i, entry in enumerate(broken_per_user):
        k, n = entry if isinstance(entry, tuple) else (entry, 2)
        for j in range(n):
            store.log_interaction({
                "org_id": org, "user_id": f"u{i}", "session_id": f"s{i}", "checkpoint": "prod", "policy_version": 0,
                "latency_s": 1.0, "messages": [{"role": "user", "content": "fix it"}],
                "response": {"content": "", "tool_calls": [], "parse_errors": ["bad JSON"] * (k if j == 0 else 0)}})


def test_the_plan_is_settled_again_on_the_noise_the_collect_window_measured(tmp_path: Path) -> None:
    """Issue 46 item 2: `user_cv_from = "collect"` plans the canary for the per-user noise
    production's own users showed in the cycle's collect window, before the canary's first user:
    the same effect needs more users when they are noisier, and a window that cannot reach them
    goes gate-only with the measured figure in its line."""
    with pytest.raises(EtudeError, match="user_cv or user_cv_from, not both"):
        CanarySection(mde=0.5, user_cv=1.0, user_cv_from="collect")
    with pytest.raises(EtudeError, match="user_cv_from must be"):
        CanarySection(mde=0.5, user_cv_from="pilot")
    canary = CanarySection(primary="tool_error_rate", primary_higher_is_better=False, mde=0.5,
                           user_cv_from="collect", underpowered="gate-only")
    cfg = LoopConfig(root=str(tmp_path / "root"), canary=canary, traffic=TrafficConfig(users=2000))
    store = open_store(cfg.db_url())
    t0 = time.time()
    _collect_window(store, cfg.org, [0, 1, 1, 2, 0, 3, 1, 0, 5, 1])  # noisy: a few users break a lot
    first = settle(cfg, store)  # at the cycle's start: no noise measured yet, so no users per arm
    assert first.mode == "ab" and first.users_per_arm is None and first.user_cv is None
    cv, users = collect_user_cv(window_rows(store, cfg, t0 - 1, time.time() + 1), cfg)
    assert users == 10 and cv is not None and cv > 0.5
    again = resettle(cfg, store, first, cv, users)
    assert again.mode == "ab" and again.user_cv == cv and again.users_per_arm == plan(0.5, cv).users_per_arm
    assert "measured on the collect window's 10 users" in again.source
    # a calmer window needs fewer users for the same effect
    calm = open_store(f"sqlite:///{tmp_path / 'calm.db'}")
    _collect_window(calm, cfg.org, [2, 2, 1, 2, 2, 3, 2, 2, 2, 2])
    cv_calm, _ = collect_user_cv(window_rows(calm, cfg, t0 - 1, time.time() + 1), cfg)
    assert cv_calm < cv and max(resettle(cfg, calm, first, cv_calm, 10).users_per_arm) < max(again.users_per_arm)
    # the registered plan carries the measured noise to the readout
    reg = registered_plan(cfg, again.to_dict(), "exp")
    assert reg["user_cv"] == cv and canary_of(reg, cfg).plan().users_per_arm == again.users_per_arm
    checked = dataclasses.replace(cfg, canary=dataclasses.replace(canary, aa_check_splits=200))
    assert canary_of(registered_plan(checked, again.to_dict(), "exp"), checked).plan().users_per_arm == again.users_per_arm
    # 40 users reach 20 an arm: short of the plan, so gate-only, saying what was measured
    small = dataclasses.replace(cfg, traffic=TrafficConfig(users=40))
    short = resettle(small, store, first, cv, users)
    assert short.mode == "gate-only" and f"user_cv {cv:g}" in short.line and "reaches about 20/20" in short.line
    with pytest.raises(EtudeError, match="reaches about 20/20"):
        resettle(dataclasses.replace(small, canary=dataclasses.replace(canary, underpowered="refuse")), store, first,
                 cv, users)
    # too few users to measure: nothing to plan again with
    empty = open_store(f"sqlite:///{tmp_path / 'empty.db'}")
    _collect_window(empty, cfg.org, [1])
    assert collect_user_cv(window_rows(empty, cfg, t0 - 1, time.time() + 1), cfg) == (None, 1)


def test_a_size_the_collect_windows_a_a_re_deals_reject_goes_gate_only(tmp_path: Path) -> None:
    """Issue 46 item 3: the always-valid test is asymptotic. On a window where a few users make
    all the errors, re-dealing production's own users into the planned arms promotes far more
    often than alpha (the pilot's window: 24 of 200); `aa_check_splits` measures that before the
    canary and declines to read a canary there. A calm window keeps its plan."""
    def checked(pattern: list, name: str):
        canary = CanarySection(primary="tool_error_rate", primary_higher_is_better=False, mde=0.95,
                               user_cv_from="collect", underpowered="gate-only", aa_check_splits=200)
        cfg = LoopConfig(root=str(tmp_path / name), canary=canary, traffic=TrafficConfig(users=len(pattern)))
        store = open_store(cfg.db_url())
        t0 = time.time()
        _collect_window(store, cfg.org, pattern)
        cv, users = collect_user_cv(window_rows(store, cfg, t0 - 1, time.time() + 1), cfg)
        p = CanaryPlan("ab", 0.95, "[canary] mde", (users // 2,) * 2, (users / 2,) * 2, "", cv)
        return cfg, p, aa_check(cfg, p, window_rows(store, cfg, t0 - 1, time.time() + 1), seed=1)

    with pytest.raises(EtudeError, match="needs user_cv_from"):
        CanarySection(mde=0.5, user_cv=1.0, aa_check_splits=200)
    hcfg, _, (heavy, rates) = checked([(0, 2)] * 12 + [(6, 7), (7, 6), (9, 12), (11, 13)], "heavy")
    assert rates["splits"] == 200 and rates["users"] == 16
    assert rates["false_promotion"]["ci95"][0] > 0.05 and heavy.mode == "gate-only"
    assert heavy.line.startswith("A/A re-deals of the collect window's 16 users promote ")
    assert "the readout is not valid at this size" in heavy.line
    cfg, p, (calm, rates) = checked([1, 2, 1, 1, 2, 1, 1, 3, 1, 2, 1, 1], "calm")
    assert calm == p and rates["false_promotion"]["ci95"][0] <= 0.05
    refuse = dataclasses.replace(hcfg, traffic=TrafficConfig(users=4000),
                                 canary=dataclasses.replace(hcfg.canary, underpowered="refuse"))
    rows = window_rows(open_store(refuse.db_url()), refuse, 0, time.time() + 1)
    with pytest.raises(EtudeError, match="not valid at this size"):  # under "refuse": one line
        aa_check(refuse, dataclasses.replace(heavy, mode="ab", line=""), rows, seed=1)


def test_a_canary_window_of_its_own_size_sends_the_collect_users_and_more(tmp_path: Path, monkeypatch) -> None:
    """`[canary] window_users`: scripted traffic sends that many users in a canary round (the plan's
    reach), the collect window's users first, while collection keeps `[traffic] users`."""
    sent: dict[str, list[str]] = {}
    monkeypatch.setattr(cycle, "run_population", lambda url, key, users, **kw: sent.setdefault(
        kw["round_key"].split(":")[1], [u.id for u in users]))
    cfg = LoopConfig(root=str(tmp_path), traffic=TrafficConfig(users=6, tasks="builtin:curriculum:train", max_tasks=4),
                     canary=CanarySection(window_users=10))
    assert cfg.canary_reach() == (5.0, 5.0)
    for phase in ("collect", "canary"):
        cycle.builtin_traffic(cycle.TrafficContext(phase, 0, cfg.org, cfg.db_url(), "k", tmp_path / "cycle-0001", cfg,
                                                   lambda: "http://x"))
    assert len(sent["collect"]) == 6 and len(sent["canary"]) == 10 and sent["canary"][:6] == sent["collect"]
