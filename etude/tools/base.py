"""What every tool shares: the error a model sees, the config of limits, schema and output helpers.

A tool raises `ToolError` for anything the model should read and act on (file not found,
ambiguous edit, path outside the workspace); `BaseTool.run` turns it into
`ToolResult(ok=False, error=...)`. Nothing here prints. Outputs are bounded by `ToolsConfig`
(etude.protocols; `ctx.config`)
and every cut is marked in the text and flagged in `meta["truncated"]`.
"""

from __future__ import annotations

import os
from typing import Any

from etude.protocols import ToolContext, ToolsConfig
from etude.types import ToolResult


class ToolError(Exception):
    """A failure the model should see as an observation. `kind` classifies it for analysis."""

    def __init__(self, message: str, kind: str = "tool_error", **meta: Any) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.meta = meta


def config_of(ctx: ToolContext) -> ToolsConfig:
    return ctx.config if isinstance(ctx.config, ToolsConfig) else ToolsConfig()


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function schema. Unknown arguments are refused so a model learns the real names."""
    params = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"name": name, "description": description, "parameters": params}


def with_defaults(schema: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """A copy of `args` with each missing argument set to its schema default."""
    out = dict(args)
    for key, prop in schema["parameters"]["properties"].items():
        if key not in out and "default" in prop:
            out[key] = prop["default"]
    return out


class BaseTool:
    """Implements protocols.Tool: subclasses set `name`, `schema` and write `_run`."""

    name: str = ""
    schema: dict[str, Any] = {}

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            return self._run(with_defaults(self.schema, args), ctx)
        except ToolError as e:
            return ToolResult(ok=False, output="", error=e.message, meta={"error_kind": e.kind, **e.meta})

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise NotImplementedError


def os_error(e: OSError, shown_path: str) -> ToolError:
    """An OSError as a model-readable error that names the workspace path, never the host path."""
    reason = e.strerror or type(e).__name__
    return ToolError(f"{reason}: {shown_path}", kind="os_error", errno=e.errno)


def truncate_middle(text: str, max_chars: int) -> tuple[str, int]:
    """Keep the head and the tail of `text`, cut the middle; returns (text, characters cut).

    I keep the tail because that is where test failures and tracebacks end up."""
    if len(text) <= max_chars:
        return text, 0
    head_n = max_chars // 2
    tail_n = max_chars - head_n
    head, tail = text[:head_n], text[len(text) - tail_n :]
    # Cut at line boundaries when one is near, so the marker stands on its own line.
    nl = head.rfind("\n")
    if nl > head_n // 2:
        head = head[: nl + 1]
    nl = tail.find("\n")
    if 0 <= nl < tail_n // 2:
        tail = tail[nl + 1 :]
    cut = len(text) - len(head) - len(tail)
    marker = f"\n... [{cut} characters truncated from the middle] ...\n"
    return head.rstrip("\n") + marker + tail, cut


def truncate_head(text: str, max_chars: int, hint: str = "") -> tuple[str, bool]:
    """Keep the first `max_chars` characters (at a line boundary) and say what was cut."""
    if len(text) <= max_chars:
        return text, False
    head = text[:max_chars]
    nl = head.rfind("\n")
    if nl > max_chars // 2:
        head = head[:nl]
    marker = f"\n... [output truncated at {len(head)} of {len(text)} characters{'; ' + hint if hint else ''}]"
    return head + marker, True


def shown(root: os.PathLike[str] | str, real: os.PathLike[str] | str) -> str:
    """The path as the model should see it: relative to the workspace root ('.' for the root)."""
    rel = os.path.relpath(os.fspath(real), os.fspath(root))
    return rel.replace(os.sep, "/")
