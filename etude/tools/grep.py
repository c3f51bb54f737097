"""grep: search file contents with ripgrep (`rg --json`), returning structured matches.

ripgrep's defaults hold: .gitignore'd and hidden files are skipped, binary files are skipped,
symlinks are not followed (so a search cannot wander out of the workspace). Matches come in
path order (`--sort path`) so the same search always gives the same observation. At most
`max_results` matches are returned; ripgrep is stopped once one more is seen, and the output
says it was truncated. `pattern` is a Rust regex (ripgrep's syntax error is passed back).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etude.protocols import ToolContext
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, shown
from etude.tools.paths import resolve, workspace_root
from etude.types import ToolResult


def rg_binary() -> str:
    rg = shutil.which("rg") or ("/usr/bin/rg" if os.path.exists("/usr/bin/rg") else None)
    if rg is None:
        raise ToolError("ripgrep (rg) is not installed on this machine; grep and glob need it", kind="unavailable")
    return rg


def _text(field: dict[str, Any]) -> str:
    """ripgrep sends non-UTF-8 data as base64 `bytes` instead of `text`."""
    if "text" in field:
        return field["text"]
    return base64.b64decode(field.get("bytes", "")).decode("utf-8", errors="replace")


def run_rg(argv: list[str], cwd: Path, timeout_s: float, on_line: Callable[[bytes], bool]) -> tuple[int, str, bool]:
    """Run ripgrep, feeding each stdout line to `on_line` until it returns False.

    Returns (exit code, stderr, stopped early). A watchdog kills it after `timeout_s`."""
    # stderr goes to a file: a pipe nobody reads could fill and stall ripgrep.
    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=errf, stdin=subprocess.DEVNULL)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        stopped = False
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                if not on_line(raw):
                    stopped = True
                    proc.kill()
                    break
            code = proc.wait()
        finally:
            timer.cancel()
            proc.stdout.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errf.seek(0)
        err = errf.read().decode("utf-8", errors="replace")
    if code < 0 and not stopped:
        raise ToolError(
            f"search took longer than {timeout_s:g} s and was stopped; narrow the path or glob", kind="timeout"
        )
    return code, err, stopped


class Grep(BaseTool):
    name = "grep"
    schema = function_schema(
        "grep",
        "Search file contents with a regular expression (ripgrep syntax). Returns matching lines "
        "as path:line:text. Skips .gitignore'd, hidden and binary files.",
        {
            "pattern": {"type": "string", "minLength": 1, "description": "regular expression to search for"},
            "path": {"type": "string", "default": ".", "description": "file or folder to search in"},
            "glob": {"type": "string", "description": "only search files matching this glob, e.g. '*.py'"},
            "ignore_case": {"type": "boolean", "default": False, "description": "case-insensitive search"},
            "max_results": {
                "type": "integer",
                "minimum": 1,
                "maximum": 1000,
                "default": 100,
                "description": "most matches to return",
            },
        },
        ["pattern"],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        root = workspace_root(ctx.workspace)
        target = resolve(ctx.workspace, args["path"])
        if not target.exists():
            raise ToolError(f"path not found: {shown(root, target)}", kind="not_found")
        argv = [rg_binary(), "--json", "--no-config", "--sort", "path", "-e", args["pattern"]]
        if args.get("glob"):
            argv.append(f"--glob={args['glob']}")
        if args["ignore_case"]:
            argv.append("--ignore-case")
        # ripgrep matches globs against paths relative to its cwd: I run it from the folder
        # searched, as glob does, so `glob` means the same thing in both tools.
        cwd = target if target.is_dir() else target.parent
        argv += ["--", "." if target.is_dir() else target.name]
        prefix = "" if cwd == root else shown(root, cwd) + "/"
        matches: list[dict[str, Any]] = []
        take = _collector(matches, int(args["max_results"]), prefix, cfg.grep_max_line_chars)
        code, err, truncated = run_rg(argv, cwd, cfg.grep_timeout_s, take)
        if code not in (0, 1) and not truncated:
            raise ToolError(f"grep failed: {_first_lines(err) or f'ripgrep exit code {code}'}", kind="bad_pattern")
        return _result(matches, truncated, args, cfg.max_output_chars)


def _collector(matches: list[dict[str, Any]], limit: int, prefix: str, max_chars: int) -> Callable[[bytes], bool]:
    """A run_rg callback that appends matches (workspace paths) and asks to stop past `limit`."""

    def take(raw: bytes) -> bool:
        msg = json.loads(raw)
        if msg.get("type") != "match":
            return True
        if len(matches) == limit:
            return False
        d = msg["data"]
        text = _text(d["lines"]).rstrip("\r\n")
        if len(text) > max_chars:
            text = text[:max_chars] + " ... [line cut]"
        path = prefix + _text(d["path"]).removeprefix("./")
        matches.append({"path": path, "line": d.get("line_number"), "text": text})
        return True

    return take


def _first_lines(text: str, n: int = 6) -> str:
    return "\n".join(line for line in text.strip().splitlines()[:n])


def _result(matches: list[dict[str, Any]], truncated: bool, args: dict[str, Any], max_chars: int) -> ToolResult:
    files = sorted({m["path"] for m in matches})
    meta = {"matches": matches, "count": len(matches), "files": len(files), "truncated": truncated}
    if not matches:
        return ToolResult(ok=True, output=f"no matches for {args['pattern']!r} in {args['path']}", meta=meta)
    out = "\n".join(f"{m['path']}:{m['line']}:{m['text']}" for m in matches)
    if truncated:
        out += (
            f"\n[truncated: showing the first {len(matches)} matches; narrow the pattern, path or glob, "
            "or raise max_results]"
        )
    if len(out) > max_chars:
        out = out[:max_chars] + "\n[output cut; narrow the search]"
        meta["truncated"] = True
    return ToolResult(ok=True, output=out, meta=meta)


TOOL = Grep()
