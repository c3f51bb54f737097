"""Mining tasks from a git repository's history (`etude tasks mine --repo`), on a small repository
the test builds itself, end to end in the sandbox; and rebuilding a mined task from its cached
snapshot once that repository is gone."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.task_fixtures import _cache_env

CORE = """def add(a, b):
    return a + b


def absval(x):
    return x
"""

CORE_FIXED = CORE.replace("    return x\n", "    return -x if x < 0 else x\n")
CORE_REFACTORED = CORE_FIXED.replace("    return a + b\n", '    """The sum."""\n    total = a + b\n    return total\n')

TESTS = """from mypkg.core import absval, add


def test_add():
    assert add(2, 3) == 5


def test_absval_positive():
    assert absval(4) == 4
"""

TESTS_FIX = (
    TESTS
    + """

def test_absval_negative():
    assert absval(-3) == 3
"""
)

TESTS_PASS_BEFORE = (
    TESTS_FIX
    + """

def test_add_negative():
    assert add(-2, -3) == -5
"""
)

SUB = """

def sub(a, b):
    return a + b
"""

TESTS_BROKEN = (
    TESTS_PASS_BEFORE
    + """

def test_sub():
    from mypkg.core import sub

    assert sub(3, 1) == 2
"""
)

FIX_MESSAGE = "Fix absval for negative numbers\n\nabsval(-3) returned -3 instead of 3 (reported in #12)."


def _git(root, *args, date="2024-05-01T12:00:00+00:00"):
    env = dict(os.environ, GIT_AUTHOR_NAME="A", GIT_AUTHOR_EMAIL="a@example.com", GIT_COMMITTER_NAME="A",
               GIT_COMMITTER_EMAIL="a@example.com", GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)  # fmt: skip
    return subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True, text=True).stdout


def _commit(root, files, message, date):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message, date=date)
    return _git(root, "rev-parse", "HEAD").strip()


def make_repo(root):
    """root commit; a fix (kept); docs only; a refactor whose new test passes before it; a feature
    whose test fails after it; tests and docs without source; a merge of a docs-only branch."""
    root.mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main")
    history = [
        ("root", {"mypkg/__init__.py": "", "mypkg/core.py": CORE, "tests/test_x.py": TESTS, "README.md": "# mypkg\n"},
         "Initial import"),
        ("fix", {"mypkg/core.py": CORE_FIXED, "tests/test_x.py": TESTS_FIX}, FIX_MESSAGE),
        ("docs", {"README.md": "# mypkg\n\nAdds and takes absolute values.\n"}, "Describe mypkg"),
        ("pass_before", {"mypkg/core.py": CORE_REFACTORED, "tests/test_x.py": TESTS_PASS_BEFORE},
         "Refactor add and test negatives"),
        ("fails_after", {"mypkg/core.py": CORE_REFACTORED + SUB, "tests/test_x.py": TESTS_BROKEN}, "Add sub"),
        ("tests_only", {"tests/test_x.py": TESTS_BROKEN + "# more later\n", "README.md": "# mypkg!\n"},
         "Note in tests"),
    ]  # fmt: skip
    shas = {name: _commit(root, files, msg, f"2024-05-0{i + 1}T12:00:00+00:00")
            for i, (name, files, msg) in enumerate(history)}  # fmt: skip
    _git(root, "checkout", "-q", "-b", "side", shas["docs"])
    _commit(root, {"docs/usage.md": "Call add.\n"}, "Usage notes", "2024-05-08T12:00:00+00:00")
    _git(root, "checkout", "-q", "main")
    _git(root, "merge", "-q", "--no-ff", "-m", "Merge side", "side", date="2024-05-09T12:00:00+00:00")
    shas["merge"] = _git(root, "rev-parse", "HEAD").strip()
    return shas


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "etude.cli", "tasks", "mine", *map(str, args)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip


@pytest.fixture(scope="module")
def mined(tmp_path_factory, task_cache_dir):
    """The repository mined once through the CLI: (repo dir, commit shas, tasks, stdout, stderr)."""
    from etude.tasks import load_tasks

    d = tmp_path_factory.mktemp("history")
    repo, out = d / "mypkg-repo", d / "tasks.jsonl"
    shas = make_repo(repo)
    with _cache_env(task_cache_dir):
        r = _cli("--repo", repo, "--out", out)
    assert r.returncode == 0, r.stderr
    return repo, shas, load_tasks(out), json.loads(r.stdout), r.stderr


@pytest.mark.slow
def test_fix_commit_is_kept_with_its_message_and_split_diff(mined):
    _repo, shas, tasks, report, _err = mined
    assert [t.instance_id for t in tasks] == [f"mypkg-repo__{shas['fix'][:12]}"]
    t = tasks[0]
    assert t.problem_statement == FIX_MESSAGE  # the maintainers' words, never the diff
    assert t.base_commit == shas["root"] and t.strategy == "history"
    assert t.created_at == "2024-05-02T12:00:00+00:00"
    assert t.FAIL_TO_PASS == ("tests/test_x.py::test_absval_negative",)
    assert set(t.PASS_TO_PASS) == {"tests/test_x.py::test_add", "tests/test_x.py::test_absval_positive"}
    assert "a/mypkg/core.py" in t.patch and "tests/" not in t.patch
    assert "b/tests/test_x.py" in t.test_patch and "mypkg/core.py" not in t.test_patch
    assert report["tasks"] == 1


@pytest.mark.slow
def test_skips_are_counted_by_reason_in_one_summary_line(mined):
    _repo, _shas, _tasks, report, err = mined
    assert report["skipped"] == {"merge": 1, "docs-only": 2, "no-source-change": 1, "tests-fail-after": 1,
                                 "tests-pass-before": 1, "root-commit": 1}  # fmt: skip
    last = err.strip().splitlines()[-1]
    assert last.startswith("etude tasks mine: scanned 8 commit(s), kept 1; skipped: docs-only 2, merge 1")
    assert "tests-pass-before 1" in last and "tests-fail-after 1" in last


@pytest.mark.slow
def test_only_the_kept_tasks_snapshots_stay_in_the_cache(mined):
    from etude.tasks.snapshot import archive_dir

    tasks = mined[2]
    assert {p.name for p in archive_dir().glob("*.tar.gz")} == {f"{t.setup['archive']['sha256']}.tar.gz" for t in tasks}


@pytest.mark.slow
def test_a_mined_task_rebuilds_and_grades_from_its_snapshot_without_the_repository(mined):
    from etude.envs import grade_patch
    from etude.tasks.repo import prepare_repo, template_dir

    repo, _shas, tasks, _report, _err = mined
    t = tasks[0]
    shutil.rmtree(repo)
    shutil.rmtree(template_dir(t))
    base = prepare_repo(t)
    assert (base / "mypkg" / "core.py").read_text() == CORE  # the parent's tree
    assert (base / "tests" / "test_x.py").read_text() == TESTS
    assert grade_patch(t, t.patch).resolved
    assert not grade_patch(t, "").resolved


def test_a_missing_snapshot_is_one_clear_error(tmp_path):
    from etude.errors import EtudeError
    from etude.tasks.repo import prepare_repo
    from etude.types import Task

    t = Task("x__1", "local/x", "0" * 40, "", "", "", setup={"archive": {"sha256": "f" * 64, "commit": "0" * 40}})
    with pytest.raises(EtudeError, match="base archive ffffffffffff is not in"):
        prepare_repo(t)


def test_bad_input_is_one_clear_error(tmp_path):
    from etude.errors import EtudeError
    from etude.tasks.history import HistoryConfig, mine_history

    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(EtudeError, match="not a git repository"):
        mine_history(plain)
    repo = tmp_path / "r"
    shas = make_repo(repo)
    with pytest.raises(EtudeError, match="'nope' names no commit"):
        mine_history(repo, HistoryConfig(since="nope"))
    with pytest.raises(EtudeError, match="names no commit"):
        mine_history(repo, HistoryConfig(since="HEAD"))  # an empty range
    with pytest.raises(EtudeError, match=r"nothing could be mined .*kept 0; skipped: docs-only 1"):
        mine_history(repo, HistoryConfig(since=shas["fix"], until=shas["docs"]))
    with pytest.raises(EtudeError, match="not a git repository"):
        mine_history(repo / "mypkg")  # inside a repository, not its top level


@pytest.mark.slow
def test_cli_on_a_path_that_is_not_a_repository_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "o.jsonl"
    r = _cli("--repo", tmp_path, "--out", out)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], r.stderr
    assert "not a git repository" in r.stderr and not out.exists()


@pytest.mark.slow
def test_specialise_adds_a_local_repositorys_mined_history_to_its_tasks(tmp_path, task_cache_dir):
    """`etude specialise --repos PATH` takes the tasks mined from PATH's commits beside the
    mutations of its code (etude.pipeline.specialise.history_tasks); a PyPI spec has no history."""
    from etude.pipeline.specialise import history_tasks
    from etude.pipeline.split import touched_functions

    repo = tmp_path / "mypkg-repo"
    shas = make_repo(repo)
    with _cache_env(task_cache_dir):
        tasks, note = history_tasks(str(repo), 5)
    assert [t.instance_id for t in tasks] == [f"mypkg-repo__{shas['fix'][:12]}"]
    assert tasks[0].problem_statement == FIX_MESSAGE and tasks[0].strategy == "history"
    assert "kept 1" in note
    with _cache_env(task_cache_dir):  # the split reads its functions from the snapshot
        assert touched_functions(tasks[0]) == {"mypkg/core.py::absval"}
    assert history_tasks("click==8.1.7", 5) == ([], "")
    assert history_tasks(str(repo), 0) == ([], "")
