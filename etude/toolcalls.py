"""Turn model output into tool calls: `<tool_call>{json}</tool_call>` text, OpenAI `tool_calls`,
and the native text formats of two more model families: Mistral's `[TOOL_CALLS]` and Llama 3.x's
JSON (`{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`).

What this guarantees: every call the model attempted ends up either as a well-formed `ToolCall`
(name is a non-empty string, arguments a JSON object) or as one error string that says what was
wrong in a way a model can act on. Nothing is dropped silently and nothing raises.

Decisions (documented in docs/harness.md):
- JSON is parsed strictly. Trailing commas, single quotes, comments, Python literals are errors,
  not silently repaired: the model sees the error and RL sees a broken call, so the format the
  model learns is the one servers emit.
- `arguments` given as a JSON *string* (OpenAI style) is accepted and decoded.
- A missing closing `</tool_call>` is accepted when the block's JSON is complete (servers often
  stop generation at `</tool_call>` and strip it); anything after the JSON goes back to text.
- Code fences inside a block (```json ... ```) are stripped before decoding.
- Unknown tool names are errors only when the caller passes `tools=`; the harness instead lets
  execution refuse them so the refusal carries the call id (see loop.py).

- "mistral": text after `[TOOL_CALLS]` is either a JSON list of `{"name", "arguments"}` (the v3
  tokenizer's form) or `name[ARGS]{json}` (with `[CALL_ID]id` before `[ARGS]` in some versions),
  one per `[TOOL_CALLS]`; the text before the first marker is the free text.
- "llama3_json": an output that starts with `<|python_tag|>` or `{` is calls: JSON objects with
  "name" and "parameters" (or "arguments"), several separated by ";". Anything else is text.
- `template_format(chat_template)` says which text format a model's chat template writes.

What it does not do: guess calls from bare JSON outside `<tool_call>` tags (except in the
"llama3_json" format, where that is the format), or accept `<function=...>` and other vendor
formats.

It sits at the bottom layer, beside `types`: policy backends (which decode native OpenAI
`tool_calls`) and the harness (which parses text) both read it; `etude.harness` re-exports it.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Sequence
from typing import Any, Literal

from etude.types import ParseResult, ToolCall

Format = Literal["auto", "openai", "hermes", "mistral", "llama3_json"]
FORMATS: tuple[str, ...] = ("auto", "openai", "hermes", "mistral", "llama3_json")
TEXT_FORMATS: tuple[str, ...] = ("hermes", "mistral", "llama3_json")
MISTRAL_TAG = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
# the tag that opens a call in each text format (Llama 3.x's is optional: a reply opening with `{` is one too)
CALL_TAG = {"hermes": OPEN_TAG, "mistral": MISTRAL_TAG, "llama3_json": PYTHON_TAG}
_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n?(.*?)\n?[ \t]*```$", re.DOTALL)
_EMPTY_FENCE = re.compile(r"```[\w+-]*\s*```")
_TRAILING_COMMA = re.compile(r",\s*[}\]]")
_SNIPPET = 80


def parse_output(
    text: str, fmt: str = "auto", *, tools: Collection[str] | None = None, id_prefix: str = "call_"
) -> ParseResult:
    """Read one model output. `fmt`: "hermes" (`<tool_call>` text), "mistral", "llama3_json" (the
    families' native text), "openai" (a chat-completions response, message, or `tool_calls` list
    as JSON), or "auto" (openai when the text is such JSON, hermes otherwise). With `tools`, calls
    to other names are errors."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt in TEXT_FORMATS:
        return parse_text(text, fmt, tools=tools, id_prefix=id_prefix)
    obj = _openai_json(text)
    if fmt == "openai" and obj is None:
        return ParseResult(text=text, errors=("output is not an OpenAI message, response or tool_calls list as JSON",))
    if obj is None:
        return parse_hermes(text, tools=tools, id_prefix=id_prefix)
    return _parse_openai_obj(obj, tools=tools)


def parse_text(text: str, fmt: str = "hermes", *, tools: Collection[str] | None = None,
               id_prefix: str = "call_") -> ParseResult:
    """One text-format output in `fmt` (one of TEXT_FORMATS)."""
    if fmt == "mistral":
        return parse_mistral(text, tools=tools, id_prefix=id_prefix)
    if fmt == "llama3_json":
        return parse_llama3_json(text, tools=tools, id_prefix=id_prefix)
    if fmt != "hermes":
        raise ValueError(f"unknown text format {fmt!r}; expected one of {', '.join(TEXT_FORMATS)}")
    return parse_hermes(text, tools=tools, id_prefix=id_prefix)


@functools.lru_cache(maxsize=32)
def template_format(chat_template: str | None) -> str:
    """The text format a chat template writes assistant tool calls in: "mistral" when it emits
    `[TOOL_CALLS]`, "llama3_json" when it is a Llama 3.x template that offers tools (its
    `<|python_tag|>` or `"parameters"` calls), "hermes" otherwise (a `<tool_call>` template, or one
    that writes no tool calls: etude then teaches `<tool_call>` in the system prompt)."""
    t = chat_template or ""
    if MISTRAL_TAG in t:
        return "mistral"
    if "<|start_header_id|>" in t and (PYTHON_TAG in t or '"parameters"' in t) and OPEN_TAG not in t:
        return "llama3_json"
    return "hermes"


def text_format_of(model: Any) -> str:
    """The text tool format of a policy or tokenizer: `template_format` of its chat template
    ("hermes" when it has none, e.g. a remote model behind an OpenAI API)."""
    for _ in range(4):  # a wrapper (a batcher's view, an adapter's view) holds the policy that has one
        if isinstance(template := getattr(getattr(model, "tokenizer", model), "chat_template", None), str):
            return template_format(template)
        model = getattr(model, "inner", None) or getattr(model, "base", None) or getattr(model, "policy", None)
        if model is None:
            break
    return "hermes"


def render_calls(calls: Sequence[ToolCall], fmt: str = "hermes") -> str:
    """Calls as a text-format model writes them in `fmt` (what `parse_text` reads back)."""
    if not calls:
        return ""
    if fmt == "mistral":
        return MISTRAL_TAG + json.dumps([{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False)
    if fmt == "llama3_json":
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)
    return "\n".join(f"{OPEN_TAG}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n{CLOSE_TAG}"
                     for c in calls)


def writes_calls(text: str, fmt: str = "hermes") -> bool:
    """Whether `text` already holds calls in `fmt`'s syntax (so they need not be rendered again)."""
    if fmt == "llama3_json":
        return text.strip().startswith((PYTHON_TAG, "{"))
    return CALL_TAG[fmt] in text


# ---------------------------------------------------------------- hermes: <tool_call>{json}</tool_call>


def parse_hermes(text: str, *, tools: Collection[str] | None = None, id_prefix: str = "call_") -> ParseResult:
    """Parse every `<tool_call>` block of `text`; the rest is the free text."""
    calls: list[ToolCall] = []
    errors: list[str] = []
    pieces: list[str] = []
    for kind, body, closed in _blocks(text):
        if kind == "text":
            pieces.append(body)
            continue
        call, err = _decode_block(body, closed, f"{id_prefix}{len(calls) + len(errors)}", tools)
        if err:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {err}")
        if call:
            calls.append(call)
    stray = [p for p in pieces if CLOSE_TAG in p]
    if stray:
        errors.append(f"found {CLOSE_TAG} without an opening {OPEN_TAG}; wrap each call as {OPEN_TAG}{{...}}{CLOSE_TAG}")
    return ParseResult(text=_join_text(pieces), tool_calls=tuple(calls), errors=tuple(errors))


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """Split into ("text", s, True) and ("call", body, closed) pieces."""
    out: list[tuple[str, str, bool]] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) != -1:
        out.append(("text", text[pos:start], True))
        body_start = start + len(OPEN_TAG)
        body_end, closed, pos = _json_extent(text, body_start) or _tag_extent(text, body_start)
        out.append(("call", text[body_start:body_end], closed))
    out.append(("text", text[pos:], True))
    return out


def _json_extent(text: str, body_start: int) -> tuple[int, bool, int] | None:
    """When a block starts with a complete JSON object, it ends where that object ends, even if
    a string inside it holds "</tool_call>" (a file's content, say). -> (body end, closed, next pos)."""
    i = body_start
    while i < len(text) and text[i].isspace():
        i += 1
    if not text.startswith("{", i):
        return None
    try:
        _, end = json.JSONDecoder().raw_decode(text, i)
    except json.JSONDecodeError:
        return None
    after = end
    while after < len(text) and text[after].isspace():
        after += 1
    if text.startswith(CLOSE_TAG, after):
        return end, True, after + len(CLOSE_TAG)
    close, nxt = text.find(CLOSE_TAG, after), text.find(OPEN_TAG, after)
    if close != -1 and (nxt == -1 or close < nxt):
        return None  # more than one value before the closing tag: let strict decoding say so
    return end, False, end  # unclosed but complete: what follows is text (or the next block)


def _tag_extent(text: str, body_start: int) -> tuple[int, bool, int]:
    """Otherwise the block runs to its closing tag, or, without one, to the next opening tag or
    the end of the text."""
    end = text.find(CLOSE_TAG, body_start)
    nxt = text.find(OPEN_TAG, body_start)
    if end != -1 and (nxt == -1 or end < nxt):
        return end, True, end + len(CLOSE_TAG)
    stop = nxt if nxt != -1 else len(text)
    return stop, False, stop


def _decode_block(body: str, closed: bool, call_id: str, tools: Collection[str] | None) -> tuple[ToolCall | None, str | None]:
    src = _strip_fence(body.strip())
    if not src:
        return None, f"empty {OPEN_TAG} block"
    try:
        obj = json.loads(src)
    except json.JSONDecodeError as e:
        hint = "" if closed else f" (and the block has no closing {CLOSE_TAG})"
        return None, _json_error(e, src) + hint
    return _call_from_obj(obj, call_id, tools)


def _strip_fence(s: str) -> str:
    m = _FENCE.match(s)
    return m.group(1).strip() if m else s


def _json_error(e: json.JSONDecodeError, src: str) -> str:
    hints = []
    if _TRAILING_COMMA.search(src):
        hints.append("trailing comma")
    if src[e.pos : e.pos + 1] == "'":
        hints.append("single quotes")
    if e.msg.startswith("Expecting ',' delimiter") and src[e.pos - 1 : e.pos] == '"' and src[e.pos : e.pos + 1] not in '"\n ':
        # the string before e.pos was closed early: code in old_str/new_str with a bare `"` in it
        hints.append('a " inside a string left unescaped (write it as \\")')
    hint = f" (looks like {' and '.join(hints)}; use strict JSON)" if hints else ""
    return f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}{hint} in {_snippet(src)}"


def _snippet(s: str) -> str:
    s = " ".join(s.split())
    return repr(s if len(s) <= _SNIPPET else s[: _SNIPPET - 3] + "...")


def _join_text(pieces: Sequence[str]) -> str:
    text = "\n".join(p.strip() for p in pieces if p.strip())
    return _EMPTY_FENCE.sub("", text).strip()  # a fence that only held calls leaves nothing behind


# ---------------------------------------------------------------- mistral: [TOOL_CALLS]...


_MISTRAL_NAMED = re.compile(r"\s*([A-Za-z_][\w.-]*)\s*(?:\[CALL_ID\]\s*([A-Za-z0-9_-]*)\s*)?\[ARGS\]")


def parse_mistral(text: str, *, tools: Collection[str] | None = None, id_prefix: str = "call_") -> ParseResult:
    """Parse Mistral's native calls: `[TOOL_CALLS][{"name", "arguments"}, ...]` or, one per marker,
    `[TOOL_CALLS]name[ARGS]{json}`. The text before the first marker is the free text."""
    head, *parts = text.split(MISTRAL_TAG)
    calls: list[ToolCall] = []
    errors: list[str] = []

    def add(obj: Any, given_id: str | None = None) -> None:
        cid = given_id or f"{id_prefix}{len(calls) + len(errors)}"
        call, err = _call_from_obj(obj, cid, tools)
        if err:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {err}")
        if call:
            calls.append(call)

    for part in parts:
        body = part.strip()
        if not body:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: {MISTRAL_TAG} with nothing after it")
            continue
        named = _MISTRAL_NAMED.match(part)
        if named:
            src = part[named.end():].strip()
            try:
                args = json.loads(src) if src else {}
            except json.JSONDecodeError as e:
                errors.append(f"tool call {len(calls) + len(errors) + 1}: {named.group(1)}: arguments are "
                              + _json_error(e, src))
                continue
            add({"name": named.group(1), "arguments": args}, named.group(2) or None)
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call {len(calls) + len(errors) + 1}: after {MISTRAL_TAG}, {_json_error(e, body)}")
            continue
        for item in obj if isinstance(obj, list) else [obj]:
            add(item, str(item["id"]) if isinstance(item, dict) and item.get("id") else None)
    return ParseResult(text=head.strip(), tool_calls=tuple(calls), errors=tuple(errors))


# ---------------------------------------------------------------- llama 3.x: {"name", "parameters"}


def parse_llama3_json(text: str, *, tools: Collection[str] | None = None, id_prefix: str = "call_") -> ParseResult:
    """Parse Llama 3.x's JSON calls: an output that starts with `<|python_tag|>` or `{` holds one
    or more `{"name": ..., "parameters": {...}}` objects separated by ";" (or whitespace); any
    other output is text."""
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    body = body.removeprefix(PYTHON_TAG).strip()
    if not (tagged or body.startswith("{")):
        return ParseResult(text=text.strip())
    calls: list[ToolCall] = []
    errors: list[str] = []
    dec = json.JSONDecoder()
    i = 0
    while i < len(body):
        while i < len(body) and (body[i].isspace() or body[i] == ";"):
            i += 1
        if i >= len(body):
            break
        n = len(calls) + len(errors) + 1
        try:
            obj, i = dec.raw_decode(body, i)
        except json.JSONDecodeError as e:
            errors.append(f"tool call {n}: {_json_error(e, body[i:])}")
            break  # the rest cannot be split reliably
        if isinstance(obj, dict) and "arguments" not in obj and "parameters" in obj:
            obj = {**obj, "arguments": obj["parameters"]}
            del obj["parameters"]
        call, err = _call_from_obj(obj, f"{id_prefix}{n - 1}", tools)
        if err:
            errors.append(f"tool call {n}: {err}")
        if call:
            calls.append(call)
    return ParseResult(text="", tool_calls=tuple(calls), errors=tuple(errors))


# ---------------------------------------------------------------- one call object, either format


def _call_from_obj(obj: Any, call_id: str, tools: Collection[str] | None) -> tuple[ToolCall | None, str | None]:
    """Validate {"name": str, "arguments": {...} | "json string"} (also OpenAI's nested
    {"function": {...}}) into a ToolCall, or say what is wrong."""
    if not isinstance(obj, dict):
        return None, f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
    if isinstance(obj.get("function"), dict):
        call_id = str(obj.get("id") or call_id)
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, 'missing "name" (a non-empty string naming the tool)'
    name = name.strip()
    if tools is not None and name not in tools:
        return None, f"unknown tool {name!r}; available: {', '.join(sorted(tools))}"
    args, err = _arguments(obj)
    if err:
        return None, f"{name}: {err}"
    return ToolCall(id=call_id, name=name, arguments=args), None


def _arguments(obj: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    if "arguments" not in obj:
        if "parameters" in obj:
            return {}, 'put the arguments under "arguments", not "parameters"'
        return {}, None  # a call without arguments is fine; the tool validates what it needs
    args = obj["arguments"]
    if isinstance(args, str):
        if not args.strip():
            return {}, None
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return {}, "arguments string is not valid JSON: " + _json_error(e, args).removeprefix("invalid JSON: ")
    if args is None:
        return {}, None
    if not isinstance(args, dict):
        return {}, f"arguments must be a JSON object, got {type(args).__name__}"
    return args, None


# ---------------------------------------------------------------- openai: chat-completions JSON


def parse_openai_tool_calls(raw: Any, *, tools: Collection[str] | None = None, id_prefix: str = "call_") -> ParseResult:
    """An OpenAI `tool_calls` list (as in a chat-completions message) -> ToolCalls, with one
    error per malformed entry (bad JSON arguments, missing function name, ...)."""
    if raw is None:
        return ParseResult(text="")
    if not isinstance(raw, list):
        return ParseResult(text="", errors=(f"tool_calls must be a list, got {type(raw).__name__}",))
    calls: list[ToolCall] = []
    errors: list[str] = []
    for k, item in enumerate(raw):
        default_id = f"{id_prefix}{k}"
        if isinstance(item, dict) and "function" in item and not isinstance(item["function"], dict):
            call, err = None, '"function" must be an object {"name", "arguments"}'
        elif isinstance(item, dict) and "function" not in item and "name" not in item:
            call, err = None, 'missing "function" {"name", "arguments"}'
        else:
            call, err = _call_from_obj(item, default_id, tools)
        if err:
            errors.append(f"tool call {k + 1}: {err}")
        if call:
            calls.append(call)
    return ParseResult(text="", tool_calls=tuple(calls), errors=tuple(errors))


def _openai_json(text: str) -> Any:
    """The decoded JSON if `text` is an OpenAI response/message/tool_calls list, else None."""
    s = text.strip()
    if not s or s[0] not in "{[":
        return None
    try:
        obj = json.loads(s)
    except json.JSONDecodeError:
        return None
    if isinstance(obj, dict) and ({"choices", "tool_calls"} & obj.keys() or {"role", "content"} <= obj.keys()):
        return obj
    if isinstance(obj, list) and obj and all(isinstance(x, dict) and "function" in x for x in obj):
        return obj
    return None


def _parse_openai_obj(obj: Any, *, tools: Collection[str] | None) -> ParseResult:
    if isinstance(obj, list):
        return parse_openai_tool_calls(obj, tools=tools)
    if "choices" in obj:
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ParseResult(text="", errors=("response has no choices",))
        obj = choices[0].get("message") or choices[0].get("delta") or {}
    content = obj.get("content") if isinstance(obj, dict) else None
    text = content if isinstance(content, str) else ""
    res = parse_openai_tool_calls(obj.get("tool_calls") if isinstance(obj, dict) else None, tools=tools)
    return ParseResult(text=text, tool_calls=res.tool_calls, errors=res.errors)


def to_json_dict(res: ParseResult) -> dict[str, Any]:
    """The `etude parse` output shape: {"text", "tool_calls": [{"id","name","arguments"}], "errors"}."""
    return {
        "text": res.text,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in res.tool_calls],
        "errors": list(res.errors),
    }
