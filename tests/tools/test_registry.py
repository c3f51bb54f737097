"""run_tool never raises; schemas are OpenAI-shaped and validated; tools are found by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from etude.protocols import Tool, ToolContext
from etude.tools import TOOL_NAMES, UnknownTool, available, get_tool, run_call, run_tool, tool_schemas, validate
from etude.tools.read_file import TOOL as READ
from etude.types import ToolCall, ToolResult

OURS = ["read_file", "edit_file", "write_file", "grep", "glob", "list_dir", "run_terminal"]


def test_every_tool_implements_the_protocol() -> None:
    assert set(OURS) <= set(available()) and set(available()) <= set(TOOL_NAMES)
    for name in OURS:
        tool = get_tool(name)
        assert isinstance(tool, Tool) and tool.name == name == tool.schema["name"]
        assert tool.schema["parameters"]["additionalProperties"] is False


def test_schemas_are_openai_function_format() -> None:
    schemas = tool_schemas(OURS)
    assert [s["function"]["name"] for s in schemas] == OURS
    for s in schemas:
        assert s["type"] == "function" and set(s["function"]) == {"name", "description", "parameters"}
        assert s["function"]["description"] and s["function"]["parameters"]["type"] == "object"
    assert {s["function"]["name"] for s in tool_schemas()} == set(available())


def test_public_argument_names() -> None:
    params = {n: set(get_tool(n).schema["parameters"]["properties"]) for n in OURS}
    assert params["read_file"] == {"path", "start_line", "end_line"}
    assert params["edit_file"] == {"path", "old_str", "new_str", "replace_all"}
    assert params["write_file"] == {"path", "content"}
    assert params["grep"] == {"pattern", "path", "glob", "ignore_case", "max_results"}
    assert {"pattern"} <= params["glob"] and {"path", "depth"} == params["list_dir"]
    assert params["run_terminal"] == {"command", "timeout_s"}


def test_unknown_tool_is_a_result_and_get_tool_raises() -> None:
    res = run_tool("rm_rf", {}, ToolContext(workspace=Path(".")))
    assert not res.ok and res.meta["error_kind"] == "unknown_tool" and "read_file" in res.error
    with pytest.raises(KeyError):
        get_tool("rm_rf")
    with pytest.raises(UnknownTool):
        tool_schemas(["rm_rf"])
    for odd in (None, ["read_file"], {"a": 1}):  # a model may emit anything as a name
        res = run_tool(odd, {}, ToolContext(workspace=Path(".")))
        assert not res.ok and res.meta["error_kind"] == "unknown_tool"


@pytest.mark.parametrize(
    "args, expected",
    [
        ({}, "missing required argument 'path'"),
        ({"path": "a", "line": 3}, "unknown argument(s) 'line' (expected: path, start_line, end_line)"),
        ({"path": "a", "start_line": "3"}, "argument 'start_line' must be of type integer, got \"3\""),
        ({"path": "a", "start_line": 0}, "argument 'start_line': 0 is less than the minimum of 1"),
        ({"path": 7}, "argument 'path' must be of type string, got 7"),
        ({"path": "a", "end_line": True}, "argument 'end_line' must be of type integer, got true"),
        ({"path": "a", "end_line": [1] * 500}, "argument 'end_line' must be of type integer, got [1, 1"),
    ],
)
def test_invalid_arguments_are_explained(ctx: ToolContext, args: dict, expected: str) -> None:
    res = run_tool("read_file", args, ctx)
    assert not res.ok and res.meta["error_kind"] == "invalid_arguments"
    assert expected in res.error, res.error


def test_another_tools_arguments_name_that_tool(ctx: ToolContext) -> None:
    # a small model writes an edit under the name read_file: the error says which tool takes them
    edit = {"path": "README.md", "old_str": "a", "new_str": "b"}
    res = run_tool("read_file", edit, ctx)
    assert not res.ok and res.meta["error_kind"] == "invalid_arguments"
    assert res.error.endswith("; these are edit_file's arguments: to use them, call edit_file"), res.error
    # no hint when no other tool takes them all, or when nothing is unknown (only a type is wrong)
    for args in ({"path": "a", "line": 3}, {"path": "a", "start_line": "3"}, {"path": "a", "old_str": "x"}):
        assert "these are" not in run_tool("read_file", args, ctx).error


def test_a_tool_that_cannot_load_leaves_the_arguments_error(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    import etude.tools as tools

    real = tools.get_tool

    def flaky(name: str):
        if name == "edit_file":
            raise ImportError("no module named something_heavy")
        return real(name)

    monkeypatch.setattr(tools, "get_tool", flaky)
    res = run_tool("read_file", {"path": "README.md", "old_str": "a", "new_str": "b"}, ctx)
    assert res.meta["error_kind"] == "invalid_arguments" and "unknown argument(s)" in res.error, res.error
    assert "these are edit_file's" not in res.error


def test_arguments_may_arrive_as_json_text(ctx: ToolContext) -> None:
    assert run_tool("read_file", '{"path": "README.md"}', ctx).ok
    for bad in ("{not json", "[1, 2]", 42):
        res = run_tool("read_file", bad, ctx)
        assert not res.ok and res.meta["error_kind"] == "invalid_arguments"


def test_exceptions_become_results(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args, ctx):  # a tool with a bug must not crash the agent loop
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(READ, "_run", boom)
    res = run_tool("read_file", {"path": "README.md"}, ctx)
    assert res == ToolResult(
        ok=False, error="read_file failed: RuntimeError: disk on fire", meta={"error_kind": "exception"}
    )


def test_missing_workspace_is_a_result() -> None:
    res = run_tool("list_dir", {}, ToolContext(workspace=Path("/nonexistent/ws")))
    assert not res.ok and res.meta["error_kind"] == "bad_workspace"


def test_validate_accepts_integral_floats_and_defaults_apply(ctx: ToolContext) -> None:
    assert validate({"path": "a", "start_line": 2.0}, READ.schema["parameters"]) == []
    res = run_tool("grep", {"pattern": "add"}, ctx)  # path '.', max_results 100 by default
    assert res.ok and res.meta["count"] >= 2


def test_run_call_takes_toolcall_or_dict(ctx: ToolContext) -> None:
    assert run_call(ToolCall(id="1", name="read_file", arguments={"path": "README.md"}), ctx).ok
    assert run_call({"name": "list_dir", "arguments": {"depth": 1}}, ctx).ok
    for bad in ({"arguments": {}}, "read_file", None):
        res = run_call(bad, ctx)
        assert not res.ok and res.meta["error_kind"] == "invalid_call"


def test_foreign_tool_output_is_bounded(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(READ, "_run", lambda args, ctx: ToolResult(ok=True, output="x\n" * 100_000))
    res = run_tool("read_file", {"path": "README.md"}, ctx)
    assert res.ok and res.meta["truncated"] and len(res.output) < 31_000
    assert "characters truncated from the middle" in res.output


def test_importing_the_registry_is_light() -> None:
    import subprocess
    import sys

    code = "import sys, etude.tools; print(sorted(m for m in ('jsonschema', 'etude.sandbox', 'etude.search') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
