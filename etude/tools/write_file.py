"""write_file: create or overwrite a file with the given content (UTF-8), making parent folders.

The whole file is replaced. Content over `max_file_bytes` is refused, not cut: a half-written
file would be worse than none.
"""

from __future__ import annotations

from typing import Any

from etude.protocols import ToolContext
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, shown
from etude.tools.paths import resolve, workspace_root, write_bytes
from etude.types import ToolResult


class WriteFile(BaseTool):
    name = "write_file"
    schema = function_schema(
        "write_file",
        "Create a file, or replace a whole file, with content. Parent folders are created. "
        "To change part of an existing file, use edit_file.",
        {
            "path": {"type": "string", "description": "file path, relative to the workspace root"},
            "content": {"type": "string", "description": "the complete new file content"},
        },
        ["path", "content"],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        root = workspace_root(ctx.workspace)
        real = resolve(ctx.workspace, args["path"])
        name = shown(root, real)
        if name == ".":
            raise ToolError("path is the workspace root; give a file path", kind="is_directory")
        data = args["content"].encode("utf-8")
        if len(data) > cfg.max_file_bytes:
            raise ToolError(f"content is {len(data)} bytes, over the {cfg.max_file_bytes}-byte limit", kind="too_large")
        created = write_bytes(root, real, data)
        lines = args["content"].count("\n") + (0 if args["content"].endswith("\n") or not data else 1)
        verb = "created" if created else "overwrote"
        meta = {"path": name, "bytes": len(data), "lines": lines, "created": created}
        return ToolResult(
            ok=True, output=f"{verb} {name} ({len(data)} bytes, {lines} line{'' if lines == 1 else 's'})", meta=meta
        )


TOOL = WriteFile()
