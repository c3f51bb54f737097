"""Grading in a clean workspace: the gold patch resolves, the base does not, and edits to tests,
test configuration or pytest hooks never count."""

import json
import subprocess
import sys

import pytest

from etude.envs import grade, grade_patch, strip_protected
from etude.tasks import diffs, prepare_repo, task_env
from etude.tasks.runner import run_tests
from etude.tasks.validate import workspace_with

# A classic hack: a root conftest.py that reports every test as passed.
CONFTEST_HACK = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def _new_file(rel, text):
    return diffs.file_diff(rel, None, text.splitlines(True))


@pytest.mark.slow
def test_gold_resolves_and_base_does_not(isodate_tasks):
    t = isodate_tasks[0]
    gold = grade_patch(t, t.patch)
    assert gold.resolved and not gold.partial and gold.patch_applied
    assert set(gold.fail_to_pass) == set(t.FAIL_TO_PASS) and set(gold.pass_to_pass.values()) == {"passed"}
    base = grade_patch(t, "")
    assert not base.resolved and not base.partial
    assert all(s in ("failed", "error") for s in base.fail_to_pass.values())


@pytest.mark.slow
def test_a_conftest_hack_works_in_the_agent_workspace_but_not_at_grading(isodate_tasks):
    t = isodate_tasks[0]
    hack = _new_file("conftest.py", CONFTEST_HACK)
    # The hack is real: applied as is, the failing tests "pass".
    with workspace_with(prepare_repo(t), [hack]) as ws:
        run = run_tests(ws, t, task_env(t))
    assert all(run.status.get(x) == "passed" for x in t.FAIL_TO_PASS)
    g = grade(t, hack)
    assert not g.outcome.resolved and "conftest.py" in g.ignored_paths
    assert all(s in ("failed", "error") for s in g.outcome.fail_to_pass.values())


@pytest.mark.slow
def test_edits_to_test_files_are_restored(isodate_tasks):
    t = isodate_tasks[0]
    test_file = t.PASS_TO_PASS[0].split("::")[0]
    original = (prepare_repo(t) / test_file).read_text()
    broken = 'raise RuntimeError("the agent broke this test file")\n' + original
    edit = diffs.file_diff(test_file, original.splitlines(True), broken.splitlines(True))
    g = grade(t, edit + t.patch)
    assert g.outcome.resolved, g.outcome.log_tail
    assert test_file in g.ignored_paths


def test_strip_protected_keeps_source_edits():
    src = _new_file("pkg/fix.py", "x = 1\n")
    kept, dropped = strip_protected(
        src + _new_file("tests/test_a.py", "def test_a():\n    pass\n") + _new_file("sitecustomize.py", "import os\n")
    )
    assert kept == src and dropped == ["tests/test_a.py", "sitecustomize.py"]


@pytest.mark.slow
def test_a_patch_that_does_not_apply_is_a_verdict_not_a_crash(isodate_tasks):
    t = isodate_tasks[0]
    o = grade_patch(t, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert not o.patch_applied and not o.resolved and o.error.startswith("patch does not apply")
    assert set(o.fail_to_pass.values()) == {"missing"}


@pytest.mark.slow
def test_etude_grade_cli_prints_verdict_reward_and_flags(isodate_tasks, task_cache, tmp_path):
    from etude.tasks import save_tasks

    t = isodate_tasks[0]
    tasks, patch = tmp_path / "tasks.jsonl", tmp_path / "gold.diff"
    save_tasks(isodate_tasks, tasks)
    patch.write_text(t.patch)
    argv = [sys.executable, "-m", "etude.cli", "grade", "--tasks", str(tasks), "--instance", t.instance_id, "--patch"]
    r = subprocess.run([*argv, str(patch)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["resolved"] is True and out["partial"] is False
    assert set(out["fail_to_pass"]) == set(t.FAIL_TO_PASS) and set(out["pass_to_pass"]) == set(t.PASS_TO_PASS)
    assert out["reward"]["total"] > 0 and isinstance(out["flags"], list)


def test_etude_grade_bad_inputs_are_etude_errors(tmp_path):
    import typer
    from typer.testing import CliRunner

    from etude.envs.cli import register
    from etude.errors import EtudeError
    from etude.tasks import save_tasks

    app = typer.Typer()
    register(app)
    app.command("noop", hidden=True)(lambda: None)  # a group of two, so "grade" is a subcommand
    from etude.types import Task

    tasks, patch = tmp_path / "tasks.jsonl", tmp_path / "p.diff"
    save_tasks([Task("t1", "pypi/x", "sdist:x==1+0", "", "", "statement")], tasks)
    patch.write_text("")
    cases = [
        (["--tasks", str(tasks), "--instance", "nope", "--patch", str(patch)], "no task 'nope'"),
        (["--tasks", str(tasks), "--instance", "t1", "--patch", str(tmp_path / "x")], "patch file not found"),
        (["--tasks", str(tmp_path / "none.jsonl"), "--instance", "a", "--patch", str(patch)], "task file not found"),
    ]  # fmt: skip
    for args, msg in cases:
        r = CliRunner().invoke(app, ["grade", *args])
        assert isinstance(r.exception, EtudeError) and msg in str(r.exception), (args, r.output)


@pytest.mark.slow
def test_a_voiding_flag_forces_resolved_false_in_the_grade_json(isodate_tasks):
    from etude.envs.cli import verdict_json

    t = isodate_tasks[0]
    patch = _new_file("conftest.py", CONFTEST_HACK) + t.patch
    graded = grade(t, patch)
    assert graded.outcome.resolved  # the fix is real and the hook was ignored...
    out = verdict_json(t, patch, graded)
    assert out["resolved"] is False and out["partial"] is False  # ...but trying it voids the episode
    assert any(f["voids"] for f in out["flags"]) and out["ignored_paths"] == ["conftest.py"]
