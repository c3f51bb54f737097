"""Synthesis on a local repository (`etude tasks synth --repo DIR`), end to end in the sandbox."""

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("task_cache")]

LIB = """def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(xs):
    s = 0
    for x in xs:
        s = s + x
    return s
"""

TESTS = """from mini.core import clamp, total


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_clamp_high():
    assert clamp(50, 0, 10) == 10


def test_clamp_mid():
    assert clamp(5, 0, 10) == 5


def test_total():
    assert total([1, 2, 3]) == 6


def test_total_empty():
    assert total([]) == 0
"""


@pytest.fixture
def mini_repo(tmp_path):
    root = tmp_path / "mini-project"
    (root / "mini").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "mini" / "__init__.py").write_text("")
    (root / "mini" / "core.py").write_text(LIB)
    (root / "tests" / "test_core.py").write_text(TESTS)
    return root


def test_synth_on_a_local_repo_makes_graded_tasks(mini_repo):
    from etude.envs import grade_patch
    from etude.tasks.synth import SynthConfig, synthesise

    stats: dict = {}
    tasks = synthesise(repo=mini_repo, cfg=SynthConfig(max_tasks=3, seed=1), stats=stats)
    assert 1 <= len(tasks) <= 3
    assert sum(stats["kept"].values()) == len(tasks) <= sum(stats["tried"].values())
    for t in tasks:
        assert t.setup["repo_dir"] == str(mini_repo.resolve()) and t.setup["base_patch"].startswith(
            "diff --git a/mini/"
        )
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS
        assert not set(t.FAIL_TO_PASS) & set(t.PASS_TO_PASS)
    t = tasks[0]
    assert grade_patch(t, t.patch).resolved
    assert not grade_patch(t, "").resolved
    assert (mini_repo / "mini" / "core.py").read_text() == LIB  # the user's directory is never touched
