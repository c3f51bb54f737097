"""list_dir: a folder's tree, `depth` levels deep, folders first, names sorted.

Folders end in "/", symlinks are shown as "name -> target" and never followed (so listing
cannot leave the workspace). Hidden files are shown. Bulky folders (.git, node_modules,
virtual environments, caches) are listed but not expanded. At most `list_max_entries` entries.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from etude.protocols import ToolContext
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, shown, truncate_head
from etude.tools.paths import resolve, workspace_root
from etude.types import ToolResult

NOT_EXPANDED = frozenset(
    {".git", ".hg", ".svn", "node_modules", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
     ".pytest_cache", ".ruff_cache", ".eggs", "build", "dist", ".cache"}
)  # fmt: skip


class ListDir(BaseTool):
    name = "list_dir"
    schema = function_schema(
        "list_dir",
        "List a folder as a tree (folders end in '/'), depth levels deep.",
        {
            "path": {"type": "string", "default": ".", "description": "folder, relative to the workspace root"},
            "depth": {"type": "integer", "minimum": 1, "maximum": 10, "default": 2, "description": "levels to show"},
        },
        [],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        root = workspace_root(ctx.workspace)
        base = resolve(ctx.workspace, args["path"])
        name = shown(root, base)
        if not base.exists():
            raise ToolError(f"folder not found: {name}", kind="not_found")
        if not base.is_dir():
            raise ToolError(f"{name} is a file, not a folder; use read_file to read it", kind="not_a_directory")
        rows: list[str] = []
        entries: list[dict[str, Any]] = []
        truncated = _walk(base, root, int(args["depth"]), 0, rows, entries, cfg.list_max_entries)
        out = (name.rstrip("/") + "/\n" if name != "." else "./\n") + ("\n".join(rows) if rows else "  [empty folder]")
        if truncated:
            out += f"\n[truncated at {cfg.list_max_entries} entries; list a subfolder or use a smaller depth]"
        out, cut = truncate_head(out, cfg.max_output_chars, "list a subfolder")
        return ToolResult(ok=True, output=out, meta={"path": name, "entries": entries, "truncated": truncated or cut})


def _scan(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            items = list(it)
    except OSError:
        return []
    return sorted(items, key=lambda e: (not e.is_dir(follow_symlinks=False), e.name))


def _walk(
    folder: Path, root: Path, depth: int, level: int, rows: list[str], entries: list[dict[str, Any]], limit: int
) -> bool:
    """Appends rows for `folder`'s children; returns True when the entry limit cut the listing."""
    for e in _scan(folder):
        if len(entries) >= limit:
            return True
        pad = "  " * (level + 1)
        rel = shown(root, e.path)
        if e.is_symlink():
            target = _readlink(e.path)
            rows.append(f"{pad}{e.name} -> {target}")
            entries.append({"path": rel, "type": "symlink", "target": target})
        elif e.is_dir(follow_symlinks=False):
            skip = e.name in NOT_EXPANDED and level + 1 < depth
            rows.append(f"{pad}{e.name}/" + ("  [not expanded]" if skip else ""))
            entries.append({"path": rel, "type": "dir"})
            if level + 1 < depth and not skip and _walk(Path(e.path), root, depth, level + 1, rows, entries, limit):
                return True
        else:
            size = _size(e)
            rows.append(f"{pad}{e.name}")
            entries.append({"path": rel, "type": "file", "size": size})
    return False


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"  # removed while we listed


def _size(e: os.DirEntry[str]) -> int | None:
    try:
        return e.stat(follow_symlinks=False).st_size
    except OSError:
        return None


TOOL = ListDir()
