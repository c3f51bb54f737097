"""Every file tool refuses paths that leave the workspace: '..', absolute paths, symlinks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from etude.protocols import ToolContext
from etude.tools import run_tool
from etude.tools.base import ToolError
from etude.tools.paths import resolve


def test_relative_absolute_and_mount_paths_resolve_inside(ws: Path) -> None:
    real = ws.resolve() / "src" / "pkg" / "core.py"
    assert resolve(ws, "src/pkg/core.py") == real
    assert resolve(ws, "./src/../src/pkg/core.py") == real
    assert resolve(ws, str(ws / "src" / "pkg" / "core.py")) == real
    assert resolve(ws, "/workspace/src/pkg/core.py") == real
    assert resolve(ws, "/workspace") == ws.resolve()
    assert resolve(ws, "core_link.py") == real  # a symlink that stays inside is followed


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.txt", "src/../../outside/secret.txt", "..", "/etc/passwd", "/workspace/../etc/passwd",
     "leak.txt", "outdir/secret.txt", "outdir", "~/x", "", "a\x00b"],
)  # fmt: skip
def test_escapes_are_refused(ws: Path, path: str) -> None:
    with pytest.raises(ToolError) as e:
        resolve(ws, path)
    assert e.value.kind in ("path_outside", "bad_path")


def test_dotdot_that_comes_back_is_still_refused(ws: Path) -> None:
    with pytest.raises(ToolError, match=r"'\.\.'"):
        resolve(ws, f"../{ws.name}/README.md")


def test_symlinked_workspace_root_is_fine(ws: Path, tmp_path: Path) -> None:
    link = tmp_path / "ws-link"
    os.symlink(ws, link)
    assert resolve(link, "README.md") == ws.resolve() / "README.md"
    assert resolve(link, str(link / "README.md")) == ws.resolve() / "README.md"


ESCAPES = ["../outside/secret.txt", "/etc/passwd", "leak.txt", "outdir/secret.txt", "outdir"]
CALLS = {
    "read_file": lambda p: {"path": p},
    "edit_file": lambda p: {"path": p, "old_str": "TOP", "new_str": "PWNED"},
    "write_file": lambda p: {"path": p, "content": "PWNED"},
    "grep": lambda p: {"pattern": "SECRET", "path": p},
    "glob": lambda p: {"pattern": "*", "path": p},
    "list_dir": lambda p: {"path": p},
}


@pytest.mark.parametrize("tool", sorted(CALLS))
@pytest.mark.parametrize("path", ESCAPES)
def test_tools_refuse_escapes(ctx: ToolContext, outside: Path, tool: str, path: str) -> None:
    res = run_tool(tool, CALLS[tool](path), ctx)
    assert not res.ok
    assert res.meta["error_kind"] == "path_outside", res.error
    assert "SECRET" not in res.output
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"  # nothing written outside


def test_write_through_dangling_symlink_out_is_refused(ctx: ToolContext, ws: Path, outside: Path) -> None:
    os.symlink(outside / "new.txt", ws / "dangling")
    res = run_tool("write_file", {"path": "dangling", "content": "x"}, ctx)
    assert not res.ok and res.meta["error_kind"] == "path_outside"
    assert not (outside / "new.txt").exists()


def test_grep_and_list_dir_do_not_follow_symlinks_out(ctx: ToolContext) -> None:
    res = run_tool("grep", {"pattern": "SECRET"}, ctx)
    assert res.ok and res.meta["count"] == 0
    listing = run_tool("list_dir", {"depth": 3}, ctx)
    assert listing.ok
    assert [e["path"] for e in listing.meta["entries"] if e["path"].startswith("outdir")] == ["outdir"]
    assert "outdir -> " in listing.output


def test_swap_after_resolve_is_caught_on_open(ws: Path, outside: Path) -> None:
    """A folder swapped for a symlink between resolve() and open() (a racing command) is caught
    by the descriptor re-check: no read of the outside file, and a write leaves it intact."""
    from etude.tools.paths import read_bytes, write_bytes

    (ws / "d").mkdir()
    (ws / "d" / "secret.txt").write_text("inside\n")
    real = resolve(ws, "d/secret.txt")
    (ws / "d" / "secret.txt").unlink()
    (ws / "d").rmdir()
    os.symlink(outside, ws / "d")  # the swap
    root = ws.resolve()
    with pytest.raises(ToolError, match="changed to point outside"):
        read_bytes(root, real, 1000)
    with pytest.raises(ToolError, match="changed to point outside"):
        write_bytes(root, real, b"PWNED")
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"
    with pytest.raises(ToolError, match="changed to point outside"):
        write_bytes(root, root / "d" / "new.txt", b"x")  # resolved before the swap: a new file
    assert not (outside / "new.txt").exists()  # nothing created outside
