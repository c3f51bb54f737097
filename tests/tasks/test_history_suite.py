"""`builtin:history`: the committed manifest, the time split, and a task whose base is rebuilt
offline from the cached clone. Fast and without the network: the tasks here are installed from a
small repository the test builds itself (tests.tasks.test_history.make_repo), nothing runs in the
sandbox."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.tasks.test_history import CORE, TESTS, make_repo

ALLOWED = {"MIT", "BSD-2-Clause", "BSD-3-Clause", "Apache-2.0"}


def test_the_committed_manifest_names_permissive_repositories_outside_every_split():
    from etude.tasks.curriculum import BUILTIN
    from etude.tasks.fetch import normalise
    from etude.tasks.history_suite import in_window, load_manifest
    from etude.tasks.suite import PACKAGES

    repos = load_manifest()
    in_splits = {normalise(m.spec.split("==")[0]) for m in BUILTIN} | {normalise(p.name) for p in PACKAGES}
    assert repos, "the manifest lists no repository"
    for r in repos:
        assert r.licence in ALLOWED and r.url.startswith("https://github.com/"), r
        assert normalise(r.name) not in in_splits, f"{r.name} is in a built-in split"
        assert len(r.until) == 40 and r.tasks
        for e in r.tasks:
            assert e.instance_id == f"{r.name}__{e.commit[:12]}" and len(e.commit) == 40
            assert in_window(e.created_at, None, None)  # a parseable date
    ids = [e.instance_id for r in repos for e in r.tasks]
    assert len(ids) == len(set(ids))


def _task(repo: Path, sha: str, parent: str, created: str):
    from etude.tasks.snapshot import export_commit, store_tree
    from etude.types import Task

    with tempfile.TemporaryDirectory() as d:
        arc, _ = store_tree(export_commit(repo, parent, Path(d) / "t"))
    return Task(f"mypkg-repo__{sha[:12]}", "local/mypkg-repo", parent, "", "", "a message", created_at=created,
                strategy="history", setup={"archive": {"sha256": arc, "commit": parent}, "base_patch": ""},
                meta={"commit": sha})  # fmt: skip


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A two-task manifest over the test's own repository, installed in the (per-test) cache:
    (manifest path, repo dir, commit shas, HistoryRepo)."""
    from etude.tasks.history_suite import HistoryEntry, HistoryRepo, install, write_manifest

    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    repo = src / "mypkg-repo"
    shas = make_repo(repo)
    tasks = [
        _task(repo, shas["fix"], shas["root"], "2024-05-02T12:00:00+00:00"),
        _task(repo, shas["pass_before"], shas["docs"], "2024-05-04T23:30:00-02:00"),
    ]  # 05-05 01:30 UTC
    entries = tuple(HistoryEntry(t.instance_id, t.meta["commit"], t.created_at) for t in tasks)
    h = HistoryRepo("mypkg-repo", "https://github.com/example/mypkg-repo", "MIT", "LICENSE", shas["root"],
                    shas["merge"], entries)  # fmt: skip
    manifest = tmp_path / "manifest.json"
    write_manifest([h], manifest)
    install(h, tasks, repo)
    return manifest, repo, shas, h


def test_builtin_history_resolves_and_loads_every_listed_task(installed, monkeypatch):
    from etude.evals import runner
    from etude.tasks import history_suite

    manifest, _repo, shas, h = installed
    monkeypatch.setattr(history_suite, "MANIFEST", manifest)
    tasks = runner.resolve_suite("builtin:history", use="final")
    assert [t.instance_id for t in tasks] == [e.instance_id for e in h.tasks]
    assert {t.repo for t in tasks} == {"example/mypkg-repo"}
    assert tasks[0].source["licence"] == "MIT"
    from etude.envs.tasks_env import load_task_spec  # what `etude train`'s tasks_file goes through

    assert [t.meta["commit"] for t in load_task_spec("builtin:history:before=2024-05-03", use="train")] == [shas["fix"]]


def test_the_time_split_filters_by_commit_date_and_rejects_bad_dates(installed):
    from etude.errors import EtudeError
    from etude.tasks.history_suite import builtin_history

    manifest, _repo, shas, _h = installed
    ids = lambda spec: [t.meta["commit"] for t in builtin_history(spec, manifest=manifest)]  # noqa: E731
    assert ids("builtin:history:before=2024-05-03") == [shas["fix"]]
    assert ids("builtin:history:after=2024-05-03") == [shas["pass_before"]]
    assert ids("builtin:history:before=2024-05-05") == [shas["fix"]]  # 01:30 UTC on the 5th is not before it
    assert ids("builtin:history:after=2024-05-02:before=2024-05-06") == [shas["fix"], shas["pass_before"]]
    assert ids("builtin:history:after=2025-01-01") == []
    for bad, why in [("before=2024-13-01", "is not a date"), ("before=yesterday", "is not a date"),
                     ("after=2024-5-1", "is not a date"), ("since=2024-01-01", "unknown filter"),
                     ("after=2024-06-01:before=2024-01-01", "must be earlier"),
                     ("before=2024-01-01:before=2024-02-01", "given twice")]:  # fmt: skip
        with pytest.raises(EtudeError, match=why) as e:
            builtin_history(f"builtin:history:{bad}", manifest=manifest)
        assert "\n" not in str(e.value)


def test_a_bad_date_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "etude.cli", "eval", "--suite", "builtin:history:before=2024-02-30",
                        "--model", "fake", "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and "before='2024-02-30' is not a date" in r.stderr


def test_a_missing_base_is_rebuilt_offline_from_the_cached_clone(installed, monkeypatch):
    """The source repository is gone and the snapshot deleted: the cached clone rebuilds it."""
    import shutil

    from etude.tasks.history_suite import SOURCES_ENV, builtin_history
    from etude.tasks.repo import prepare_repo
    from etude.tasks.snapshot import archive_path

    manifest, repo, _shas, _h = installed
    shutil.rmtree(repo)
    monkeypatch.setenv(SOURCES_ENV, str(repo.parent / "nowhere"))  # no source, no network
    first = builtin_history(manifest=manifest)[0]
    archive_path(first.setup["archive"]["sha256"]).unlink()
    again = builtin_history(manifest=manifest)[0]
    base = prepare_repo(again)
    assert (base / "mypkg" / "core.py").read_text() == CORE  # the parent's tree
    assert (base / "tests" / "test_x.py").read_text() == TESTS


def test_a_repository_that_cannot_be_cloned_is_one_clear_error(tmp_path, monkeypatch):
    from etude.errors import EtudeError
    from etude.tasks.history_suite import SOURCES_ENV, HistoryEntry, HistoryRepo, builtin_history, write_manifest

    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(SOURCES_ENV, str(tmp_path))
    h = HistoryRepo("absent", "https://github.com/example/absent", "MIT", "LICENSE", "a" * 40, "b" * 40,
                    (HistoryEntry("absent__bbbbbbbbbbbb", "b" * 40, "2024-01-01T00:00:00+00:00"),))  # fmt: skip
    write_manifest([h], tmp_path / "m.json")
    with pytest.raises(EtudeError, match="holds no repository absent/"):
        builtin_history(manifest=tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["repos"][0]["name"] == "absent"


def test_tasks_built_on_first_use_go_by_the_manifest_names(tmp_path, monkeypatch):
    """On a machine without the installed build, builtin:history mines each listed commit from its
    cached clone, whose folder is named `repo`: the miner names such a task `repo__<sha>`, and the
    suite must still list it under the manifest's name (it listed none: 0 of more-itertools' 14)."""
    import dataclasses

    from etude.tasks import history_suite
    from etude.tasks.history_suite import HistoryEntry, HistoryRepo, builtin_history, repo_cache, write_manifest

    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "src" / "mypkg-repo"
    shas = make_repo(repo)
    made = {sha: _task(repo, sha, parent, created)
            for sha, parent, created in [(shas["fix"], shas["root"], "2024-05-02T12:00:00+00:00"),
                                         (shas["pass_before"], shas["docs"], "2024-05-04T12:00:00+00:00")]}  # fmt: skip
    entries = tuple(HistoryEntry(t.instance_id, t.meta["commit"], t.created_at) for t in made.values())
    h = HistoryRepo("mypkg-repo", "https://github.com/example/mypkg-repo", "MIT", "LICENSE", shas["root"],
                    shas["merge"], entries)  # fmt: skip
    manifest = tmp_path / "manifest.json"
    write_manifest([h], manifest)
    monkeypatch.setenv(history_suite.SOURCES_ENV, str(repo.parent))

    def mine(clone, cfg, progress=None):  # what etude.tasks.history names a task mined from `clone`
        t = made[cfg.until]
        return [dataclasses.replace(t, instance_id=f"{clone.name}__{cfg.until[:12]}")], None

    monkeypatch.setattr(history_suite, "mine_history", mine)
    first = builtin_history(manifest=manifest)
    assert [t.instance_id for t in first] == [e.instance_id for e in entries]
    # a cache that an earlier build wrote under the clone's name is read back under the manifest's
    cached = repo_cache("mypkg-repo") / "tasks.jsonl"
    text = cached.read_text()
    for e in entries:
        text = text.replace(e.instance_id, f"repo__{e.commit[:12]}")
    cached.write_text(text)
    assert [t.instance_id for t in builtin_history(manifest=manifest)] == [e.instance_id for e in entries]
