"""The agent's tools, by name, with their JSON schemas; `run_tool` is the one entry point.

    from etude.tools import get_tool, run_tool, tool_schemas, TOOL_NAMES
    res = run_tool("read_file", {"path": "a.py"}, ToolContext(workspace=ws))

`run_tool` never raises: an unknown tool, arguments that fail the tool's JSON schema, a
`ToolError` and any other exception all come back as `ToolResult(ok=False, error=...)` with a
message a model can act on, and `meta["error_kind"]` saying which ("unknown_tool",
"invalid_arguments", "path_outside", "exception", ...). Each tool lives in its own module,
`etude.tools.<name>`, exposing `TOOL`; modules are imported on first use, so importing this
package is cheap. `semantic_search` is another engineer's module: it is offered when
`etude/tools/semantic_search.py` exists and is left out of `available()` otherwise.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
from functools import lru_cache
from typing import Any

from etude.protocols import Tool, ToolContext
from etude.tools.base import ToolError, config_of, truncate_middle
from etude.types import ToolResult

TOOL_NAMES: tuple[str, ...] = (
    "read_file",
    "edit_file",
    "write_file",
    "grep",
    "glob",
    "list_dir",
    "run_terminal",
    "semantic_search",
)

_cache: dict[str, Tool] = {}


class UnknownTool(ToolError, KeyError):
    def __init__(self, name: object) -> None:
        super().__init__(f"unknown tool {name!r}; available tools: {', '.join(available())}", kind="unknown_tool")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


def available() -> list[str]:
    """The names in TOOL_NAMES whose module is present."""
    return [n for n in TOOL_NAMES if n in _cache or importlib.util.find_spec(f"etude.tools.{n}") is not None]


def get_tool(name: str) -> Tool:
    """The tool object for `name`; raises UnknownTool (a ToolError and a KeyError) otherwise."""
    if isinstance(name, str) and name in _cache:
        return _cache[name]
    if not isinstance(name, str) or name not in TOOL_NAMES or name not in available():
        raise UnknownTool(name)
    tool = importlib.import_module(f"etude.tools.{name}").TOOL
    _cache[name] = tool
    return tool


def tool_schemas(names: list[str] | tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """OpenAI-format schemas: [{"type": "function", "function": {"name", "description", "parameters"}}].

    `names=None` means every available tool; naming a missing tool raises UnknownTool."""
    return [{"type": "function", "function": get_tool(n).schema} for n in (available() if names is None else names)]


def run_tool(name: str, args: Any, ctx: ToolContext) -> ToolResult:
    """Run one tool call. Never raises (see the module docstring)."""
    try:
        tool = get_tool(name)
        args = _decode_args(args)
        problems = validate(args, tool.schema["parameters"])
        if problems:
            return ToolResult.fail(
                f"invalid arguments for {name}: " + "; ".join(problems) + _other_tool(name, args, tool),
                error_kind="invalid_arguments",
            )
        result = tool.run(args, ctx)
        if not isinstance(result, ToolResult):
            return ToolResult.fail(f"{name} returned {type(result).__name__}, not a ToolResult", error_kind="exception")
        return _bounded(result, config_of(ctx).max_output_chars)
    except ToolError as e:
        return ToolResult.fail(e.message, error_kind=e.kind, **e.meta)
    except Exception as e:  # noqa: BLE001 - the point of run_tool: the agent loop never sees an exception
        return ToolResult.fail(f"{name} failed: {type(e).__name__}: {e}", error_kind="exception")


def _other_tool(name: str, args: dict[str, Any], tool: Tool) -> str:
    """A hint when the arguments are another tool's, whole: arguments this tool does not take,
    and another tool that takes every one of them and needs no more (a small model writes an
    edit's old_str/new_str under the name read_file). "" otherwise."""
    if not set(args) - set(tool.schema["parameters"].get("properties", {})):
        return ""
    for other in available():
        if other == name:
            continue
        try:
            params = get_tool(other).schema["parameters"]
        except Exception:  # noqa: BLE001 - a tool that cannot load must not hide this call's own error
            continue
        if set(args) <= set(params.get("properties", {})) and set(params.get("required", ())) <= set(args):
            return f"; these are {other}'s arguments: to use them, call {other}"
    return ""


def _bounded(result: ToolResult, max_chars: int) -> ToolResult:
    """A safety net for tools that do not bound their own output (ours do, within a marker's
    length): the middle of anything longer than `max_chars` + 2,000 is cut."""
    if len(result.output) <= max_chars + 2000:
        return result
    text, _ = truncate_middle(result.output, max_chars)
    return dataclasses.replace(result, output=text, meta={**result.meta, "truncated": True})


def run_call(call: Any, ctx: ToolContext) -> ToolResult:
    """Run a call given as a `ToolCall` or as `{"name": ..., "arguments": {...}}`. Never raises."""
    if isinstance(call, dict):
        if not isinstance(call.get("name"), str):
            return ToolResult.fail('a tool call needs a "name" string', error_kind="invalid_call")
        return run_tool(call["name"], call.get("arguments"), ctx)
    name, args = getattr(call, "name", None), getattr(call, "arguments", None)
    if not isinstance(name, str):
        return ToolResult.fail(f"not a tool call: {type(call).__name__}", error_kind="invalid_call")
    return run_tool(name, args, ctx)


def _decode_args(args: Any) -> dict[str, Any]:
    """Arguments as a dict. A JSON string is decoded (some backends send the raw string)."""
    if args is None:
        return {}
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ToolError(f"arguments are not valid JSON: {e}", kind="invalid_arguments") from None
    if not isinstance(args, dict):
        raise ToolError(f"arguments must be a JSON object, got {type(args).__name__}", kind="invalid_arguments")
    return args


def validate(args: dict[str, Any], parameters: dict[str, Any]) -> list[str]:
    """Problems with `args` against a JSON schema, one short sentence each (empty: valid)."""
    errors = sorted(
        _validator(json.dumps(parameters, sort_keys=True)).iter_errors(args), key=lambda e: list(e.absolute_path)
    )
    return [_describe(e, parameters) for e in errors]


@lru_cache(maxsize=64)
def _validator(parameters_json: str) -> Any:
    from jsonschema import Draft202012Validator  # lazily: keeps `import etude.tools` cheap

    return Draft202012Validator(json.loads(parameters_json))


def _describe(err: Any, parameters: dict[str, Any]) -> str:
    where = ".".join(str(p) for p in err.absolute_path)
    known = ", ".join(parameters.get("properties", {}))
    if err.validator == "required":
        return f"missing required argument {err.message.split(' ')[0]}"
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(parameters.get("properties", {})))
        return f"unknown argument(s) {', '.join(map(repr, extra))} (expected: {known})"
    if err.validator == "type":
        return f"argument {where!r} must be of type {err.validator_value}, got {json.dumps(err.instance, default=repr)[:60]}"
    message = err.message if len(err.message) <= 200 else err.message[:200] + "..."
    return f"argument {where!r}: {message}"
