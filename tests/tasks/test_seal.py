"""The sealed test split: training, selection and gating refuse test-split packages unless the
override is given, and the override marks the run contaminated."""

import json
import subprocess
import sys

import pytest

from etude.errors import EtudeError
from etude.tasks import save_tasks
from etude.tasks.seal import check_source, check_tasks, sealed_packages, task_package
from etude.types import Task


def _task(pkg: str) -> Task:
    return Task(instance_id=f"{pkg}-1", repo=pkg, base_commit="x", patch="", test_patch="", problem_statement="",
                source={"package": pkg, "version": "1"})


def test_the_sealed_packages_are_the_test_split():
    from etude.tasks.curriculum import members

    assert {m.spec.split("==")[0] for m in members("test")} <= sealed_packages()
    for split in ("train", "validation"):
        assert not {m.spec.split("==")[0] for m in members(split)} & sealed_packages()


@pytest.mark.parametrize("spec", ["builtin:test", "builtin:curriculum:test", "builtin:curriculum:test:2", "builtin:eval"])
def test_builtin_test_sources_are_refused(spec):
    with pytest.raises(EtudeError, match="sealed test split"):
        check_source(spec, "sft tasks")


@pytest.mark.parametrize("spec", ["builtin:train", "builtin:curriculum:validation", "builtin:validation", None])
def test_other_sources_pass(spec):
    assert check_source(spec, "x") is None


def test_a_file_with_one_test_package_task_is_refused(tmp_path):
    f = tmp_path / "mixed.jsonl"
    save_tasks([_task("tinydb"), _task("Itsdangerous")], f)
    assert task_package(_task("Itsdangerous")) == "itsdangerous"
    with pytest.raises(EtudeError, match="itsdangerous"):
        check_source(str(f), "env.tasks_file")
    rec = check_source(str(f), "env.tasks_file", allow=True)
    assert rec == {"contaminated": True, "where": "env.tasks_file", "packages": ["itsdangerous"]}
    assert check_tasks([_task("tinydb")], "x") is None


def _etude(*args, cwd):
    return subprocess.run([sys.executable, "-m", "etude.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_etude_sft_refuses_the_test_split_in_one_line(tmp_path):
    cfg = tmp_path / "sft.toml"
    cfg.write_text('model = "tiny"\ntasks = "builtin:test"\n')
    r = _etude("sft", "--config", str(cfg), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "sealed test split" in lines[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_etude_train_refuses_a_test_package_file_and_records_the_override(tmp_path):
    f = tmp_path / "t.jsonl"
    save_tasks([_task("parse")], f)
    cfg = tmp_path / "rl.toml"
    cfg.write_text(f'model = "tiny"\nsteps = 1\n[env]\nname = "tasks"\ntasks_file = "{f}"\n')
    r = _etude("train", "--config", str(cfg), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2 and "sealed test split" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()
    # with the override the seal lets it through, says so, and writes the record first thing
    r = _etude("train", "--config", str(cfg), "--out", str(tmp_path / "run"), "--allow-test-split", cwd=tmp_path)
    assert "marked contaminated" in r.stderr
    rec = json.loads((tmp_path / "run" / "contamination.json").read_text())
    assert rec["packages"] == ["parse"] and rec["contaminated"] is True


def test_the_loop_refuses_a_test_split_gate(tmp_path):
    import dataclasses

    from etude.loop import LoopConfig, run_cycle
    from etude.loop.config import EvalSection

    base = LoopConfig(root=str(tmp_path / "loop"))
    bad = dataclasses.replace(base, eval=EvalSection(suite="builtin:eval", max_tasks=30))
    with pytest.raises(EtudeError, match=r"\[eval\] suite"):
        run_cycle(bad)
    assert not (tmp_path / "loop").exists()
