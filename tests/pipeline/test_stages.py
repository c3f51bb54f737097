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


def test_verified_edits_redo_the_specialisations_evaluations_only(tmp_path):
    """`etude specialise --verify-edits K` on a finished run: its four evaluations run again, the
    training stages are read back; without the flag (None) a run from before the field resumes."""
    import dataclasses

    from etude.pipeline.specialise import EPISODE_USES, SPLIT_USES, SpecialiseConfig, sft_inputs

    calls: list[str] = []

    def pipeline(cfg):
        st = Stages(tmp_path, dataclasses.asdict(cfg))
        for name, uses in (("sft", sft_inputs(cfg)), ("eval", SPLIT_USES + EPISODE_USES)):
            st.run(name, lambda n=name: (calls.append(n), n)[::-1], uses=uses)

    old = SpecialiseConfig(org="acme", repos=("x==1",), out=str(tmp_path))
    pipeline(old)
    state = json.loads((tmp_path / "state.json").read_text())
    for st in state["stages"].values():  # a run from before the field: its inputs lack it
        st["inputs"].pop("verify_edits", None)
    (tmp_path / "state.json").write_text(json.dumps(state))
    calls.clear()
    pipeline(old)
    assert calls == []
    pipeline(dataclasses.replace(old, verify_edits=8))
    assert calls == ["eval"]
