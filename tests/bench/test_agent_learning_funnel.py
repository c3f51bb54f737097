"""bench/agent_learning.py's funnel: how far an episode got towards the gold fix (read the buggy
line, edited it, edited it into the fix), read from the task's gold patch and the trajectory."""

from __future__ import annotations

import json
from types import SimpleNamespace

from etude.types import ToolCall, ToolExecution, ToolResult
from tests.bench import load_bench

PATCH = """diff --git a/pkg/m.py b/pkg/m.py
--- a/pkg/m.py
+++ b/pkg/m.py
@@ -1,4 +1,4 @@
 def f(x):
-    if x > 0:
+    if x >= 0:
         return 1
     return 0
"""


def _bench():
    return load_bench("agent_learning")


def _traj(*calls: tuple[str, dict, str, bool]) -> SimpleNamespace:
    return SimpleNamespace(tool_calls=[ToolExecution(call=ToolCall(f"c{i}", name, args), result=ToolResult(ok=ok, output=out),
                                                     started_s=0.0, duration_s=0.0)
                                       for i, (name, args, out, ok) in enumerate(calls)])


def test_gold_lines_and_funnel_steps(tmp_path):
    mod = _bench()
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"instance_id": "t1", "patch": PATCH}) + "\n")
    gold = mod.gold_lines(tmp_path)
    assert gold == {"t1": (["if x > 0:"], ["if x >= 0:"])}
    minus, plus = gold["t1"]
    read = ("read_file", {"path": "pkg/m.py"}, "     1\tdef f(x):\n     2\t    if x > 0:\n", True)
    wrong_line = ("edit_file", {"path": "pkg/m.py", "old_str": "return 0", "new_str": "return 1"}, "ok", True)
    wrong_fix = ("edit_file", {"path": "pkg/m.py", "old_str": "if x > 0:", "new_str": "if x < 0:"}, "ok", True)
    fix = ("edit_file", {"path": "pkg/m.py", "old_str": "    if x > 0:", "new_str": "    if x >= 0:"}, "ok", True)
    assert mod.funnel_steps(_traj(), minus, plus) == {"episodes": True, "read_buggy_line": False,
                                                       "edited_buggy_line": False, "edit_had_fix": False}
    assert mod.funnel_steps(_traj(read, wrong_line), minus, plus)["read_buggy_line"] is True
    got = mod.funnel_steps(_traj(read, wrong_fix), minus, plus)
    assert got["edited_buggy_line"] and not got["edit_had_fix"]
    assert mod.funnel_steps(_traj(fix), minus, plus)["edit_had_fix"] is True
    # a failed read shows nothing, whatever its output says
    assert not mod.funnel_steps(_traj(read[:3] + (False,)), minus, plus)["read_buggy_line"]
