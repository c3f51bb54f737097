"""The function-level split of an organisation's tasks: no held-out function reaches training."""

import dataclasses

import pytest

from etude.pipeline.split import changed_old_lines, check_disjoint, split_by_function, touched_functions
from etude.types import Task

SRC = """import os


def a(x):
    return x + 1


class K:
    def m(self, y):
        if y > 0:
            return y
        return -y


def b(z):
    return z * 2
"""


def _patch(old_line: int, old: str, new: str, path: str = "pkg/core.py") -> str:
    return (f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -{old_line},1 +{old_line},1 @@\n-{old}\n+{new}\n")


def _task(i: str, patch: str, **meta) -> Task:
    return Task(instance_id=i, repo="org/pkg", base_commit="x", patch=patch, test_patch="", problem_statement="",
                meta=meta)


def test_changed_lines_and_functions_from_the_tree(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "core.py").write_text(SRC)
    t = _task("t1", _patch(11, "            return y", "            return -y"))
    assert changed_old_lines(t.patch) == [11]
    assert touched_functions(t, tmp_path) == {"pkg/core.py::K.m"}
    two = _task("t2", _patch(5, "    return x + 1", "    return x - 1") + _patch(1, "import os", "import sys"))
    assert touched_functions(two, tmp_path) == {"pkg/core.py::a", "pkg/core.py::<module>"}


def test_level1_tasks_name_their_function():
    t = _task("t", _patch(5, "a", "b"), function="a", file="pkg/core.py")
    assert touched_functions(t, None) == {"pkg/core.py::a"}


def _many(n_fns: int, per_fn: int) -> tuple[list[Task], dict[str, frozenset[str]]]:
    tasks, touched = [], {}
    for f in range(n_fns):
        for k in range(per_fn):
            t = _task(f"f{f}-{k}", _patch(1, "a", "b"))
            tasks.append(t)
            touched[t.instance_id] = frozenset({f"m.py::fn{f}"})
    # one task touching two functions: it must end on one side or be dropped, never leak
    t = _task("cross", _patch(1, "a", "b"))
    tasks.append(t)
    touched["cross"] = frozenset({"m.py::fn0", "m.py::fn1"})
    return tasks, touched


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_split_is_disjoint_by_function(seed):
    tasks, touched = _many(20, 3)
    sp = split_by_function(tasks, touched, heldout_fraction=0.5, select_fraction=0.2, seed=seed)
    check_disjoint(sp.train + sp.select, sp.heldout, touched)
    held_fns = set(sp.functions["heldout"])
    for t in sp.train + sp.select:
        assert not touched[t.instance_id] & held_fns
    assert not set(sp.functions["train"]) & set(sp.functions["select"])
    assert {t.instance_id for t in sp.select}.isdisjoint({t.instance_id for t in sp.train})
    n = len(sp.train) + len(sp.select) + len(sp.heldout) + len(sp.dropped)
    assert n == len(tasks)
    assert 25 <= len(sp.heldout) <= 40


def test_split_is_fixed_by_its_seed():
    tasks, touched = _many(20, 3)
    a = split_by_function(tasks, touched, seed=5).to_dict(5)
    b = split_by_function(tasks, touched, seed=5).to_dict(5)
    c = split_by_function(tasks, touched, seed=6).to_dict(6)
    assert a == b
    assert a["heldout"]["functions"] != c["heldout"]["functions"]


def test_check_disjoint_catches_a_leak():
    tasks, touched = _many(4, 2)
    leaky = dataclasses.replace(tasks[0], instance_id="leak")
    touched["leak"] = touched[tasks[0].instance_id]
    with pytest.raises(AssertionError, match="held-out function"):
        check_disjoint([leaky], [tasks[0]], touched)


def test_heldout_per_function_caps_one_function_s_share():
    tasks, touched = _many(10, 2)
    for k in range(30):  # one function with many mutants
        t = _task(f"big-{k}", _patch(1, "a", "b"))
        tasks.append(t)
        touched[t.instance_id] = frozenset({"m.py::big"})
    for seed in range(6):
        sp = split_by_function(tasks, touched, heldout_per_function=3, seed=seed)
        check_disjoint(sp.train + sp.select, sp.heldout, touched)
        per = {}
        for t in sp.heldout:
            for f in touched[t.instance_id]:
                per[f] = per.get(f, 0) + 1
        assert max(per.values()) <= 3
        if "m.py::big" in sp.functions["heldout"]:
            assert sum(1 for i in sp.dropped if i.startswith("big-")) == 27
        else:
            assert sum(1 for t in sp.train + sp.select if t.instance_id.startswith("big-")) == 30
