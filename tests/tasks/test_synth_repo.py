"""Synthesis on a local repository (`etude tasks synth --repo DIR`), end to end in the sandbox."""

import shutil
from pathlib import Path

import pytest

import etude

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("task_cache")]

# The example organisation's library (etude/data/org_example: a package and its tests), the
# repository `etude demo` and `etude specialise` start from.
ORG_EXAMPLE = Path(etude.__file__).resolve().parent / "data" / "org_example"
LIB = (ORG_EXAMPLE / "mini" / "core.py").read_text()


@pytest.fixture
def mini_repo(tmp_path):
    root = tmp_path / "mini-project"
    for part in ("mini", "tests"):
        shutil.copytree(ORG_EXAMPLE / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
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


def test_parallel_validation_keeps_the_tasks_one_at_a_time_keeps(mini_repo):
    from etude.tasks.synth import SynthConfig, synthesise

    runs = {}
    for workers in (1, 3):
        stats: dict = {}
        cfg = SynthConfig(max_tasks=4, seed=2, combine_fraction=0.5, workers=workers)
        runs[workers] = ([t.to_dict() for t in synthesise(repo=mini_repo, cfg=cfg, stats=stats)], stats)
    assert len(runs[1][0]) == 4 and runs[3][0] == runs[1][0]
    assert runs[3][1] == runs[1][1]  # mutants run in vain past the last one used are not counted


def test_a_run_that_stops_early_keeps_a_prefix_of_the_whole_run(mini_repo):
    from etude.tasks.synth import SynthConfig, synthesise

    cfg = SynthConfig(max_tasks=4, seed=2, combine_fraction=0.0)
    whole = [t.instance_id for t in synthesise(repo=mini_repo, cfg=cfg)]
    seen = []
    part = [t.instance_id for t in synthesise(repo=mini_repo, cfg=cfg, enough=lambda t: seen.append(t) or len(seen) >= 2)]
    assert len(whole) == 4 and part == whole[:2]
