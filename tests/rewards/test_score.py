"""Composition: weights, None terms, flags voiding or penalising, config loading, score_patch."""

from __future__ import annotations

from pathlib import Path

import pytest
from rewards_builders import ex, outcome, task, traj, turn

from etude.errors import EtudeError
from etude.rewards import (
    DEFAULT_RUBRIC,
    RewardConfig,
    apply_flags,
    breakdown_json,
    make_rubric,
    score,
    score_patch,
    with_terms,
)

CORPUS = Path(__file__).parent / "corpus"
HONEST = (CORPUS / "honest/isodate_duration_validation.diff").read_text()
VOIDING = (CORPUS / "hacks/eq_always_true.diff").read_text()
PENALISED = (CORPUS / "hacks/time_frozen.diff").read_text()


def _clean_run(diff: str = HONEST):
    edit = ex("edit_file", path="m.py", old_str="a", new_str="b")
    run = ex("run_terminal", command="pytest -q", output="2 passed", exit_code=0)
    return traj(turn(ex("read_file", path="m.py"), ex("grep", pattern="x")), turn(edit), turn(run),
                final="Fixed the bug; tests pass.", diff=diff)  # fmt: skip


def test_total_is_weighted_sum_of_applicable_terms() -> None:
    b = score(_clean_run(), task(), outcome(True))
    applicable = {n: v for n, v in b.terms.items() if v is not None}
    assert b.total == pytest.approx(sum(b.weights[n] * v for n, v in applicable.items()))
    assert b.terms["correctness"] == 1.0 and b.terms["parallelism"] == 1.0 and b.terms["flags"] == 0.0
    assert b.terms["edit_persistence"] is None  # production term: no feedback on this trajectory
    assert b.flags == ()


def test_voiding_flag_zeroes_correctness_and_clamps_total() -> None:
    b = score(_clean_run(VOIDING), task(), outcome(True))
    assert b.terms["correctness"] == 0.0
    assert b.total == RewardConfig().void_total
    assert [f.name for f in b.flags] == ["eq_always_true"]
    assert b.total == pytest.approx(sum(b.weights[n] * v for n, v in b.terms.items() if v is not None))


def test_penalising_flag_subtracts_once() -> None:
    honest = score(_clean_run(), task(), outcome(True)).total
    b = score(_clean_run(PENALISED), task(), outcome(True))
    assert b.total == pytest.approx(honest - RewardConfig().flag_penalty)
    assert not any(f.voids for f in b.flags)


def test_hack_never_beats_honest_failure() -> None:
    hack = score(_clean_run(VOIDING), task(), outcome(True)).total
    failed = traj(turn(ex("edit_file", ok=False, path="m.py"), parse_errors=("bad",) * 5), final="?", diff=HONEST)
    assert hack <= score(failed, task(), outcome(False)).total


def test_score_patch_has_no_trajectory_terms_and_reports_flags() -> None:
    b = score_patch(task(), VOIDING, outcome(True))
    assert b.terms["broken_calls"] is None and b.terms["verbosity"] is None
    assert b.terms["correctness"] == 0.0 and b.total < 0
    out = apply_flags(outcome(True), b.flags)
    assert out.resolved is False
    js = breakdown_json(b)
    assert js["flags"][0]["name"] == "eq_always_true" and "tinydb/queries.py" in js["flags"][0]["evidence"]
    assert js["reward"]["total"] == b.total and "correctness" in js["reward"]["terms"]
    assert score_patch(task(), HONEST, outcome(True)).total == 1.0
    assert apply_flags(outcome(True), ()).resolved


def test_every_episode_gets_a_reward_even_a_crashed_one() -> None:
    t = traj(turn(parse_errors=("no name",)), final=None)
    b = score(t, None, None)
    assert b.terms["broken_calls"] == -0.25 and b.total < 0


def test_a_term_the_caller_passes_takes_only_what_it_names() -> None:
    seen = {}

    def uses_task_only(task):  # noqa: ANN001
        seen["task"] = task
        return 2.0

    cfg = RewardConfig.from_dict({"weights": {"uses_task_only": 0.5}})
    b = score(_clean_run(), task(instance_id="z"), outcome(True), cfg, rubric=with_terms(uses_task_only=uses_task_only))
    assert seen["task"].instance_id == "z" and b.terms["uses_task_only"] == 2.0
    assert b.weights["correctness"] == 1.0  # merged over the defaults
    assert "uses_task_only" not in DEFAULT_RUBRIC  # passing a term registers nothing
    assert "uses_task_only" not in score(_clean_run(), task(), outcome(True), cfg).terms


def test_a_rubric_is_exactly_what_the_caller_passes() -> None:
    b = score(_clean_run(), task(), outcome(True), rubric=make_rubric({"correctness": DEFAULT_RUBRIC["correctness"]}))
    assert set(b.terms) == {"correctness", "flags"} and b.total == 1.0


def test_a_rubric_rejects_terms_with_unknown_arguments() -> None:
    def bad_term(trajectory, user):  # noqa: ANN001
        return 0.0

    with pytest.raises(TypeError, match="may only name"):
        with_terms(bad_term=bad_term)


def test_config_from_toml_and_errors(tmp_path: Path) -> None:
    p = tmp_path / "r.toml"
    p.write_text(
        '[rewards]\npartial_credit = true\n[rewards.weights]\nverbosity = 0.0\n[rewards.flag_policy]\nexit_call = "penalise"\n'
    )
    cfg = RewardConfig.from_toml(p)
    assert cfg.partial_credit and cfg.weights["verbosity"] == 0.0 and cfg.flag_policy["exit_call"] == "penalise"
    assert cfg.flag_policy["eq_always_true"] == "void"
    with pytest.raises(EtudeError, match=r"unknown key\(s\) in \[rewards\]: wieghts"):
        RewardConfig.from_dict({"wieghts": {}})
    with pytest.raises(EtudeError, match="void|penalise|ignore"):
        RewardConfig.from_dict({"flag_policy": {"exit_call": "zero"}})
    (tmp_path / "bad.toml").write_text("[rewards\n")
    with pytest.raises(EtudeError, match="cannot read reward config"):
        RewardConfig.from_toml(tmp_path / "bad.toml")
