"""`etude tool NAME --workspace DIR --args JSON`: run one tool, print its ToolResult as JSON.

`etude tool NAME --schema` prints that tool's schema; `etude tool all --schema` prints every
available tool's schema in OpenAI format (what a prompt or a server offers the model).

Exit 0 whenever the tool ran (its `ok` may be false); exit 2 (EtudeError) only for misuse of
the command: an unknown tool, `--args` that is not a JSON object, a missing workspace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError
from etude.protocols import ToolContext
from etude.tools import available, get_tool, run_tool, tool_schemas


def _parse_args(text: str) -> dict:
    if text == "-":
        text = sys.stdin.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise EtudeError(f"--args is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise EtudeError(f"--args must be a JSON object, got {type(value).__name__}")
    return value


def register(app: typer.Typer) -> None:
    @app.command("tool")
    def tool(
        name: Annotated[
            str,
            typer.Argument(
                help="read_file, edit_file, write_file, grep, glob, list_dir, run_terminal, or 'all' with --schema"
            ),
        ],
        workspace: Annotated[Path | None, typer.Option("--workspace", help="the folder the tool works in")] = None,
        args: Annotated[str, typer.Option("--args", help="the arguments, a JSON object ('-': read stdin)")] = "{}",
        schema: Annotated[bool, typer.Option("--schema", help="print the tool's JSON schema, do not run it")] = False,
    ) -> None:
        """Run one agent tool on a workspace and print {"ok", "output", "error", "meta"} as JSON."""
        if schema and name == "all":
            print(json.dumps(tool_schemas(), indent=2))  # OpenAI format, every available tool
            return
        if name not in available():
            raise EtudeError(f"unknown tool {name!r}; available tools: {', '.join(available())}")
        if schema:
            print(json.dumps(get_tool(name).schema, indent=2))
            return
        if workspace is None:
            raise EtudeError("--workspace DIR is required")
        if not workspace.is_dir():
            raise EtudeError(f"workspace {workspace} is not a folder")
        result = run_tool(name, _parse_args(args), ToolContext(workspace=workspace.resolve()))
        print(json.dumps(result.to_dict(), ensure_ascii=False))
