"""The built-in suite: pinned packages, train/eval split by package, cached builds."""

import re

import pytest

from etude.errors import EtudeError
from etude.tasks.suite import PACKAGES, packages, select_packages


def test_pins_and_disjoint_splits():
    assert len(PACKAGES) >= 10
    assert all(re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in PACKAGES)
    train, evals = {p.name for p in packages("train")}, {p.name for p in packages("eval")}
    assert train and evals and not train & evals
    assert train | evals == {p.name for p in PACKAGES}


def test_unknown_names_and_splits_are_clear_errors():
    with pytest.raises(EtudeError, match="not in the built-in suite: nope"):
        select_packages(["nope"])
    with pytest.raises(EtudeError, match="split must be train, eval or all"):
        packages("test")


@pytest.mark.slow
@pytest.mark.usefixtures("task_cache")
def test_builtin_suite_builds_a_few_eval_tasks_then_loads_them_from_cache(monkeypatch):
    from etude.tasks import builtin_suite
    from etude.tasks import suite as suite_mod

    first = builtin_suite("eval", max_tasks=2, use="final")
    assert len(first) == 2
    eval_names = {p.name for p in packages("eval")}
    assert all(t.source["package"] in eval_names and t.meta["split"] == "eval" for t in first)

    def no_build(*a, **k):
        raise AssertionError("rebuilt instead of loading the cache")

    monkeypatch.setattr(suite_mod, "_build_package", no_build)
    assert [t.instance_id for t in builtin_suite("eval", max_tasks=2, use="final")] == [t.instance_id for t in first]
