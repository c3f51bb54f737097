"""The agent's prompt: system text, tool schemas rendered for models without native tools, and the
first messages of an episode. The server reuses these so production and training see the same
prompt (README.md, docs/harness.md: no gap between the two).

Guarantees: rendering is deterministic (schemas are dumped with sorted keys) so the same tools
give byte-identical prompts. It does not check that schemas are valid JSON schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from etude.toolcalls import CLOSE_TAG, MISTRAL_TAG, OPEN_TAG, PYTHON_TAG, render_calls
from etude.types import Message, ToolCall

SUBMIT = "submit"

# The `submit` pseudo-tool: the harness handles it itself (it never reaches etude.tools).
SUBMIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SUBMIT,
        "description": "Finish the task. Call this once your changes are complete (and tested, when tests exist). "
        "Nothing after it in the same reply is run.",
        "parameters": {
            "type": "object",
            "properties": {"message": {"type": "string", "description": "A short summary of what you changed."}},
            "required": [],
        },
    },
}

DEFAULT_SYSTEM_PROMPT = """You are a coding agent working in a software repository at /workspace.
Use the tools to look at the code, make the change the user asks for, and check it (run the tests when there are any).
Make the smallest change that does the job and keep to the repository's style.
Paths are relative to the repository root. Several independent tool calls may go in one reply; they run in parallel.
When you are done, call `submit` with a short summary, or reply with your answer and no tool call."""


def render_tools_prompt(tool_schemas: Sequence[dict[str, Any]], style: str = "compact", fmt: str = "hermes") -> str:
    """System-prompt text that offers `tool_schemas` (OpenAI format) to a model without native
    tool support, and says how to call them in text format `fmt` (etude.toolcalls.TEXT_FORMATS):
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (hermes), `[TOOL_CALLS][{"name": ...,
    "arguments": {...}}]` (mistral) or `{"name": ..., "parameters": {...}}` (llama3_json).

    style "json" lists each schema as JSON; "compact" gives one line per tool,
    `name(arg: type, optional?: type): first sentence of the description` — about a quarter of the
    tokens, which is what a small model on a CPU can afford to read on every turn."""
    if style == "compact":
        lines = [_compact(_function(s)) for s in tool_schemas]
        intro = "You can call these tools (arguments marked ? are optional):"
    else:
        lines = [json.dumps(_function(s), sort_keys=True, ensure_ascii=False) for s in tool_schemas]
        intro = "You can call these tools. Their signatures, as JSON schema, one per line:"
    return "\n".join(["# Tools", "", intro, "<tools>", *lines, "</tools>", "", *_how_to_call(fmt),
                      "The results come back in the next message."])


def _how_to_call(fmt: str) -> list[str]:
    if fmt == "mistral":
        example = json.dumps([{"name": "<tool name>", "arguments": {"<argument>": "<value>"}}])
        return [f"To call tools, write {MISTRAL_TAG} followed by a JSON list of objects with each call's name and "
                "arguments:", MISTRAL_TAG + example,
                "Use strict JSON (double quotes, no trailing commas). Several calls go in the one list."]
    if fmt == "llama3_json":
        example = json.dumps({"name": "<tool name>", "parameters": {"<argument>": "<value>"}})
        return ["To call a tool, reply with only a JSON object with its name and parameters (optionally after "
                f"{PYTHON_TAG}):", example,
                'Use strict JSON (double quotes, no trailing commas). Separate several calls with "; ".']
    example = json.dumps({"name": "<tool name>", "arguments": {"<argument>": "<value>"}})
    return [f"To call a tool, write a JSON object with its name and arguments between {OPEN_TAG} and {CLOSE_TAG} tags:",
            OPEN_TAG, example, CLOSE_TAG,
            "Use strict JSON (double quotes, no trailing commas). You may write several such blocks in one reply."]


def _compact(fn: dict[str, Any]) -> str:
    params = fn.get("parameters") or {}
    required = set(params.get("required") or ())
    args = ", ".join(
        f"{name}{'' if name in required else '?'}: {spec.get('type', 'any')}"
        for name, spec in (params.get("properties") or {}).items()
    )
    desc = (fn.get("description") or "").strip()
    first = re.split(r"(?<!e\.g)(?<!i\.e)\.\s", desc)[0].rstrip(".")
    return f"- {fn['name']}({args}): {first}." if first else f"- {fn['name']}({args})"


def _function(schema: dict[str, Any]) -> dict[str, Any]:
    # Accept both {"type": "function", "function": {...}} and the bare function object.
    return schema.get("function", schema) if isinstance(schema.get("function"), dict) else schema


def render_tool_calls_text(calls: Iterable[ToolCall], fmt: str = "hermes") -> str:
    """The canonical text form of tool calls in `fmt` (what a text-format model is trained to write)."""
    return render_calls(list(calls), fmt)


def system_prompt(tool_schemas: Sequence[dict[str, Any]], *, native_tools: bool, override: str | None = None,
                  tool_prompt: str = "compact", fmt: str = "hermes") -> str:
    """The system message: `override` or the default text, plus the tool block for text-format models."""
    base = override if override is not None else DEFAULT_SYSTEM_PROMPT
    if native_tools or not tool_schemas:
        return base
    return f"{base}\n\n{render_tools_prompt(tool_schemas, tool_prompt, fmt)}"


def build_messages(
    request: str,
    tool_schemas: Sequence[dict[str, Any]],
    *,
    native_tools: bool,
    system: str | None = None,
    history: Sequence[Message] = (),
    tool_prompt: str = "compact",
    fmt: str = "hermes",
) -> list[Message]:
    """The opening of an episode: system prompt, earlier conversation (`history`, without its
    own system message), then the user's request. `fmt`: the text tool format the tools block
    teaches (etude.toolcalls.TEXT_FORMATS)."""
    sys_text = system_prompt(tool_schemas, native_tools=native_tools, override=system, tool_prompt=tool_prompt, fmt=fmt)
    msgs = [Message(role="system", content=sys_text)]
    msgs.extend(m for m in history if m.role != "system")
    msgs.append(Message(role="user", content=request))
    return msgs
