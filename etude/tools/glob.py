"""glob: list files whose paths match a glob pattern, using ripgrep's matcher (`rg --files`).

Semantics are ripgrep's (the same as `.gitignore` lines): a pattern without "/" matches file
names at any depth ("*.py" finds every Python file); a pattern with "/" is matched against the
path from `path` ("src/*.py", "tests/**/test_*.py"); "{a,b}" alternatives work. Only files are
listed, not folders; .gitignore'd and hidden files are skipped and symlinks are not followed,
as in grep. Results are sorted by path and capped at `glob_max_results`.
"""

from __future__ import annotations

from typing import Any

from etude.protocols import ToolContext
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, shown, truncate_head
from etude.tools.grep import rg_binary, run_rg
from etude.tools.paths import WORKSPACE_MOUNT, resolve, workspace_root
from etude.types import ToolResult


class Glob(BaseTool):
    name = "glob"
    schema = function_schema(
        "glob",
        "Find files by path pattern, e.g. '*.py' (any depth), 'src/**/*.ts', 'tests/test_*.py'. "
        "Returns matching file paths, sorted.",
        {
            "pattern": {"type": "string", "minLength": 1, "description": "glob pattern"},
            "path": {"type": "string", "default": ".", "description": "folder to search from"},
        },
        ["pattern"],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        root = workspace_root(ctx.workspace)
        base = resolve(ctx.workspace, args["path"])
        if not base.is_dir():
            kind = "not_found" if not base.exists() else "not_a_directory"
            raise ToolError(f"{shown(root, base)} is not a folder in the workspace", kind=kind)
        pattern = _pattern(args["pattern"])
        prefix = "" if base == root else shown(root, base) + "/"
        files: list[str] = []
        limit = cfg.glob_max_results

        def take(raw: bytes) -> bool:
            if len(files) == limit:
                return False
            files.append(prefix + raw.decode("utf-8", errors="replace").rstrip("\n").removeprefix("./"))
            return True

        # ripgrep matches globs against paths relative to its cwd, so I run it from `base`.
        argv = [rg_binary(), "--files", "--no-config", "--sort", "path", f"--glob={pattern}"]
        code, err, truncated = run_rg(argv, base, cfg.grep_timeout_s, take)
        if code not in (0, 1) and not truncated:
            raise ToolError(f"glob failed: {err.strip().splitlines()[0] if err.strip() else code}", kind="bad_pattern")
        return _result(files, truncated, args, cfg.max_output_chars)


def _result(files: list[str], truncated: bool, args: dict[str, Any], max_chars: int) -> ToolResult:
    if not files:
        meta = {"files": [], "count": 0, "truncated": False}
        return ToolResult(ok=True, output=f"no files match {args['pattern']!r} in {args['path']}", meta=meta)
    out = "\n".join(files)
    if truncated:
        out += f"\n[truncated: showing the first {len(files)} files; use a narrower pattern or path]"
    out, cut = truncate_head(out, max_chars, "use a narrower pattern or path")
    return ToolResult(ok=True, output=out, meta={"files": files, "count": len(files), "truncated": truncated or cut})


def _pattern(pattern: str) -> str:
    """Accept '/workspace/...' patterns (what the sandbox prints); refuse other absolute ones."""
    if pattern.startswith(WORKSPACE_MOUNT + "/"):
        return pattern[len(WORKSPACE_MOUNT) + 1 :]
    if pattern.startswith("/"):
        raise ToolError("pattern must be relative to the workspace (or start with /workspace/)", kind="path_outside")
    if ".." in pattern.split("/"):
        raise ToolError("pattern may not use '..'; give a path inside the workspace", kind="path_outside")
    return pattern


TOOL = Glob()
