"""An episode end to end: fresh workspace, the real harness and tools, a scripted policy, grading."""

import json

import pytest

from etude.envs import run_episode

pytestmark = pytest.mark.slow


def _one_line_fix(task):
    minus = [ln[1:] for ln in task.patch.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:] for ln in task.patch.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    return (minus[0], plus[0]) if len(minus) == 1 and len(plus) == 1 else None


def _call(name, **args):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_scripted_agent_fixing_the_bug_is_resolved(isodate_tasks):
    from etude.harness import HarnessConfig
    from etude.policy.scripted import ScriptedPolicy

    task = next(t for t in isodate_tasks if _one_line_fix(t))
    old, new = _one_line_fix(task)
    path = task.meta["file"]
    policy = ScriptedPolicy([_call("read_file", path=path), _call("edit_file", path=path, old_str=old, new_str=new)])
    traj, outcome = run_episode(task, policy, HarnessConfig(max_steps=5))
    assert outcome.resolved, outcome.log_tail
    assert traj.task_id == task.instance_id and path in traj.diff
    assert traj.meta["outcome"]["resolved"] is True
    # The agent saw the problem statement, not the fix.
    first_user = next(m.content for m in policy.seen[0] if m.role == "user")
    assert task.problem_statement.splitlines()[0] in first_user and new.strip() not in first_user


def test_scripted_agent_that_only_edits_tests_is_not_resolved(isodate_tasks):
    from etude.harness import HarnessConfig
    from etude.policy.scripted import ScriptedPolicy

    task = isodate_tasks[0]
    test_file = task.FAIL_TO_PASS[0].split("::")[0]
    policy = ScriptedPolicy([_call("write_file", path=test_file, content="def test_nothing():\n    pass\n")])
    traj, outcome = run_episode(task, policy, HarnessConfig(max_steps=3))
    assert test_file in traj.diff  # the agent did change the test file...
    assert not outcome.resolved  # ...and it did not count
    assert traj.meta["ignored_paths"] == [test_file]


def test_a_command_asking_past_the_tasks_timeout_gets_the_cap_and_is_told(isodate_tasks):
    """Regression (issue 16): the episode capped the sandbox at the task's timeout, but
    run_terminal passed the model's own `timeout_s` (up to 600 s) and the session sandbox
    honoured it, so a model that asked for 600 s got 600 s."""
    import dataclasses

    from etude.harness import HarnessConfig
    from etude.policy.scripted import ScriptedPolicy

    task = dataclasses.replace(isodate_tasks[0], timeout_s=2.0)
    policy = ScriptedPolicy([_call("run_terminal", command="sleep 30", timeout_s=600)])
    traj, _ = run_episode(task, policy, HarnessConfig(max_steps=2))
    res = traj.turns[0].tool_executions[0].result
    assert not res.ok and res.meta["timed_out"] and res.meta["timeout_s"] == 2.0 and res.meta["timeout_capped"]
    assert res.output.startswith("[timeout_s 600 is above this episode's limit: capped at 2 s]")
    assert res.meta["wall_s"] < 20


def test_the_agents_terminal_is_80_columns_while_grading_keeps_300(isodate_tasks):
    """Regression: the agent's commands ran with the grader's COLUMNS=300, so pytest's separator
    lines filled about half of a clipped test-run observation with '=' and spaces."""
    from etude.harness import HarnessConfig
    from etude.policy.scripted import ScriptedPolicy
    from etude.tasks.runner import task_sandbox_config

    task = isodate_tasks[0]
    policy = ScriptedPolicy([_call("run_terminal", command="python -c 'import os; print(os.environ[\"COLUMNS\"])'"),
                             _call("run_terminal", command=f"python -m pytest -o addopts= -q {task.FAIL_TO_PASS[0]}")])
    traj, _ = run_episode(task, policy, HarnessConfig(max_steps=2))
    width, tests = (t.tool_executions[0].result.output for t in traj.turns)
    assert width.splitlines()[0] == "80"
    assert "FAILURES" in tests and max(len(ln) for ln in tests.splitlines()) <= 200
    assert task_sandbox_config(task, traj.meta.get("venv", "/nonexistent")).env["COLUMNS"] == "300"
