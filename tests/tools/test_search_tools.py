"""grep (ripgrep), glob and list_dir on a real temporary workspace."""

from __future__ import annotations

from pathlib import Path

from etude.protocols import ToolContext
from etude.tools import run_tool
from etude.tools.base import ToolsConfig

# grep


def test_grep_structured_matches_in_path_order(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": r"def \w+"}, ctx)
    assert res.ok
    assert res.meta["matches"] == [
        {"path": "src/pkg/core.py", "line": 1, "text": "def add(a, b):"},
        {"path": "src/pkg/core.py", "line": 5, "text": "def sub(a, b):"},
        {"path": "tests/test_core.py", "line": 4, "text": "def test_add():"},
    ]  # core_link.py is a symlink: ripgrep does not follow it
    assert res.output.splitlines()[0] == "src/pkg/core.py:1:def add(a, b):"
    assert res.meta["files"] == 2 and not res.meta["truncated"]


def test_grep_path_glob_and_case(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": "ADD", "ignore_case": True, "glob": "*.md"}, ctx)
    assert res.ok and [(m["path"], m["line"]) for m in res.meta["matches"]] == [("README.md", 2)]
    assert run_tool("grep", {"pattern": "ADD", "glob": "*.md"}, ctx).meta["count"] == 0
    res = run_tool("grep", {"pattern": "add", "path": "tests"}, ctx)
    assert {m["path"] for m in res.meta["matches"]} == {"tests/test_core.py"}
    res = run_tool("grep", {"pattern": "return", "path": "/workspace/src/pkg/core.py"}, ctx)
    assert [m["line"] for m in res.meta["matches"]] == [2, 6]


def test_grep_glob_is_relative_to_path_like_glob_tool(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": "return", "path": "src", "glob": "pkg/*.py"}, ctx)
    assert [(m["path"], m["line"]) for m in res.meta["matches"]] == [("src/pkg/core.py", 2), ("src/pkg/core.py", 6)]
    res = run_tool("grep", {"pattern": "return", "path": "src/pkg"}, ctx)
    assert {m["path"] for m in res.meta["matches"]} == {"src/pkg/core.py"}


def test_grep_max_results_truncates(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": "a", "max_results": 2}, ctx)
    assert res.ok and res.meta["count"] == 2 and res.meta["truncated"]
    assert "[truncated: showing the first 2 matches" in res.output


def test_grep_no_match_bad_regex_missing_path(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": "zzz_nothing"}, ctx)
    assert res.ok and res.meta["count"] == 0 and "no matches" in res.output
    res = run_tool("grep", {"pattern": "(unclosed"}, ctx)
    assert not res.ok and res.meta["error_kind"] == "bad_pattern" and "regex" in res.error.lower()
    res = run_tool("grep", {"pattern": "x", "path": "nope"}, ctx)
    assert not res.ok and res.meta["error_kind"] == "not_found"


def test_grep_pattern_starting_with_dash_and_long_lines(ws: Path) -> None:
    (ws / "flags.txt").write_text("--verbose " + "y" * 1000 + "\n")
    ctx = ToolContext(workspace=ws, config=ToolsConfig(grep_max_line_chars=20))
    res = run_tool("grep", {"pattern": "--verbose"}, ctx)
    assert res.ok and res.meta["count"] == 1
    assert res.meta["matches"][0]["text"] == "--verbose yyyyyyyyyy ... [line cut]"


# glob


def test_glob_name_patterns_match_at_any_depth(ctx: ToolContext) -> None:
    res = run_tool("glob", {"pattern": "*.py"}, ctx)
    assert res.ok
    # core_link.py is a symlink and is not listed (ripgrep does not follow symlinks)
    assert res.meta["files"] == ["src/pkg/__init__.py", "src/pkg/core.py", "tests/test_core.py"]


def test_glob_path_patterns_and_base(ctx: ToolContext) -> None:
    assert run_tool("glob", {"pattern": "tests/test_*.py"}, ctx).meta["files"] == ["tests/test_core.py"]
    assert run_tool("glob", {"pattern": "src/**/core.py"}, ctx).meta["files"] == ["src/pkg/core.py"]
    assert run_tool("glob", {"pattern": "pkg/*.py", "path": "src"}, ctx).meta["files"] == [
        "src/pkg/__init__.py",
        "src/pkg/core.py",
    ]
    assert run_tool("glob", {"pattern": "*.{md,txt}"}, ctx).meta["files"] == ["README.md"]


def test_glob_limits_and_refusals(ws: Path, ctx: ToolContext) -> None:
    small = ToolContext(workspace=ws, config=ToolsConfig(glob_max_results=2))
    res = run_tool("glob", {"pattern": "*.py"}, small)
    assert res.ok and res.meta["count"] == 2 and res.meta["truncated"] and "[truncated" in res.output
    assert run_tool("glob", {"pattern": "*.rs"}, ctx).output.startswith("no files match")
    for pattern in ("/etc/*", "../*", "src/../../*"):
        res = run_tool("glob", {"pattern": pattern}, ctx)
        assert not res.ok and res.meta["error_kind"] == "path_outside", pattern
    assert run_tool("glob", {"pattern": "*", "path": "README.md"}, ctx).meta["error_kind"] == "not_a_directory"


# list_dir


def test_list_dir_tree(ctx: ToolContext, outside: Path) -> None:
    res = run_tool("list_dir", {}, ctx)
    assert res.ok
    assert res.output.splitlines() == [
        "./",
        "  src/",
        "    pkg/",
        "  tests/",
        "    test_core.py",
        "  README.md",
        "  core_link.py -> src/pkg/core.py",
        f"  leak.txt -> {outside}/secret.txt",
        f"  outdir -> {outside}",
    ]  # depth 2: src/pkg's files are not shown
    types = {e["path"]: e["type"] for e in res.meta["entries"]}
    assert types["src/pkg"] == "dir" and types["README.md"] == "file" and types["leak.txt"] == "symlink"


def test_list_dir_depth_and_not_expanded(ctx: ToolContext, ws: Path) -> None:
    (ws / ".git" / "objects").mkdir(parents=True)
    res = run_tool("list_dir", {"path": "src", "depth": 3}, ctx)
    assert res.output.splitlines() == ["src/", "  pkg/", "    __init__.py", "    core.py"]
    res = run_tool("list_dir", {"depth": 3}, ctx)
    assert ".git/  [not expanded]" in res.output and "objects" not in res.output


def test_list_dir_limits_and_errors(ws: Path, ctx: ToolContext) -> None:
    small = ToolContext(workspace=ws, config=ToolsConfig(list_max_entries=3))
    res = run_tool("list_dir", {"depth": 5}, small)
    assert res.ok and res.meta["truncated"] and len(res.meta["entries"]) == 3
    assert run_tool("list_dir", {"path": "README.md"}, ctx).meta["error_kind"] == "not_a_directory"
    assert run_tool("list_dir", {"path": "nope"}, ctx).meta["error_kind"] == "not_found"
    assert not run_tool("list_dir", {"depth": 0}, ctx).ok
