"""prepare_repo from many threads at once on an empty cache.

Regression: two threads fetching the same sdist unpacked into one temporary directory and one of
them crashed (FileNotFoundError); templates used a per-pid temporary name, which threads share.
"""

from concurrent.futures import ThreadPoolExecutor

from etude.tasks import prepare_repo
from etude.tasks.diffs import file_diff
from etude.types import Task


def _task(i: int, patch: str) -> Task:
    setup = {"sdist": {"package": "isodate", "version": "0.7.2"}, "base_patch": patch}
    return Task(f"t{i}", "pypi/isodate", "b", "", "", "s", setup=setup)


def test_threads_share_one_fetch_and_build_distinct_templates(tmp_path, monkeypatch):
    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path / "cache"))
    marker = file_diff("src/isodate/ETUDE_MARKER.py", None, ["x = 1\n"])
    tasks = [_task(i, "" if i % 2 else marker) for i in range(6)]
    with ThreadPoolExecutor(6) as ex:
        dirs = list(ex.map(prepare_repo, tasks))
    assert len(set(dirs)) == 2
    for t, d in zip(tasks, dirs, strict=True):
        assert (d / ".git").is_dir() and (d / "src" / "isodate" / "__init__.py").is_file()
        assert (d / "src" / "isodate" / "ETUDE_MARKER.py").is_file() == bool(t.setup["base_patch"])
    leftovers = [p.name for p in (tmp_path / "cache" / "repos").iterdir() if ".tmp" in p.name]
    assert leftovers == []
