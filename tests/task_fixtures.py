"""Fixtures for tests that fetch real sdists from PyPI and run their tests in the sandbox.

They share one cache directory per pytest session (sdists, templates, the test venv), so each
package is downloaded and each venv built once. ETUDE_CACHE points there only while a test of
this folder runs (autouse, function scope): other components' tests keep their own caches.
tests/tasks/conftest.py and tests/envs/conftest.py both import them from here.
"""

import os
from contextlib import contextmanager

import pytest

ISODATE = "isodate==0.7.2"


@pytest.fixture(scope="session")
def task_cache_dir(tmp_path_factory):
    d = tmp_path_factory.getbasetemp() / "etude-task-cache"
    d.mkdir(exist_ok=True)
    return d


@contextmanager
def _cache_env(d):
    old = os.environ.get("ETUDE_CACHE")
    os.environ["ETUDE_CACHE"] = str(d)
    try:
        yield d
    finally:
        if old is None:
            os.environ.pop("ETUDE_CACHE", None)
        else:
            os.environ["ETUDE_CACHE"] = old


@pytest.fixture(autouse=True)
def task_cache(task_cache_dir):
    with _cache_env(task_cache_dir) as d:
        yield d


@pytest.fixture(scope="session")
def isodate_tasks(task_cache_dir):
    """A few validated synthetic tasks on isodate (its suite runs in well under a second)."""
    from etude.tasks import load_tasks, save_tasks
    from etude.tasks.synth import SynthConfig, synthesise

    f = task_cache_dir / "isodate-synth.jsonl"
    if f.is_file():
        return load_tasks(f)
    with _cache_env(task_cache_dir):
        tasks = synthesise(ISODATE, cfg=SynthConfig(max_tasks=4, seed=3, max_candidates=16))
    save_tasks(tasks, f)
    return tasks
