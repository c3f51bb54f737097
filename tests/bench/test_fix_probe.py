"""bench/fix_probe.py's scoring: a reply is a right fix only when its edit applies once and gives
the gold file (layout aside); an edit elsewhere, a malformed call or an ambiguous old_str is not."""

from __future__ import annotations

import json

from tests.bench import load_bench

SRC = "def f(a, b):\n    if a < b:\n        return a\n    return b\n"
GOLD = SRC.replace("a < b", "a > b")


def _reply(old: str, new: str, path: str = "pkg/m.py") -> str:
    args = {"path": path, "old_str": old, "new_str": new}
    return "<tool_call>\n" + json.dumps({"name": "edit_file", "arguments": args}) + "\n</tool_call>"


def _score(reply: str) -> dict[str, bool]:
    return load_bench("fix_probe").score(reply, SRC, GOLD, "pkg/m.py", "    if a < b:")


def test_the_gold_edit_scores_right_and_layout_does_not_matter():
    assert _score(_reply("    if a < b:", "    if a > b:")) == {
        "well_formed": True, "edits": True, "on_bug_line": True, "right_fix": True}
    assert _score(_reply("    if a < b:", "    if (a > b):"))["right_fix"]  # the same AST


def test_wrong_edits_and_broken_calls_are_not_right():
    wrong = _score(_reply("    if a < b:", "    if a <= b:"))
    assert wrong["edits"] and wrong["on_bug_line"] and not wrong["right_fix"]
    elsewhere = _score(_reply("        return a", "        return b"))
    assert elsewhere["edits"] and not elsewhere["on_bug_line"] and not elsewhere["right_fix"]
    assert not _score(_reply("return", "yield"))["edits"]  # old_str occurs twice: the tool refuses it
    assert not _score(_reply("    if a < b:", "    if a > b:", path="pkg/other.py"))["edits"]
    broken = _score('<tool_call>\n{"name": "edit_file", "arguments": {"path": "pkg/m.py", "old_str": "x}\n</tool_call>')
    assert broken == {"well_formed": False, "edits": False, "on_bug_line": False, "right_fix": False}
