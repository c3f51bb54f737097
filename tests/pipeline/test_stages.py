"""Resumable stages: a rerun under another config redoes only the stages the change reaches."""

from __future__ import annotations

import json

from etude.pipeline.stages import Stages


def _pipeline(out, cfg, calls):
    st = Stages(out, cfg)

    def stage(name):
        def fn():
            calls.append(name)
            return {"n": len(calls)}, name
        return fn

    st.run("tasks", stage("tasks"), uses=("repos",))
    st.run("train", stage("train"), uses=("repos", "minutes"), after=("tasks",))
    st.run("eval base", stage("eval base"), uses=("repos", "base"), after=("tasks",))
    st.run("eval adapter", stage("eval adapter"), uses=("repos",), after=("tasks", "train"))
    st.run("whole", stage("whole"))  # no `uses`: the whole config
    return st


def test_same_config_resumes_every_stage(tmp_path):
    calls: list[str] = []
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    assert len(calls) == 5
    calls.clear()
    st = _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    assert calls == []
    assert all(r.resumed for r in st.records)


def test_a_larger_budget_redoes_training_and_what_reads_it_only(tmp_path):
    calls: list[str] = []
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    calls.clear()
    _pipeline(tmp_path, {"repos": "a", "minutes": 20, "base": "m"}, calls)
    assert calls == ["train", "eval adapter", "whole"]
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["stages"]["train"]["inputs"] == {"repos": "a", "minutes": 20}
    assert state["config"]["minutes"] == 20
    # and back: the stages finished under minutes=20 are now the stale ones
    calls.clear()
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    assert calls == ["train", "eval adapter", "whole"]


def test_an_upstream_change_reaches_every_stage_after_it(tmp_path):
    calls: list[str] = []
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    calls.clear()
    _pipeline(tmp_path, {"repos": "b", "minutes": 10, "base": "m"}, calls)
    assert calls == ["tasks", "train", "eval base", "eval adapter", "whole"]


def test_a_new_unset_field_changes_nothing(tmp_path):
    calls: list[str] = []
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m"}, calls)
    calls.clear()
    _pipeline(tmp_path, {"repos": "a", "minutes": 10, "base": "m", "extra": None}, calls)
    assert calls == []


def test_state_from_before_inputs_were_kept_uses_its_run_config(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({
        "config": {"repos": "a", "minutes": 10, "base": "m"},
        "stages": {n: {"summary": n, "seconds": 1.0, "result": {}, "finished": 0}
                   for n in ("tasks", "train", "eval base", "eval adapter", "whole")}}))
    calls: list[str] = []
    _pipeline(tmp_path, {"repos": "a", "minutes": 30, "base": "m"}, calls)
    assert calls == ["train", "eval adapter", "whole"]
