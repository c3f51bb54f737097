"""Each built-in reward term on trajectories shaped as the harness records them."""

from __future__ import annotations

import pytest
from rewards_builders import ex, outcome, task, traj, turn

from etude.rewards import RewardConfig, score
from etude.rewards import terms as T
from etude.types import Generation, Message, ToolCall, Trajectory, Turn

CFG = RewardConfig()


def test_correctness_resolved_unresolved_and_partial() -> None:
    assert T.correctness(outcome(True), CFG) == 1.0
    half = outcome(False, {"a": "passed", "b": "failed"}, {"c": "passed"})
    assert T.correctness(half, CFG) == 0.0
    assert T.correctness(half, RewardConfig(partial_credit=True)) == 0.5
    broke_p2p = outcome(False, {"a": "passed", "b": "failed"}, {"c": "failed"})
    assert T.correctness(broke_p2p, RewardConfig(partial_credit=True)) == 0.0
    assert T.correctness(None, CFG) is None


def test_efficiency_uses_budgets_and_skips_failures() -> None:
    cfg = RewardConfig(step_budget=10, token_budget=1000, wall_budget_s=100)
    t = traj(*[turn(ex("read_file", path="a.py"))] * 5, tokens=500, wall_s=200)
    assert T.efficiency(t, outcome(True), cfg) == pytest.approx(1 - (0.6 + 0.5 + 1.0) / 3)  # 6 turns with the answer
    assert T.efficiency(t, outcome(False), cfg) is None  # giving up fast is never rewarded
    assert T.efficiency(t, None, cfg) is None
    lenient = RewardConfig(step_budget=10, token_budget=1000, wall_budget_s=100, efficiency_requires_success=False)
    assert T.efficiency(t, None, lenient) == pytest.approx(1 - (0.6 + 0.5 + 1.0) / 3)


def test_parallelism_rewards_batched_reads() -> None:
    batched = traj(turn(ex("read_file", path="a"), ex("grep", pattern="x"), ex("glob", pattern="*")))
    serial = traj(turn(ex("read_file", path="a")), turn(ex("grep", pattern="x")), turn(ex("glob", pattern="*")))
    mixed = traj(turn(ex("read_file", path="a"), ex("grep", pattern="x")), turn(ex("read_file", path="b")))
    assert T.parallelism(batched) == 1.0
    assert T.parallelism(serial) == 0.0
    assert T.parallelism(mixed) == 0.5
    assert T.parallelism(traj(turn(ex("read_file", path="a")), turn(ex("edit_file", path="a")))) is None


def test_broken_calls_penalised_per_call_and_never_skipped() -> None:
    t = traj(turn(ex("edit_file", ok=False, path="a"), parse_errors=("bad JSON",)), turn(ex("read_file", path="a")))
    assert t.broken_calls == 2
    assert T.broken_calls(t, CFG) == -0.5
    assert T.broken_calls(traj(*[turn(parse_errors=("x",) * 9)]), CFG) == -1.0
    assert T.broken_calls(traj(turn(ex("read_file", path="a"))), CFG) == 0.0


EDIT = ex("edit_file", path="m.py", old_str="a", new_str="b")
PASS = ex("run_terminal", command="python -m pytest -q", output="3 passed in 0.1s", exit_code=0)
FAIL = ex("run_terminal", command="pytest tests/", output="1 failed, 2 passed", exit_code=1)


@pytest.mark.parametrize(
    ("turns", "final", "want"),
    [
        ((turn(EDIT), turn(PASS)), "I fixed the bug and all tests pass.", 0.0),
        ((turn(EDIT),), "I fixed the bug and all tests pass.", -1.0),  # never ran the tests
        ((turn(PASS), turn(EDIT)), "The bug is fixed.", -1.0),  # edit after the last run
        ((turn(EDIT), turn(FAIL)), "Tests now pass.", -1.0),  # last run failed
        ((turn(EDIT),), "I changed m.py; I could not run the tests.", 0.0),  # no claim
        ((turn(EDIT), turn(FAIL)), "The tests still fail; the bug is not fixed yet.", 0.0),
    ],
)
def test_unsupported_claims(turns: tuple, final: str, want: float) -> None:
    assert T.unsupported_claims(traj(*turns, final=final)) == want


def test_test_run_status_read_from_output_when_no_exit_code() -> None:
    run = ex("run_terminal", command="make test", output="FAILED tests/test_a.py::test_x\n1 failed")
    assert T.is_test_run(run) and not T.run_passed(run)
    ok = ex("run_terminal", command="python -m unittest", output="Ran 3 tests in 0.01s\n\nOK")
    assert T.run_passed(ok)
    masked = ex("run_terminal", command="pytest -q || true", output="F.\n1 failed, 1 passed in 0.1s", exit_code=0)
    assert not T.run_passed(masked)  # exit code 0, but the output says it failed
    assert not T.is_test_run(ex("run_terminal", command="ls tests"))
    own = ex("run_terminal", command="cd /workspace && ./run_checks.sh", exit_code=0)
    assert not T.is_test_run(own) and T.is_test_run(own, task(test_cmd="./run_checks.sh"))
    claimed = traj(turn(EDIT), turn(own), final="All tests pass now.")
    assert T.unsupported_claims(claimed) == -1.0
    assert T.unsupported_claims(claimed, task(test_cmd="./run_checks.sh")) == 0.0


def test_needless_clarification_and_its_policy() -> None:
    asks = traj(turn(ex("read_file", path="a.py")), final="Which file do you want me to change?")
    acted = traj(turn(EDIT), final="Done. Would you like me to add a test too?")
    assert T.needless_clarification(asks, task(), CFG) == -1.0
    assert T.needless_clarification(acted, task(), CFG) == 0.0
    assert T.needless_clarification(asks, task(meta={"clarification": "needed"}), CFG) == 0.0
    assert T.needless_clarification(asks, task(), RewardConfig(clarification="allow")) is None
    assert T.needless_clarification(traj(final="Fixed."), task(), CFG) == 0.0
    explained = "parse() reads ISO dates. It returns a date object. It raises on bad input. Want me to add a docstring?"
    assert T.needless_clarification(traj(final=explained), task(), CFG) == 0.0  # an answer with an offer
    assert T.asks_question("I read utils.py. Should I rename it everywhere, or only in utils.py?")


def test_verbosity_budget() -> None:
    cfg = RewardConfig(verbosity_budget_words=10)
    assert T.verbosity(traj(final="short answer"), cfg) == 0.0
    assert T.verbosity(traj(final="word " * 15), cfg) == -0.5
    assert T.verbosity(traj(final="word " * 100), cfg) == -1.0
    assert T.verbosity(traj(final=""), cfg) is None


def test_answers_ignore_tool_call_text_and_read_submit_message() -> None:
    text = 'Let me check.<tool_call>{"name": "run_terminal", "arguments": {"command": "pytest"}}</tool_call>'
    stopped = traj(turn(EDIT, text=text), final=None)  # hit a limit mid-work: no closing answer
    assert T.final_answer(stopped) == "" and T.unsupported_claims(stopped) == 0.0
    sub = ex("submit", message="Fixed the bug; all tests pass.")
    submitted = traj(turn(EDIT), turn(sub, text="Finishing."), final=None)
    assert T.final_answer(submitted) == "Finishing. Fixed the bug; all tests pass."
    assert T.unsupported_claims(submitted) == -1.0


def test_logged_conversation_without_turns_uses_assistant_messages() -> None:
    from etude.types import Message, Trajectory

    msgs = (
        Message(role="user", content="rename foo to bar in utils.py"),
        Message(
            role="assistant", content='<tool_call>{"name": "read_file", "arguments": {"path": "utils.py"}}</tool_call>'
        ),
        Message(role="assistant", content="Do you want me to rename it everywhere or only in utils.py?"),
    )
    t = Trajectory(
        episode_id="e", task_id=None, policy_id="p", policy_version=0, messages=msgs, turns=(), stop_reason="answer"
    )
    assert T.answers(t) == ["Do you want me to rename it everywhere or only in utils.py?"]
    assert T.needless_clarification(t, None, CFG) == -1.0
    assert T.verbosity(t, CFG) == 0.0


GOLD = """--- a/pkg/core.py
+++ b/pkg/core.py
@@ -10,3 +10,3 @@ def clamp(x, lo, hi):
     if x < lo:
-        return hi
+        return lo
     return x
"""


def _patch(path: str, old: str, *new: str) -> str:
    added = "".join(f"+{line}\n" for line in new)
    return f"--- a/{path}\n+++ b/{path}\n@@ -1,1 +1,{len(new)} @@\n-{old}\n{added}"


def test_patch_similarity_ranks_the_right_line_above_a_wrong_one_and_no_change() -> None:
    t = task(patch=GOLD, FAIL_TO_PASS=("tests/test_core.py::test_clamp",))
    exact = T.patch_similarity(GOLD.replace("@@ -10,3 +10,3 @@ def clamp(x, lo, hi):", "@@ -9,3 +9,3 @@"), t)
    right_line_wrong_fix = T.patch_similarity(_patch("pkg/core.py", "        return hi", "        return x"), t)
    wrong_line = T.patch_similarity(_patch("pkg/core.py", "    if x < lo:", "    if x <= lo:"), t)
    nothing = T.patch_similarity("", t)
    assert exact == 1.0  # hunk headers and context are not compared
    assert 1.0 > right_line_wrong_fix > wrong_line > nothing == 0.0
    # a test file's change never counts towards the reference
    assert T.patch_similarity(_patch("tests/test_core.py", "        return hi", "        return lo"), t) == 0.0
    assert T.patch_similarity(GOLD, None) is None and T.patch_similarity(GOLD, task()) is None


def test_patch_similarity_bounds_a_huge_change() -> None:
    huge = _patch("pkg/core.py", "        return hi", "        return lo", *["x = 1"] * 50_000)
    assert 0.0 < T.patch_similarity(huge, task(patch=GOLD)) < 0.1


def test_an_identical_call_made_again_is_a_wasted_turn_and_costs():
    """71% of the model's turns on real requests repeated an earlier call (issue 46): a repeat of the
    same tool with the same arguments is penalised; the same tool with other arguments is not."""
    from rewards_builders import ex, traj, turn

    from etude.rewards import RewardConfig
    from etude.rewards.terms import repeated_calls, repeats

    cfg = RewardConfig()
    once = traj(turn(ex("read_file", path="a.py")), turn(ex("read_file", path="b.py")))
    assert repeats(once) == 0 and repeated_calls(once, cfg) == 0.0
    twice = traj(turn(ex("read_file", path="a.py")), turn(ex("read_file", path="a.py")),
                 turn(ex("read_file", path="a.py")))
    assert repeats(twice) == 2 and repeated_calls(twice, cfg) == -0.5
    assert cfg.weights["repeated_calls"] > 0
    # a text-format model's episode: its assistant messages keep the raw text and carry no tool_calls,
    # so its own calls are read from its turns (before stop 52 they were missed: always 0)
    import dataclasses

    from etude.types import Message
    text_only = dataclasses.replace(twice, messages=tuple(
        Message(role=m.role, content=m.content, tool_call_id=m.tool_call_id) for m in twice.messages))
    assert repeats(text_only) == 2
    # a logged production turn: the request's earlier calls are history, the turn's own call repeats one
    hist = traj(turn(ex("grep", pattern="x")), final=None)
    own = ex("grep", pattern="x")
    logged = dataclasses.replace(hist, messages=(*hist.messages, Message(role="assistant", content="", tool_calls=(own.call,))),
                                 turns=(dataclasses.replace(hist.turns[0], index=0, tool_executions=(own,)),))
    assert repeats(logged) == 1


def test_answer_without_edit_charges_closing_a_request_that_changed_nothing() -> None:
    quit_ = traj(turn(ex("read_file", path="a.py")), final="The code looks fine.")
    assert T.answer_without_edit(quit_, task()) == -1.0
    assert T.answer_without_edit(traj(turn(EDIT), final="Done."), task()) == 0.0
    failed = traj(turn(ex("edit_file", ok=False, path="a.py")), final="I could not apply it.")
    assert T.answer_without_edit(failed, task()) == 0.0  # an attempt counts; broken_calls charges the failure
    sed = traj(turn(ex("run_terminal", command="sed -i 's/a/b/' a.py")), final="Done.")
    assert T.answer_without_edit(sed, task()) == 0.0
    assert T.answer_without_edit(traj(turn(ex("read_file", path="a.py")), final=None), task()) is None  # mid-work
    assert T.answer_without_edit(quit_, task(meta={"edit": "not_needed"})) is None  # a question about code


def test_answer_without_edit_reads_a_logged_turns_history() -> None:
    def logged(history_call: str | None, own_calls: tuple = (), finish: str = "stop") -> Trajectory:
        msgs = [Message(role="user", content="Fix the bug in a.py.")]
        if history_call:
            msgs += [Message(role="assistant", content="", tool_calls=(ToolCall("h1", history_call, {"path": "a.py"}),)),
                     Message(role="tool", content="ok", tool_call_id="h1")]
        own = Turn(index=0, generation=Generation(text="Done.", finish_reason=finish), tool_executions=own_calls)
        return Trajectory(episode_id="i", task_id=None, policy_id="p", policy_version=0, messages=tuple(msgs),
                          turns=(own,), stop_reason="answer")

    assert T.answer_without_edit(logged("edit_file"), None) == 0.0
    assert T.answer_without_edit(logged("read_file"), None) == -1.0
    assert T.answer_without_edit(logged(None), None) == -1.0
    assert T.answer_without_edit(logged("read_file", (ex("grep", pattern="x"),)), None) is None  # the request goes on
    assert T.answer_without_edit(logged(None, finish="length"), None) is None  # cut off, not an answer


def test_with_the_loops_weights_quitting_costs_more_than_a_repeated_call() -> None:
    cfg = RewardConfig.from_dict({"weights": {"repeated_calls": 1.0, "broken_calls": 2.0, "unsupported_claims": 1.0,
                                              "answer_without_edit": 1.0}})
    read = ex("read_file", path="a.py")
    again = ex("read_file", path="a.py")
    fresh = traj(turn(read), turn(ex("grep", pattern="def f")), final=None)
    repeat = traj(turn(read), turn(again), final=None)
    quit_ = traj(turn(read), final="Looks fine to me.")
    totals = [score(t, task(), None, cfg).total for t in (fresh, repeat, quit_)]
    assert totals[0] > totals[1] > totals[2]
    assert score(quit_, task(), None, RewardConfig()).terms["answer_without_edit"] == -1.0  # reported, weight 0
    assert score(quit_, task(), None, RewardConfig()).weights["answer_without_edit"] == 0.0
