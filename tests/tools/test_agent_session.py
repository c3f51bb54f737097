"""The tools inside the real agent loop: a scripted model fixes a bug in a copy-on-write
workspace through the real harness and the real bubblewrap sandbox; its bad calls (a path
escape, a malformed call, an ambiguous edit) are observations it sees, and nothing leaves the
workspace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etude.harness import HarnessConfig, run_agent
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import ToolContext


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.fixture
def template(tmp_path: Path) -> Path:
    t = tmp_path / "repo"
    t.mkdir()
    (t / "calc.py").write_text("def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n")
    (t / "check.py").write_text("from calc import add\nassert add(2, 3) == 5, add(2, 3)\nprint('ok')\n")
    return t


def test_scripted_agent_fixes_a_bug_with_the_tools(template: Path, tmp_path: Path) -> None:
    from etude.sandbox import SandboxConfig, Workspace, make_sandbox

    (tmp_path / "secret.txt").write_text("TOP SECRET\n")
    outputs = [
        call("list_dir", path="."),
        call("grep", pattern="def add", glob="*.py"),
        call("read_file", path="../secret.txt"),  # escape: refused
        "<tool_call>{not json</tool_call>",  # malformed: a parse error the model sees
        call("edit_file", path="calc.py", old_str="return a - b", new_str="return a + b"),  # ambiguous
        call("edit_file", path="calc.py", old_str="def add(a, b):\n    return a - b", new_str="def add(a, b):\n    return a + b"),
        call("run_terminal", command="python check.py"),
    ]  # fmt: skip
    with Workspace.create(template) as ws:
        ctx = ToolContext(workspace=ws.path, sandbox=make_sandbox(ws.path, SandboxConfig(timeout_s=30)))
        traj = run_agent(ScriptedPolicy(outputs), "make add() add", ctx, HarnessConfig(max_steps=10), diff_fn=ws.diff)
    results = [t.result for t in traj.tool_calls]
    assert [t.call.name for t in traj.tool_calls] == [
        "list_dir",
        "grep",
        "read_file",
        "edit_file",
        "edit_file",
        "run_terminal",
    ]
    assert results[0].ok and "calc.py" in results[0].output
    assert results[1].ok and results[1].meta["matches"][0] == {"path": "calc.py", "line": 1, "text": "def add(a, b):"}
    assert not results[2].ok and results[2].meta["error_kind"] == "path_outside"
    assert not results[3].ok and results[3].meta["error_kind"] == "ambiguous"
    assert results[4].ok and "+    return a + b" in results[4].output
    assert results[5].ok and results[5].meta["exit_code"] == 0 and results[5].output.startswith("ok")
    assert traj.broken_calls == 3  # escape + malformed + ambiguous: each a negative signal for the reward
    tool_msgs = [m.content for m in traj.messages if m.role == "tool"]
    assert any("leave the workspace" in c for c in tool_msgs) and not any("TOP SECRET" in c for c in tool_msgs)
    assert " def add(a, b):\n-    return a - b\n+    return a + b" in traj.diff and traj.diff.count("\n+ ") == 1
    assert (template / "calc.py").read_text().count("a - b") == 2  # the template is untouched
