"""Fixtures for the evaluation tests: real isodate tasks (fetched from PyPI, validated in the
sandbox), shared per pytest session.

task_cache / isodate_tasks are the same as in tests/envs and tests/tasks (conftests are per
folder), with the same file name and parameters, so a session that runs several folders
synthesises the tasks once.
"""

import os

import pytest

ISODATE = "isodate==0.7.2"
ISODATE_SHA256 = "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6"


@pytest.fixture(scope="session")
def task_cache(tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "etude-task-cache"
    d.mkdir(exist_ok=True)
    old = os.environ.get("ETUDE_CACHE")
    os.environ["ETUDE_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("ETUDE_CACHE", None)
    else:
        os.environ["ETUDE_CACHE"] = old


@pytest.fixture(scope="session")
def isodate_tasks(task_cache):
    """A few validated synthetic tasks on isodate (its suite runs in well under a second)."""
    from etude.tasks import load_tasks, save_tasks
    from etude.tasks.synth import SynthConfig, synthesise

    f = task_cache / "isodate-synth.jsonl"
    if f.is_file():
        return load_tasks(f)
    tasks = synthesise(ISODATE, cfg=SynthConfig(max_tasks=4, seed=3, max_candidates=16))
    save_tasks(tasks, f)
    return tasks


@pytest.fixture(scope="session")
def isodate_template(task_cache):
    """The real isodate 0.7.2 repository at base (an unpacked, pinned sdist) and a task on it
    whose gold patch the adherence tests set themselves."""
    from etude.tasks import prepare_repo
    from etude.types import Task

    task = Task(
        instance_id="isodate__adherence", repo="pypi/isodate", base_commit="sdist:isodate==0.7.2", patch="",
        test_patch="", problem_statement="(adherence tests)",
        setup={"sdist": {"package": "isodate", "version": "0.7.2", "sha256": ISODATE_SHA256}, "pythonpath": "src"},
    )  # fmt: skip
    return prepare_repo(task)
