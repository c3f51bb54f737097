"""read_file, edit_file and write_file on a real temporary workspace."""

from __future__ import annotations

import os
from pathlib import Path

from etude.protocols import ToolContext
from etude.tools import run_tool
from etude.tools.base import ToolsConfig


def small(ws: Path, **limits: int) -> ToolContext:
    return ToolContext(workspace=ws, config=ToolsConfig(**limits))


# read_file


def test_read_numbers_lines(ctx: ToolContext) -> None:
    res = run_tool("read_file", {"path": "src/pkg/core.py"}, ctx)
    assert res.ok
    assert res.output.splitlines()[0] == "     1\tdef add(a, b):"
    assert res.output.splitlines()[-1] == "     6\t    return a - b"
    assert res.meta == {
        "path": "src/pkg/core.py",
        "start_line": 1,
        "end_line": 6,
        "total_lines": 6,
        "bytes": 66,
        "truncated": False,
    }


def test_read_range_is_inclusive_and_clamped(ctx: ToolContext) -> None:
    res = run_tool("read_file", {"path": "src/pkg/core.py", "start_line": 5, "end_line": 99}, ctx)
    assert res.ok
    assert res.output == "     5\tdef sub(a, b):\n     6\t    return a - b"
    assert (res.meta["start_line"], res.meta["end_line"]) == (5, 6)


def test_read_truncation_marker_says_how_to_continue(ws: Path) -> None:
    (ws / "long.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    res = run_tool("read_file", {"path": "long.txt"}, small(ws, read_max_lines=10))
    assert res.ok and res.meta["truncated"] and res.meta["end_line"] == 10
    assert res.output.splitlines()[-2] == "    10\tline 10"
    assert "showing lines 1-10 of 100" in res.output and "start_line=11" in res.output


def test_read_cuts_long_lines_and_respects_output_budget(ws: Path) -> None:
    (ws / "wide.txt").write_text(("x" * 50 + "\n") * 40)
    res = run_tool("read_file", {"path": "wide.txt"}, small(ws, read_max_line_chars=20, max_output_chars=200))
    assert res.ok and res.meta["truncated"]
    assert "[line cut, 50 characters]" in res.output
    assert res.meta["end_line"] < 40


def test_read_errors_are_actionable(ctx: ToolContext, ws: Path) -> None:
    (ws / "blob.bin").write_bytes(b"\x00\x01\x02")
    cases = {
        "missing.py": "file not found: missing.py",
        "src": "src is a directory; use list_dir",
        "blob.bin": "looks binary",
    }
    for path, message in cases.items():
        res = run_tool("read_file", {"path": path}, ctx)
        assert not res.ok and message in res.error, res.error
    res = run_tool("read_file", {"path": "README.md", "start_line": 9}, ctx)
    assert not res.ok and "past the end of README.md (2 lines)" in res.error
    res = run_tool("read_file", {"path": "README.md", "start_line": 2, "end_line": 1}, ctx)
    assert not res.ok and res.meta["error_kind"] == "bad_range"


def test_read_empty_file_and_symlink_inside(ctx: ToolContext, ws: Path) -> None:
    res = run_tool("read_file", {"path": "src/pkg/__init__.py"}, ctx)
    assert res.ok and res.output == "[empty file]" and res.meta["total_lines"] == 0
    res = run_tool("read_file", {"path": "core_link.py", "start_line": 1, "end_line": 1}, ctx)
    assert res.ok and res.output == "     1\tdef add(a, b):" and res.meta["path"] == "src/pkg/core.py"


def test_read_and_write_refuse_fifos_without_hanging(ctx: ToolContext, ws: Path) -> None:
    """A FIFO made by a command (mkfifo) used to block read_file forever."""
    os.mkfifo(ws / "pipe")
    res = run_tool("read_file", {"path": "pipe"}, ctx)
    assert not res.ok and res.meta["error_kind"] == "not_a_file"
    assert not run_tool("write_file", {"path": "pipe", "content": "x"}, ctx).ok


def test_read_crlf_shows_clean_lines(ctx: ToolContext, ws: Path) -> None:
    (ws / "win.txt").write_bytes(b"one\r\ntwo\r\n")
    assert run_tool("read_file", {"path": "win.txt"}, ctx).output == "     1\tone\n     2\ttwo"


# edit_file


def test_edit_replaces_unique_string_and_returns_diff(ctx: ToolContext, ws: Path) -> None:
    res = run_tool("edit_file", {"path": "src/pkg/core.py", "old_str": "a - b", "new_str": "a - b - 0"}, ctx)
    assert res.ok, res.error
    assert "return a - b - 0" in (ws / "src/pkg/core.py").read_text()
    assert "-    return a - b\n+    return a - b - 0" in res.output
    assert res.output.startswith("edited src/pkg/core.py: 1 replacement(s)")
    assert res.meta["lines_added"] == 1 and res.meta["lines_removed"] == 1 and res.meta["replacements"] == 1


def test_edit_ambiguous_is_refused_with_line_numbers(ctx: ToolContext, ws: Path) -> None:
    before = (ws / "src/pkg/core.py").read_text()
    res = run_tool("edit_file", {"path": "src/pkg/core.py", "old_str": "(a, b)", "new_str": "(x, y)"}, ctx)
    assert not res.ok and res.meta["error_kind"] == "ambiguous"
    assert "occurs 2 times" in res.error and "lines 1, 5" in res.error and "replace_all" in res.error
    assert (ws / "src/pkg/core.py").read_text() == before


def test_edit_replace_all(ctx: ToolContext, ws: Path) -> None:
    res = run_tool(
        "edit_file", {"path": "src/pkg/core.py", "old_str": "(a, b)", "new_str": "(x, y)", "replace_all": True}, ctx
    )
    assert res.ok and res.meta["replacements"] == 2
    assert (ws / "src/pkg/core.py").read_text().count("(x, y)") == 2


def test_edit_not_found_hints_at_whitespace(ctx: ToolContext) -> None:
    res = run_tool(
        "edit_file", {"path": "src/pkg/core.py", "old_str": "def add(a, b):\n  return a + b", "new_str": "x"}, ctx
    )
    assert not res.ok and res.meta["error_kind"] == "no_match"
    assert "whitespace" in res.error
    res = run_tool("edit_file", {"path": "src/pkg/core.py", "old_str": "nowhere", "new_str": "x"}, ctx)
    assert not res.ok and "read_file" in res.error


def test_edit_refuses_empty_and_noop(ctx: ToolContext) -> None:
    for old, new in (("", "x"), ("a + b", "a + b")):
        res = run_tool("edit_file", {"path": "src/pkg/core.py", "old_str": old, "new_str": new}, ctx)
        assert not res.ok and res.meta["error_kind"] == "bad_edit"


def test_edit_crlf_file_with_lf_old_str(ctx: ToolContext, ws: Path) -> None:
    (ws / "win.txt").write_bytes(b"one\r\ntwo\r\nthree\r\n")
    res = run_tool("edit_file", {"path": "win.txt", "old_str": "one\ntwo", "new_str": "one\n2"}, ctx)
    assert res.ok, res.error
    assert (ws / "win.txt").read_bytes() == b"one\r\n2\r\nthree\r\n"


def test_edit_keeps_file_mode(ctx: ToolContext, ws: Path) -> None:
    script = ws / "run.sh"
    script.write_text("echo hi\n")
    script.chmod(0o755)
    assert run_tool("edit_file", {"path": "run.sh", "old_str": "hi", "new_str": "bye"}, ctx).ok
    assert os.stat(script).st_mode & 0o777 == 0o755 and script.read_text() == "echo bye\n"


def test_edit_diff_is_bounded(ws: Path) -> None:
    (ws / "big.txt").write_text("a\n" * 200)
    res = run_tool(
        "edit_file",
        {"path": "big.txt", "old_str": "a", "new_str": "b", "replace_all": True},
        small(ws, edit_diff_max_lines=10),
    )
    assert res.ok and res.meta["diff_truncated"] and res.meta["lines_added"] == 200
    assert "[diff truncated" in res.output and len(res.output.splitlines()) <= 12


# write_file


def test_write_creates_parents_then_overwrites(ctx: ToolContext, ws: Path) -> None:
    res = run_tool("write_file", {"path": "new/deep/mod.py", "content": "x = 1\ny = 2\n"}, ctx)
    assert res.ok and res.meta == {"path": "new/deep/mod.py", "bytes": 12, "lines": 2, "created": True}
    assert (ws / "new/deep/mod.py").read_text() == "x = 1\ny = 2\n"
    res = run_tool("write_file", {"path": "/workspace/new/deep/mod.py", "content": "z"}, ctx)
    assert res.ok and not res.meta["created"] and res.output.startswith("overwrote new/deep/mod.py")
    assert (ws / "new/deep/mod.py").read_text() == "z"


def test_write_refuses_folders_and_oversize(ws: Path, ctx: ToolContext) -> None:
    assert run_tool("write_file", {"path": "src", "content": "x"}, ctx).meta["error_kind"] == "is_directory"
    assert run_tool("write_file", {"path": ".", "content": "x"}, ctx).meta["error_kind"] == "is_directory"
    res = run_tool("write_file", {"path": "big.txt", "content": "x" * 100}, small(ws, max_file_bytes=10))
    assert not res.ok and res.meta["error_kind"] == "too_large" and not (ws / "big.txt").exists()


def _apply(a: list[str], rows: list[str]) -> list[str]:
    """Apply unified-diff rows (as produced by unified_rows) to lines `a`."""
    out, i = [], 0
    for r in rows[2:]:
        if r.startswith("@@"):
            start = int(r.split()[1][1:].split(",")[0])
            length = r.split()[1].split(",")
            first = start - 1 if (len(length) == 1 or int(length[1])) else start
            out += a[i:first]
            i = first
        elif r.startswith(" ") or r.startswith("-"):
            assert a[i] == r[1:], "context or removed line does not match"
            i += 1
            if r.startswith(" "):
                out.append(r[1:])
        else:
            out.append(r[1:])
    return out + a[i:]


def test_fast_diff_applies_back_exactly() -> None:
    """The prefix/suffix-trimmed diff must be a correct patch (alignment may differ from difflib's)."""
    import random

    from etude.tools.edit_file import unified_rows

    rng = random.Random(0)
    for _ in range(500):
        a = [rng.choice("abcde") + "\n" for _ in range(rng.randint(0, 30))]
        b = list(a)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.33 and b:
                b.pop(rng.randrange(len(b)))
            elif op < 0.66:
                b.insert(rng.randint(0, len(b)), rng.choice("abcdefx") + "\n")
            elif b:
                b[rng.randrange(len(b))] = "z\n"
        rows = unified_rows(a, b, "f")
        assert (rows == []) == (a == b)
        assert _apply(a, rows) == b


def test_overwrite_with_shorter_and_longer_content(ctx: ToolContext, ws: Path) -> None:
    """Writes overwrite in place then cut the tail: no stale bytes may survive a shorter write."""
    for content in ("a" * 1000, "short", "", "longer again\n" * 10):
        assert run_tool("write_file", {"path": "f.txt", "content": content}, ctx).ok
        assert (ws / "f.txt").read_text() == content
    assert run_tool("edit_file", {"path": "f.txt", "old_str": "longer again\n" * 10, "new_str": "x"}, ctx).ok
    assert (ws / "f.txt").read_text() == "x"
