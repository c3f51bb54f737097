"""Provenance's dirty flag: a changed source file makes the tree dirty; what the benchmarks
write under bench/results/ does not (a bench rewrites its plot before it takes provenance)."""

import shutil
import subprocess

import pytest

from etude import provenance as prov


@pytest.fixture
def repo(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "x.json").write_text("{}")
    (tmp_path / "code.py").write_text("a = 1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init")
    monkeypatch.setattr(prov, "ROOT", tmp_path)
    return tmp_path


def test_bench_results_never_make_the_tree_dirty(repo):
    assert prov.provenance()["git_dirty"] is False
    (repo / "bench" / "results" / "x.json").write_text('{"a": 1}')
    p = prov.provenance()
    assert p["git_dirty"] is False and "git_dirty_paths" not in p
    (repo / "code.py").write_text("a = 2\n")
    p = prov.provenance()
    assert p["git_dirty"] is True and p["git_dirty_paths"] == ["code.py"]
