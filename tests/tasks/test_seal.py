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
    from etude.tasks.suite import PACKAGES

    assert {m.spec.split("==")[0] for m in members("test")} == sealed_packages()
    assert {p.name for p in PACKAGES if p.split == "eval"} <= sealed_packages()
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


# -- the seal at the loaders (evidence round two, item 1): every door a review found, refused


@pytest.mark.parametrize("spec", ["builtin:all", "builtin:", "builtin:eval", "builtin:test", "builtin:curriculum:test",
                                  "builtin:curriculum:test:2"])
@pytest.mark.parametrize("use", ["train", "select", "gate"])
def test_every_builtin_spelling_of_the_test_split_is_refused_by_the_loaders_before_building(spec, use, monkeypatch):
    from etude.envs.tasks_env import load_task_spec
    from etude.evals.runner import resolve_suite
    from etude.tasks import curriculum, suite

    def no_build(*a, **k):
        raise AssertionError("a sealed split was built before it was refused")

    monkeypatch.setattr(suite, "package_tasks", no_build)
    monkeypatch.setattr(curriculum, "package_curriculum", no_build)
    with pytest.raises(EtudeError, match="sealed test split"):
        resolve_suite(spec, 3, use=use)
    with pytest.raises(EtudeError, match="sealed test split"):
        load_task_spec(spec, 3, use=use)


def test_builtin_all_and_builtin_bare_are_refused_by_check_source():
    for spec in ("builtin:all", "builtin:", "builtin:curriculum:"):
        with pytest.raises(EtudeError, match="sealed test split"):
            check_source(spec, "x")
    assert check_source("builtin:history", "x") is None


def test_a_task_file_with_one_sealed_task_is_refused_for_training_selection_and_gating_but_read_for_a_final_figure(
        tmp_path):
    from etude.envs.sources import load_task_source
    from etude.envs.tasks_env import load_task_spec
    from etude.evals.runner import resolve_suite

    f = tmp_path / "mixed.jsonl"
    save_tasks([_task("tinydb"), _task("idna")], f)
    for use in ("train", "select", "gate"):
        for load in (resolve_suite, load_task_spec, load_task_source):
            with pytest.raises(EtudeError, match="idna"):
                load(str(f), use=use)
    assert len(resolve_suite(str(f), use="final")) == 2
    with pytest.raises(ValueError, match="use must be"):
        resolve_suite(str(f), use="evaluate")


def test_the_tasks_env_default_evaluates_on_the_validation_split_never_the_sealed_one(monkeypatch):
    """`etude train` with the tasks env and no tasks_file evaluated (and alarmed) on
    builtin_suite("eval"), the sealed packages."""
    from etude.envs import tasks_env

    calls = []
    monkeypatch.setattr(tasks_env, "builtin_curriculum", lambda split, level, **k: calls.append((split, k["use"])) or [])
    monkeypatch.setattr(tasks_env, "builtin_suite", lambda split, n, **k: calls.append((split, k["use"])) or [])
    env = tasks_env.TasksEnv(num_train=2, num_test=2)
    env.problems("train")
    env.problems("test")
    assert calls == [("train", "train"), ("validation", "select")]


def _git_repo(root, files):
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    return root


@pytest.mark.parametrize("files", [
    {"pyproject.toml": '[project]\nname = "Parse"\nversion = "1"\n', "fork.py": ""},  # distribution name
    {"src/itsdangerous/__init__.py": "", "README": ""},  # import package under src/
    {"inflection.py": "", "setup.py": "from setuptools import setup\nsetup(name='x')\n"},  # a single-module package
])
def test_a_local_clone_of_a_sealed_package_is_refused_by_etude_specialise(tmp_path, files):
    from etude.pipeline.specialise import parse_repos

    repo = _git_repo(tmp_path / "renamed-fork", files)
    with pytest.raises(EtudeError, match="sealed test-split package"):
        parse_repos(str(repo))
    with pytest.raises(EtudeError, match="sealed test split"):
        check_source(str(repo), "--repos")


def test_an_organisations_own_repository_passes(tmp_path):
    from etude.pipeline.specialise import parse_repos

    repo = _git_repo(tmp_path / "acme-lib", {"pyproject.toml": '[project]\nname = "acme-lib"\n', "acme/__init__.py": ""})
    assert parse_repos(str(repo)) == (str(repo.resolve()),)


def test_an_organisations_held_out_tasks_are_sealed_the_same_way(tmp_path):
    from etude.evals.runner import resolve_suite
    from etude.tasks import seal

    held = seal.seal_heldout([_task("acme"), _task("acme2")], "org acme: held-out functions")
    f = tmp_path / "heldout.jsonl"
    save_tasks(held, f)
    for use in ("train", "select", "gate"):
        with pytest.raises(EtudeError, match="org acme: held-out functions"):
            resolve_suite(str(f), use=use)
    assert len(resolve_suite(str(f), use="final")) == 2
    assert seal.retired(["click==8.1.7", "acme"]) == {"click==8.1.7": seal.RETIRED["click==8.1.7"]}


def test_the_override_is_the_one_way_through_and_is_logged(tmp_path, capsys):
    from etude.evals.runner import resolve_suite
    from etude.tasks import seal

    f = tmp_path / "t.jsonl"
    save_tasks([_task("schema")], f)
    with pytest.raises(EtudeError):
        resolve_suite(str(f), use="train")
    rec = check_source(str(f), "env.tasks_file", allow=True)  # what a command does with --allow-test-split
    assert rec["packages"] == ["schema"] and "marked contaminated" in capsys.readouterr().err
    assert resolve_suite(str(f), use="train") and seal.granted() == [rec]


def test_a_loop_refuses_traffic_and_gate_from_one_source(tmp_path):
    import dataclasses

    from etude.loop import LoopConfig, run_cycle
    from etude.loop.config import EvalSection

    base = LoopConfig(root=str(tmp_path / "loop"))
    assert base.traffic.tasks != base.eval.suite  # the default no longer trains on its own gate
    same = dataclasses.replace(base, eval=EvalSection(suite=base.traffic.tasks, max_tasks=30))
    with pytest.raises(EtudeError, match="same source"):
        run_cycle(same)
    assert not (tmp_path / "loop").exists()


def test_a_loop_refuses_traffic_and_gate_files_that_share_a_task(tmp_path):
    import dataclasses

    from etude.loop import LoopConfig
    from etude.loop.config import EvalSection, TrafficConfig
    from etude.loop.cycle import check_traffic_gate

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    save_tasks([_task("tinydb"), _task("toolz")], a)
    save_tasks([_task("toolz"), _task("addict")], b)
    cfg = LoopConfig(root=str(tmp_path / "loop"))
    cfg = dataclasses.replace(cfg, traffic=TrafficConfig(tasks=str(a), max_tasks=2),
                              eval=EvalSection(suite=str(b), max_tasks=2, min_tasks=2))
    with pytest.raises(EtudeError, match="share 1 task"):
        check_traffic_gate(cfg)


def test_a_gate_over_runs_that_read_the_sealed_split_is_refused(tmp_path):
    from etude.evals.compare import compare

    runs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"model": name, "suite_sha256": "s", "instance_ids": ["t0"],
                                                "sealed_read": ["parse"]}))
        (d / "results.jsonl").write_text(json.dumps({"instance_id": "t0", "sample": 0, "status": "ok", "resolved": True,
                                                     "efficiency": {"tokens": 1, "turns": 1}}) + "\n")
        runs.append(d)
    with pytest.raises(EtudeError, match="read the sealed test split"):
        compare(*runs)
    from etude.evals.compare import CompareConfig

    assert compare(*runs, CompareConfig(min_tasks=1), use="final")["use"] == "final"
    r = _etude("eval", "compare", str(runs[0]), str(runs[1]), cwd=tmp_path)
    assert r.returncode == 2 and "sealed test split" in r.stderr and "Traceback" not in r.stderr
