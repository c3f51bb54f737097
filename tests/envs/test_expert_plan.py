"""The expert's plan on a small repository: every line it reads starts where a grep showed a `def`,
and its parallel replies (the failing test's grep and read beside the function's) appear in some
plans, never with a line number the agent could not have seen."""

from __future__ import annotations

from pathlib import Path

import pytest

from etude.envs.expert import (
    MAX_PLAN_TURNS,
    READ_LINES,
    TEST_READ_LINES,
    ExpertPolicy,
    _decoy_lines,
    _test_def,
    _windows,
)
from etude.types import Message, Task, ToolCall

SRC = "\n".join(["import math", "", "", "def area(r):", '    """Area of a circle."""', "    k = 2",
                 "    return math.pi * r ** k", ""])
BUGGY = SRC.replace("** k", "** (k + 1)")
TESTS = "\n".join(["from pkg.geo import area", "", "", "class TestArea:", "    def test_unit(self):",
                   "        assert abs(area(1) - 3.14159) < 1e-3", ""])
PATCH = """--- a/pkg/geo.py
+++ b/pkg/geo.py
@@ -5,3 +5,3 @@ def area(r):
     \"\"\"Area of a circle.\"\"\"
     k = 2
-    return math.pi * r ** (k + 1)
+    return math.pi * r ** k
"""


def _task(i: int) -> Task:
    return Task(f"t-{i}", "pkg", "base", PATCH, "", "area is wrong",
                FAIL_TO_PASS=("tests/test_geo.py::TestArea::test_unit",),
                meta={"function": "area", "lines": [7]})


def _template(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "geo.py").write_text(BUGGY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_geo.py").write_text(TESTS)
    return tmp_path


def _replies(p: ExpertPolicy) -> list[list[ToolCall]]:
    return [t for t in p.turns if not isinstance(t, str)]


def test_test_def_is_what_a_grep_shows(tmp_path: Path) -> None:
    root = _template(tmp_path)
    assert _test_def(root, "tests/test_geo.py::TestArea::test_unit[2]") == ("tests/test_geo.py", "test_unit", 5)
    assert _test_def(root, "tests/test_geo.py::test_missing") is None
    assert _test_def(root, "tests/nope.py::test_unit") is None


def test_plans_read_from_def_lines_and_some_read_the_test_in_parallel(tmp_path: Path) -> None:
    root = _template(tmp_path)
    plans = [ExpertPolicy(_task(i), root, seed=i, semantic_search=False) for i in range(40)]
    parallel_reads = 0
    for p in plans:
        replies = _replies(p)
        reads = [c for r in replies for c in r if c.name == "read_file"]
        assert reads and all(c.arguments["start_line"] in (4, 5) for c in reads)  # area's def, the test's def
        for c in reads:
            if c.arguments["path"] == "tests/test_geo.py":
                assert c.arguments["end_line"] - c.arguments["start_line"] == TEST_READ_LINES - 1
                first = replies[0]  # the test was found by a grep beside the function's
                assert [x.arguments.get("path") for x in first if x.name == "grep"] == ["pkg/geo.py", "tests/test_geo.py"]
                parallel_reads += len([x for x in replies[1] if x.name == "read_file"]) == 2
        edit = [c for r in replies for c in r if c.name == "edit_file"][-1]  # the last: some plans err first
        assert edit.arguments["new_str"].endswith("return math.pi * r ** k")
    assert 5 <= parallel_reads <= 35  # about half of the grep plans (seeded, per task)
    # the plan is a Policy: its replies come back turn by turn, calls as text
    gen = plans[0].generate([Message("user", "fix it")], [])
    assert "<tool_call>" in gen.text


def test_some_plans_recover_from_a_non_unique_old_str_and_submit_quotes_no_code(tmp_path: Path) -> None:
    """Where the changed line alone occurs twice, about half the plans first try it alone (the edit
    tool's real error is what they see next), then retry with the context line that makes it
    unique; a `submit` answer quotes no code (its quotes would need escaping inside JSON)."""
    root = _template(tmp_path)
    twin = "\n\ndef volume(r, k):\n    r = abs(r)\n    return math.pi * r ** (k + 1)\n"
    (root / "pkg" / "geo.py").write_text(BUGGY + twin)
    plans = [ExpertPolicy(_task(i), root, seed=i, semantic_search=False) for i in range(40)]
    recovered = 0
    for p in plans:
        edits = [c for r in _replies(p) for c in r if c.name == "edit_file"]
        if p.untrained:  # a wrong fix first instead (the next test)
            continue
        assert edits[-1].arguments["old_str"] == "    k = 2\n    return math.pi * r ** (k + 1)"
        if len(edits) == 2:
            assert edits[0].arguments["old_str"] == "    return math.pi * r ** (k + 1)"
            recovered += 1
        for r in _replies(p):
            for c in r:
                if c.name == "submit":
                    assert "**" not in c.arguments["message"] and '"' not in c.arguments["message"]
    assert 5 <= recovered <= 35


def test_some_plans_make_a_wrong_fix_first_untrained_and_checked(tmp_path: Path) -> None:
    """In some plans the expert first changes the buggy line the wrong way, re-runs the test, then
    makes the right edit from what is now in the file; SFT is told not to learn the wrong edit,
    and the plan reports whether the test really failed after it (a passing one is dropped)."""
    root = _template(tmp_path)
    assert set(_decoy_lines("    return math.pi * r ** (k + 1)")) >= {"    return math.pi * r ** (k - 1)",
                                                                      "    return math.pi * r ** (k + 2)"}
    assert _decoy_lines("x = f(a,") == [] and _decoy_lines("    y = x[") == []  # unclosed: no crash
    plans = [ExpertPolicy(_task(i), root, seed=i, semantic_search=False) for i in range(60)]
    wrong = 0
    for p in plans:
        assert len(p.turns) <= MAX_PLAN_TURNS
        replies = p.turns
        edits = [(k, c) for k, r in enumerate(replies) if not isinstance(r, str) for c in r if c.name == "edit_file"]
        if not p.untrained:
            assert p.decoy_check is None and len(edits) == 1
            continue
        wrong += 1
        (k0, bad), (k1, fix) = edits
        assert p.untrained == [k0] and bad.arguments["old_str"].endswith("r ** (k + 1)")
        assert bad.arguments["new_str"] not in (bad.arguments["old_str"], "    k = 2\n    return math.pi * r ** k")
        assert fix.arguments["old_str"].endswith(bad.arguments["new_str"].split("\n")[-1])
        assert fix.arguments["new_str"].endswith("return math.pi * r ** k")
        assert replies[k0 + 1][0].name == "run_terminal" and replies[k1 + 1][0].name == "run_terminal"
        assert p.decoy_check == k0 + 2
        # what the harness hands back decides whether the plan is kept
        convo = [Message("user", "fix it")] + [Message("assistant", "x"), Message("tool", "ok")] * (k0 + 1)
        p.generate(convo + [Message("assistant", "x"), Message("tool", "F\n1 failed in 0.1s")], [])
        assert p.decoy_failed is True
        p.generate(convo + [Message("assistant", "x"), Message("tool", "1 passed in 0.1s")], [])
        assert p.decoy_failed is False
    assert 20 <= wrong <= 55  # DECOY_SHARE of the 60 plans (all are short enough here)


def test_windows_read_to_the_functions_end_not_to_the_bug() -> None:
    """The expert reads 25-line windows from the `def` line until the function's last line is on
    screen (at most four): where the bug sits does not decide how far it reads."""
    assert _windows(10, 12, 20) == [(10, 10 + READ_LINES - 1)]
    # the bug in the first window of a 60-line function: all three windows are read
    assert _windows(10, 12, 70) == [(10, 34), (35, 59), (60, 84)]
    assert _windows(10, 65, 70) == _windows(10, 12, 70)
    # a longer function: four windows, and a bug below them cannot be planned
    assert len(_windows(1, 90, 400)) == 4
    with pytest.raises(ValueError, match="more than 100 lines"):
        _windows(1, 120, 400)


def test_drill_plan_greps_reads_makes_the_gold_edit_and_leaves_its_answer_untrained(tmp_path: Path) -> None:
    p = ExpertPolicy(_task(0), _template(tmp_path), seed=0, drill=True)
    replies = _replies(p)
    assert [[c.name for c in r] for r in replies] == [["grep"], ["read_file"], ["edit_file"]]
    assert replies[0][0].arguments["pattern"] == "def area\\b"
    assert replies[1][0].arguments["start_line"] == 4  # the `def` line the grep shows
    edit = replies[2][0].arguments
    after = BUGGY.replace(edit["old_str"], edit["new_str"], 1)
    assert BUGGY.count(edit["old_str"]) == 1 and after == SRC  # the gold edit undoes the bug
    assert isinstance(p.turns[-1], str) and p.untrained == [len(p.turns) - 1]
    assert not any(c.name == "run_terminal" for r in replies for c in r)  # a drill runs no tests


def test_drill_refuses_a_bug_outside_any_function(tmp_path: Path) -> None:
    t = _task(0)
    t = Task(t.instance_id, t.repo, t.base_commit, t.patch, "", "x", FAIL_TO_PASS=t.FAIL_TO_PASS,
             meta={"function": "nowhere", "lines": [7]})
    assert ExpertPolicy.for_task(t, _template(tmp_path), drill=True) is None


def test_capped_reads_name_a_start_line_on_screen_and_the_tool_ends_them_at_the_window(tmp_path: Path) -> None:
    """With a harness whose read_file shows READ_LINES lines (configs/agent_sft.toml), every read
    names its start_line alone, and the next window's start_line is the one the tool printed."""
    from etude.envs.expert import read_capped
    from etude.harness.config import HarnessConfig
    from etude.protocols import ToolContext
    from etude.tools.read_file import TOOL

    root = _template(tmp_path)
    for i in range(20):
        reads = [c for r in _replies(ExpertPolicy(_task(i), root, seed=i, semantic_search=False, capped_reads=True))
                 for c in r if c.name == "read_file"]
        assert reads and all(set(c.arguments) == {"path", "start_line"} for c in reads)
    hc = HarnessConfig(tools_config={"read_max_lines": READ_LINES})
    assert read_capped(hc) and not read_capped(HarnessConfig())
    long = tmp_path / "long.py"
    long.write_text("".join(f"x{n} = {n}\n" for n in range(1, 101)))
    ctx = ToolContext(workspace=str(tmp_path), config=hc.tools_config)
    out = TOOL.run({"path": "long.py", "start_line": 10}, ctx)
    first, second = _windows(10, 12, 60)[:2]
    assert f"x{first[1]} = " in out.output and f"x{first[1] + 1} = " not in out.output
    assert out.output.rstrip().endswith(f"read more with start_line={second[0]}]")
