"""read_file: a text file, or a range of its lines, with line numbers.

Lines are numbered from 1 like `cat -n` ("{n:>6}\\t{text}"), counted on "\\n" only (so numbers
agree with grep and editors). Output is bounded: at most `read_max_lines` lines and
`read_max_line_chars` characters per line, with a marker saying how to read the rest. CRLF
lines are shown without the "\\r". Binary files (a NUL byte in the first 8 KiB) are refused;
invalid UTF-8 is shown with U+FFFD.
"""

from __future__ import annotations

from typing import Any

from etude.protocols import ToolContext
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, shown
from etude.tools.paths import read_bytes, resolve, workspace_root
from etude.types import ToolResult


def split_lines(text: str) -> list[str]:
    """Lines without their "\\n"; a final newline does not start an extra empty line."""
    if not text:
        return []
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


class ReadFile(BaseTool):
    name = "read_file"
    schema = function_schema(
        "read_file",
        "Read a text file from the workspace, with line numbers. Give start_line/end_line "
        "(1-based, inclusive) to read part of a long file.",
        {
            "path": {"type": "string", "description": "file path, relative to the workspace root"},
            "start_line": {"type": "integer", "minimum": 1, "description": "first line to show (1-based)"},
            "end_line": {"type": "integer", "minimum": 1, "description": "last line to show (inclusive)"},
        },
        ["path"],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        root = workspace_root(ctx.workspace)
        real = resolve(ctx.workspace, args["path"])
        name = shown(root, real)
        data = read_bytes(root, real, cfg.max_file_bytes)
        if b"\x00" in data[:8192]:
            raise ToolError(f"{name} looks binary (it has NUL bytes); read_file shows text files only", kind="binary")
        lines = split_lines(data.decode("utf-8", errors="replace"))
        start, end = _line_range(args, len(lines), name)
        last = min(end, start + cfg.read_max_lines - 1)
        body, shown_end, cut_lines = _number(lines, start, last, cfg.read_max_line_chars, cfg.max_output_chars)
        notes = _notes(cut_lines, cfg.read_max_line_chars, start, shown_end, end, len(lines))
        output = "\n".join([body if lines else "[empty file]", *notes])
        meta = {
            "path": name,
            "start_line": start,
            "end_line": shown_end if lines else 0,
            "total_lines": len(lines),
            "bytes": len(data),
            "truncated": bool(notes),
        }
        return ToolResult(ok=True, output=output, meta=meta)


def _notes(cut_lines: int, max_chars: int, start: int, shown_end: int, end: int, total: int) -> list[str]:
    """The markers under the numbered lines: what was cut and how to read the rest."""
    notes = []
    if cut_lines:
        notes.append(f"[{cut_lines} long line(s) cut at {max_chars} characters]")
    if shown_end < end:
        notes.append(
            f"[truncated: showing lines {start}-{shown_end} of {total}; read more with start_line={shown_end + 1}]"
        )
    return notes


def _line_range(args: dict[str, Any], total: int, name: str) -> tuple[int, int]:
    start = int(args.get("start_line") or 1)
    if total and start > total:
        raise ToolError(f"start_line {start} is past the end of {name} ({total} lines)", kind="bad_range")
    end = int(args.get("end_line") or max(total, 1))
    if end < start:
        raise ToolError(f"end_line {end} is before start_line {start}", kind="bad_range")
    return start, min(end, max(total, 1))


def _number(lines: list[str], start: int, end: int, max_chars: int, budget: int) -> tuple[str, int, int]:
    """Numbered lines start..end, stopping early when the output budget is spent.
    Returns (text, last line shown, lines cut)."""
    out, cut, used, last = [], 0, 0, start - 1
    for n in range(start, min(end, len(lines)) + 1):
        text = lines[n - 1].removesuffix("\r")  # CRLF files show clean lines; edit_file copes
        if len(text) > max_chars:
            text = text[:max_chars] + f" ... [line cut, {len(text)} characters]"
            cut += 1
        row = f"{n:>6}\t{text}"
        if out and used + len(row) + 1 > budget:
            break
        out.append(row)
        used += len(row) + 1
        last = n
    return "\n".join(out), max(last, start), cut


TOOL = ReadFile()
