"""The curriculum: level statements, the package-disjoint built-in split, bad input."""

import dataclasses
import json
import subprocess
import sys

import pytest

from etude.errors import EtudeError
from etude.tasks import curriculum as cur
from etude.types import Task

SRC = '''
class Duration:
    def __str__(self):
        x = 1
        if x > 1:
            return "a"
        return "b"


def top(a, b):
    return a + b
'''


def test_enclosing_function_names_method_and_function():
    assert cur.enclosing_function(SRC, 5) == "Duration.__str__"
    assert cur.enclosing_function(SRC, 11) == "top"
    assert cur.enclosing_function(SRC, 1) is None


def _task(**kw):
    base = dict(instance_id="p__synth-cmp_flip-x", repo="pypi/p", base_commit="b", patch="", test_patch="",
                problem_statement="", FAIL_TO_PASS=("tests/test_a.py::test_one", "tests/test_a.py::test_two"),
                meta={"file": "src/p/a.py", "lines": [5],
                      "failures": {"tests/test_a.py::test_one": "AssertionError: assert 'a' == 'b'"}})
    base.update(kw)
    return Task(**base)


def test_level1_names_test_file_function_and_error_level2_only_tests():
    t = _task()
    one = cur.statement(t, 1, "Duration.__str__")
    assert "`tests/test_a.py::test_one`" in one and "`Duration.__str__`" in one and "`src/p/a.py`" in one
    assert "AssertionError: assert 'a' == 'b'" in one
    two = cur.statement(t, 2, "Duration.__str__")
    assert "Duration" not in two and "src/p/a.py" not in two and "tests/test_a.py::test_two" in two


def test_builtin_split_is_package_disjoint_and_big_enough():
    by_split = {s: {m.spec.split("==")[0] for m in cur.members(s)} for s in cur.SPLITS}
    assert not (by_split["train"] & by_split["validation"]) and not (by_split["train"] & by_split["test"])
    assert not (by_split["validation"] & by_split["test"])
    assert sum(len(v) for v in by_split.values()) >= 15 and len(by_split["test"]) >= 4
    assert sum(m.n for m in cur.members("train")) >= 400 and sum(m.n for m in cur.members("test")) >= 100


def test_level_out_of_range_and_bad_spec_are_errors():
    with pytest.raises(EtudeError, match="level"):
        cur.build(["isodate==0.7.2"], 4, 5)
    with pytest.raises(EtudeError):
        cur.read_packages("isodate")  # no ==VERSION


@pytest.mark.slow
def test_cli_level1_on_a_real_package_then_cached(tmp_path, task_cache):
    out = tmp_path / "c.jsonl"
    cmd = [sys.executable, "-m", "etude.cli", "tasks", "curriculum", "--packages", "isodate==0.7.2", "--level", "1",
           "--max", "3", "--seed", "0", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    tasks = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert len(tasks) == 3
    for t in tasks:
        assert t["meta"]["level"] == 1 and t["meta"]["function"] and t["FAIL_TO_PASS"]
        assert t["meta"]["function"].split(".")[-1] in t["problem_statement"]
        assert t["strategy"].removeprefix("synth:") in cur.LEVEL1_MUTATORS
    cached = list((task_cache / "curriculum").rglob("*.jsonl"))
    assert cached
    before = cached[0].read_bytes()
    bad = subprocess.run(cmd[:6] + ["nonexistent-pkg-xyz==0.0.1"] + cmd[7:], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    bad_level = subprocess.run([*cmd[:8], "7", *cmd[9:]], capture_output=True, text=True, timeout=300)
    assert bad_level.returncode == 2 and "level" in bad_level.stderr
    assert cached[0].read_bytes() == before  # nothing cached was touched


def test_unsplit_tasks_keep_their_fields():
    t = _task()
    t2 = dataclasses.replace(t, problem_statement=cur.statement(t, 1, "f"))
    assert t2.FAIL_TO_PASS == t.FAIL_TO_PASS
