"""Fetching, mining, synthesis and validation on real PyPI packages, in the real sandbox."""

import shutil
import subprocess
import sys

import pytest

from etude.errors import EtudeError, NotFound
from etude.tasks.fetch import fetch_sdist

pytestmark = pytest.mark.usefixtures("task_cache")


def test_unknown_package_and_version_are_clear_errors():
    with pytest.raises(NotFound, match="unknown package on PyPI"):
        fetch_sdist("etude-no-such-package-zz9", "1.0")
    with pytest.raises(NotFound, match=r"unknown version tinydb==9\.9\.9 \(known: .*4\.9\.0"):
        fetch_sdist("tinydb", "9.9.9")


def test_pinned_sha256_mismatch_is_refused():
    with pytest.raises(EtudeError, match="pinned sha256"):
        fetch_sdist("isodate", "0.7.2", sha256="0" * 64)


def test_fetch_verifies_and_caches(task_cache):
    sd = fetch_sdist("isodate", "0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6")
    assert (sd.root / "src" / "isodate" / "__init__.py").is_file()
    assert sd.archive.parent.parent == task_cache / "sdists"
    again = fetch_sdist("isodate", "0.7.2")
    assert again.sha256 == sd.sha256 and again.root == sd.root


def test_package_without_tests_is_a_clear_error():
    from etude.tasks.synth import proto_task

    with pytest.raises(EtudeError, match="no tests found"):
        proto_task("tomli==2.5.0")  # its sdist ships no tests


def _invoke(*args):
    from typer.testing import CliRunner

    from etude.tasks.cli import tasks_app

    return CliRunner().invoke(tasks_app, list(args))


def test_cli_bad_inputs_are_etude_errors(tmp_path):
    out = str(tmp_path / "o.jsonl")
    cases = [
        (("synth", "--package", "tomli==2.5.0", "--out", out), "no tests found"),
        (
            ("mine", "--package", "tinydb", "--from", "4.8.2", "--to", "9.9.9", "--out", out),
            "unknown version tinydb==9.9.9",
        ),
        (("synth", "--package", "not-a-spec", "--out", out), "expected NAME==VERSION"),
        (("synth", "--out", out), "exactly one of --package"),
        (("validate", str(tmp_path / "missing.jsonl")), "task file not found"),
    ]
    for args, msg in cases:
        r = _invoke(*args)
        assert isinstance(r.exception, EtudeError) and msg in str(r.exception), (args, r.exception)


@pytest.mark.slow
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "etude.cli", "tasks", "synth", "--package", "tomli==2.5.0",
                        "--out", str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()] and "no tests found" in r.stderr


@pytest.mark.slow
def test_mine_tinydb_release_pair_splits_into_resolvable_tasks():
    from etude.envs import grade_patch
    from etude.tasks.mine import mine

    # max_trials=0: one trial per changed file, not per hunk, to keep the test short.
    tasks = mine("tinydb", "4.8.2", "4.9.0", max_trials=0)
    assert len(tasks) >= 2
    assert len({t.patch for t in tasks}) == len(tasks)  # each split has its own gold patch
    for t in tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and t.test_patch and t.strategy == "release-diff"
        assert t.base_commit.startswith("sdist:tinydb==4.8.2+") and t.source["to_version"] == "4.9.0"
        assert "diff --git" not in t.problem_statement and "tests/" in t.problem_statement
    narrow = min(tasks, key=lambda t: len(t.patch))
    gold = grade_patch(narrow, narrow.patch)
    assert gold.resolved and set(gold.fail_to_pass.values()) == {"passed"}
    base = grade_patch(narrow, "")
    assert not base.resolved and not base.partial
    assert all(s in ("failed", "error", "missing") for s in base.fail_to_pass.values())
    assert set(base.pass_to_pass.values()) == {"passed"}


@pytest.mark.slow
def test_synthesised_tasks_validate_and_are_distinct(isodate_tasks, tmp_path):
    from etude.tasks import diffs, prepare_repo
    from etude.tasks.validate import validate_task

    assert len(isodate_tasks) >= 2
    assert len({diffs.diff_hash(t.setup["base_patch"]) for t in isodate_tasks}) == len(isodate_tasks)
    t = isodate_tasks[0]
    assert t.strategy.startswith("synth:") and t.test_patch == "" and t.setup["base_patch"]
    # The template holds the bug; the gold patch turns it back into the released file.
    template = prepare_repo(t)
    original = (fetch_sdist("isodate", "0.7.2").root / t.meta["file"]).read_text()
    assert (template / t.meta["file"]).read_text() != original
    copy = tmp_path / "copy"
    shutil.copytree(template, copy)
    diffs.apply_patch(copy, t.patch)
    assert (copy / t.meta["file"]).read_text() == original
    v = validate_task(t, runs=2)
    assert v.kept, v.reason
    assert set(v.task.FAIL_TO_PASS) == set(t.FAIL_TO_PASS)
    assert set(t.PASS_TO_PASS) <= set(v.task.PASS_TO_PASS)


@pytest.mark.slow
def test_validation_drops_a_task_whose_gold_patch_fixes_nothing(isodate_tasks):
    import dataclasses

    from etude.tasks.validate import validate_task

    t = isodate_tasks[0]
    broken = dataclasses.replace(t, instance_id="no-fix", patch="")
    v = validate_task(broken, runs=2)
    assert not v.kept and v.reason == "no FAIL_TO_PASS test"


@pytest.mark.slow
def test_validate_command_keeps_good_tasks_and_reports_bad_lines(isodate_tasks, tmp_path):
    import json

    from typer.testing import CliRunner

    from etude.tasks import load_tasks, save_tasks
    from etude.tasks.cli import tasks_app

    f, out = tmp_path / "in.jsonl", tmp_path / "kept.jsonl"
    save_tasks(isodate_tasks[:1], f)
    f.write_text(f.read_text() + '{"instance_id": "truncated\n')
    r = CliRunner().invoke(tasks_app, ["validate", str(f), "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout[r.stdout.index("{") :])
    assert report["tasks"] == 1 and report["kept"] == 1 and len(report["bad_lines"]) == 1
    assert report["verdicts"][0]["fail_to_pass"] == len(isodate_tasks[0].FAIL_TO_PASS)
    assert [t.instance_id for t in load_tasks(out)] == [isodate_tasks[0].instance_id]
