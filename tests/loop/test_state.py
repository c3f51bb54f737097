"""Cycle bookkeeping: state.json survives a crash between writes, finished cycles are not
resumed, and a cycle whose window has no traffic ends with decision "skip" (real store)."""

from __future__ import annotations

import json
from pathlib import Path

from etude.loop import LoopConfig, TrafficContext, run_cycle
from etude.loop.cycle import next_cycle_dir
from etude.loop.state import STAGES, CycleState
from etude.store import open_store


def test_state_is_reloaded_as_written(tmp_path: Path) -> None:
    st = CycleState.load_or_create(tmp_path / "cycle-0001", 1, {"x": 1})
    st.start("collect")
    st.progress("collect", since=123.0)
    again = CycleState.load_or_create(tmp_path / "cycle-0001", 1, {"x": 2})  # as after a kill -9
    assert again.status("collect") == "running" and again.stage("collect")["attempts"] == 1
    assert again.stage("collect")["outputs"]["since"] == 123.0 and again.data["config"] == {"x": 1}
    again.start("collect")
    again.finish("collect", interactions=3)
    s = CycleState.load_or_create(tmp_path / "cycle-0001", 1, {}).stage("collect")
    assert (s["status"], s["attempts"], s["outputs"]) == ("done", 2, {"since": 123.0, "interactions": 3})
    assert not list((tmp_path / "cycle-0001").glob("*.tmp"))


def test_next_cycle_dir_resumes_unfinished_then_moves_on(tmp_path: Path) -> None:
    assert next_cycle_dir(tmp_path).name == "cycle-0001"
    st = CycleState.load_or_create(tmp_path / "cycle-0001", 1, {})
    assert next_cycle_dir(tmp_path).name == "cycle-0001"
    st.data["finished"] = True
    st.save()
    assert next_cycle_dir(tmp_path).name == "cycle-0002"


def test_cycle_without_traffic_is_skipped_and_not_rerun(tmp_path: Path) -> None:
    calls: list[tuple[str, int]] = []
    keys: list[str] = []

    def no_traffic(ctx: TrafficContext) -> None:
        calls.append((ctx.phase, ctx.round))
        keys.append(ctx.api_key)
        assert open_store(ctx.db).authenticate(ctx.api_key) == "acme"  # a working key during the run

    cfg = LoopConfig(root=str(tmp_path / "root"), org="acme", model="tiny")
    rep = run_cycle(cfg, traffic=no_traffic, progress=False).to_dict()
    assert calls == [("collect", 0)]
    assert rep["decision"] == "skip" and rep["distill"]["samples"] == 0
    assert [rep["stages"][s]["status"] for s in STAGES] == ["done", "done"] + ["skipped"] * 5 + ["done"]
    assert rep["production_after"] == {"name": "tiny", "version": 0}
    saved = json.loads((tmp_path / "root" / "cycle-0001" / "report.json").read_text())
    assert saved["decision"] == "skip"
    assert open_store(cfg.db_url()).authenticate(keys[0]) is None  # revoked when the run ended
    rep2 = run_cycle(cfg, traffic=no_traffic, progress=False)
    assert rep2.cycle == 2 and Path(rep2.cycle_dir).name == "cycle-0002"


def test_resume_at_decide_promotes_and_stops_the_experiment(tmp_path: Path) -> None:
    """A cycle killed after its readout resumes at decide only: the planned promotion is
    applied to the real registry (candidate production, old production retired, experiment
    stopped) and no earlier stage runs again (the traffic hook would fail if called)."""
    from etude.serve import registry

    cfg = LoopConfig(root=str(tmp_path / "root"), org="acme", model="tiny", name="t")
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    registry.register_checkpoint(store, "t-c0001", str(tmp_path / "ckpt"), version=1, parent="tiny")
    registry.set_experiment(store, "t-canary-c0001", [("control", "tiny", 0.5), ("canary", "t-c0001", 0.5)], org="acme")
    st = CycleState.load_or_create(tmp_path / "root" / "cycle-0001", 1, cfg.to_dict())
    st.data["production"] = {"name": "tiny", "path": "tiny", "version": 0}
    for name in STAGES[:-1]:
        st.start(name)
        st.finish(name)
    st.progress("register", checkpoint={"name": "t-c0001", "path": str(tmp_path / "ckpt"), "version": 1})
    st.progress("canary", experiment="t-canary-c0001")
    st.progress("decide", planned="promote", planned_reason="significantly better (test)")

    def must_not_run(ctx: TrafficContext) -> None:
        raise AssertionError("a finished stage ran again")

    rep = run_cycle(cfg, traffic=must_not_run, progress=False).to_dict()
    assert rep["cycle"] == 1 and rep["decision"] == "promote"
    assert rep["production_after"] == {"name": "t-c0001", "version": 1}
    assert registry.get_checkpoint(store, "tiny").state == "retired"
    assert registry.get_experiment(store, "t-canary-c0001").status == "stopped"
    assert all(rep["stages"][s]["attempts"] == 1 for s in STAGES)


def test_failed_eval_gate_registers_then_rolls_back_without_canary(tmp_path: Path) -> None:
    """Resumed after eval with a failed gate: the candidate is registered (for the record),
    canary and readout are skipped, and decide retires it; production is untouched."""
    from etude.serve import registry

    cfg = LoopConfig(root=str(tmp_path / "root"), org="acme", model="tiny", name="t")
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    st = CycleState.load_or_create(tmp_path / "root" / "cycle-0001", 1, cfg.to_dict())
    st.data["production"] = {"name": "tiny", "path": "tiny", "version": 0}
    for name in ("collect", "distill", "train", "eval"):
        st.start(name)
        st.finish(name)
    st.progress("train", checkpoint=str(tmp_path / "ckpt"))
    st.progress("eval", verdict={"gate_passed": False, "regressions": ["resolved"]})

    rep = run_cycle(cfg, traffic=lambda ctx: (_ for _ in ()).throw(AssertionError("traffic")), progress=False).to_dict()
    assert [rep["stages"][s]["status"] for s in ("register", "canary", "readout", "decide")] == \
        ["done", "skipped", "skipped", "done"]
    assert rep["decision"] == "rollback" and "eval gate failed: resolved" in rep["reason"]
    assert registry.get_checkpoint(store, "t-c0001").state == "retired"
    assert rep["production_after"] == {"name": "tiny", "version": 0}
