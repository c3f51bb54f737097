"""The OpenAI chat-completions wire format: request validation, conversion to etude messages,
and the response / SSE chunk bodies.

Every problem with a request becomes `ApiError(status, message, param)`, rendered as OpenAI's
`{"error": {"message", "type", "param", "code"}}` so the official client raises its usual
exception classes (BadRequestError, AuthenticationError, NotFoundError, ...).

Supported: `messages` (system/developer/user/assistant/tool; string or text-part content),
`tools` (function tools), `tool_choice` "auto"/"none" (a forced choice is rejected: we cannot
constrain a text-format model's decoding), `temperature`, `top_p`, `max_tokens` /
`max_completion_tokens`, `stream`, `stream_options.include_usage`, `user`, `n` = 1 only,
`seed` (accepted, not honoured across a batch). Unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from etude.harness import render_tools_prompt
from etude.types import Message, ParseResult, ToolCall


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "invalid_request_error", 429: "rate_limit_error"}.get(self.status, "invalid_request_error")
        if self.status >= 500:
            kind = "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class _Loose(BaseModel):
    # strict: "stream": "yes" or "max_tokens": "10" is a mistake to report, not to coerce
    model_config = ConfigDict(extra="ignore", strict=True)


class FunctionCall(_Loose):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Loose):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class MessageIn(_Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = Field(default=None, max_length=128)
    name: str | None = Field(default=None, max_length=256)


class FunctionDef(_Loose):
    name: str = Field(min_length=1, max_length=64)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolIn(_Loose):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Loose):
    include_usage: bool = False


class ChatRequest(_Loose):
    model: str = Field(min_length=1, max_length=256)
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(default=None, max_length=256)
    seed: int | None = None


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects a request body may have (a chat request needs about 8)."""
_INT64 = 2**63


def _no_constants(name: str) -> Any:
    raise ApiError(400, f"request body is not valid JSON: {name} is not a JSON number")


def load_json_object(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object; every way it can be bad is the client's error (400):
    empty, not UTF-8, not JSON, nested deeper than MAX_JSON_DEPTH, NaN/Infinity or a number out
    of range (beyond a 64-bit integer or a finite float), a string the store cannot hold (an
    unpaired surrogate or NUL), or not an object at the top."""
    if not body.strip():
        raise ApiError(400, "request body is empty: send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not UTF-8 (invalid byte at offset {e.start})") from None
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except RecursionError:
        raise ApiError(400, f"request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None
    except ValueError as e:  # e.g. an integer literal of thousands of digits
        raise ApiError(400, f"request body holds a number out of range: {str(e).split(':')[0]}") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"request body must be a JSON object, not {_json_kind(data)}")
    _check_values(data)
    return data


def _json_kind(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _check_values(data: Any) -> None:
    # Iterative (a deep body must not exhaust the stack here either); the path is built only on error.
    stack: list[tuple[Any, int, Any]] = [(data, 0, None)]
    while stack:
        v, depth, where = stack.pop()
        if isinstance(v, dict | list):
            if depth >= MAX_JSON_DEPTH:
                raise ApiError(400, f"request body is nested too deeply (the limit is {MAX_JSON_DEPTH} levels)",
                               param=_path(where))
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, child in items:
                if isinstance(k, str):
                    _check_string(k, (where, k))
                stack.append((child, depth + 1, (where, k)))
        elif isinstance(v, str):
            _check_string(v, where)
        elif isinstance(v, bool):
            pass
        elif isinstance(v, int) and not -_INT64 <= v < _INT64:
            raise ApiError(400, f"{_path(where) or 'body'}: integer out of range (more than 64 bits)", param=_path(where))
        elif isinstance(v, float) and v - v != 0.0:  # inf (NaN never gets here: parse_constant refuses it)
            raise ApiError(400, f"{_path(where) or 'body'}: number out of range (not a finite double)",
                           param=_path(where))


def _check_string(s: str, where: Any) -> None:
    if "\x00" in s:
        raise ApiError(400, f"{_path(where) or 'body'}: strings must not contain NUL (\\u0000)", param=_path(where))
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{_path(where) or 'body'}: string holds an unpaired UTF-16 surrogate",
                       param=_path(where)) from None


def _path(where: Any) -> str | None:
    parts = []
    while where is not None:
        where, k = where
        parts.append(str(k))
    return ".".join(reversed(parts)) or None


def parse_request(body: bytes) -> ChatRequest:
    data = load_json_object(body)
    try:
        req = ChatRequest.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ApiError(400, f"{where}: {err['msg']}", param=where) from None
    if req.n != 1:
        raise ApiError(400, "n > 1 is not supported; send separate requests", param="n")
    if isinstance(req.tool_choice, dict) or req.tool_choice not in (None, "auto", "none"):
        raise ApiError(400, "tool_choice must be 'auto' or 'none' (forced tool calls are not supported)", param="tool_choice")
    return req


def _text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for k, part in enumerate(content):
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.content[{k}]: only text parts are supported", param=f"{where}.content")
        parts.append(part["text"])
    return "".join(parts)


def _tool_calls(m: MessageIn, where: str) -> tuple[ToolCall, ...]:
    calls = []
    for k, c in enumerate(m.tool_calls or ()):
        args: Any = c.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError:
                raise ApiError(400, f"{where}.tool_calls[{k}].function.arguments is not valid JSON",
                               param=f"{where}.tool_calls") from None
        if not isinstance(args, dict):
            raise ApiError(400, f"{where}.tool_calls[{k}].function.arguments must be a JSON object",
                           param=f"{where}.tool_calls")
        calls.append(ToolCall(id=c.id, name=c.function.name, arguments=args))
    return tuple(calls)


def to_messages(req: ChatRequest) -> list[Message]:
    out = []
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(400, f"{where}: a tool message needs tool_call_id", param=where)
        role = "system" if m.role == "developer" else m.role
        out.append(Message(role=role, content=_text(m.content, where), tool_calls=_tool_calls(m, where),
                           tool_call_id=m.tool_call_id, name=m.name))
    return out


def tool_schemas(req: ChatRequest) -> list[dict[str, Any]]:
    if not req.tools or req.tool_choice == "none":
        return []
    return [t.model_dump() for t in req.tools]


def with_tools_prompt(messages: list[Message], tools: list[dict[str, Any]], fmt: str = "hermes") -> list[Message]:
    """For a text-format model: the tools block of the harness in the system message (the same
    text training uses, teaching text format `fmt`), appended to the client's system message or as
    a new first one."""
    if not tools:
        return messages
    block = render_tools_prompt(tools, fmt=fmt)
    if messages and messages[0].role == "system":
        first = messages[0]
        content = f"{first.content}\n\n{block}" if first.content else block
        return [Message(role="system", content=content), *messages[1:]]
    return [Message(role="system", content=block), *messages]


# -- responses ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """What the model said, in the shape the response needs."""

    id: str
    model: str
    created: int
    parsed: ParseResult
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def openai_finish(self) -> str:
        return "tool_calls" if self.parsed.tool_calls else ("length" if self.finish_reason == "length" else "stop")


def tool_calls_json(calls: tuple[ToolCall, ...]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for c in calls]


def usage(a: Answer) -> dict[str, int]:
    return {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens}


def completion_body(a: Answer) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": a.parsed.text or (None if a.parsed.tool_calls else "")}
    if a.parsed.tool_calls:
        msg["tool_calls"] = tool_calls_json(a.parsed.tool_calls)
    if a.parsed.errors:
        msg["etude_parse_errors"] = list(a.parsed.errors)  # malformed calls: logged, rewarded negatively
    return {"id": a.id, "object": "chat.completion", "created": a.created, "model": a.model,
            "choices": [{"index": 0, "message": msg, "finish_reason": a.openai_finish, "logprobs": None}],
            "usage": usage(a)}


def _chunk(a: Answer, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def _bare_chunk(iid: str, model: str, delta: dict[str, Any]) -> bytes:
    return sse({"id": iid, "object": "chat.completion.chunk", "created": now(), "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]})


def role_chunk(iid: str, model: str) -> bytes:
    return _bare_chunk(iid, model, {"role": "assistant", "content": ""})


def content_chunk(iid: str, model: str, text: str) -> bytes:
    return _bare_chunk(iid, model, {"content": text})


def stream_chunks(a: Answer, pieces: list[str], include_usage: bool, with_role: bool = True) -> list[bytes]:
    """The SSE events of one answer: role, text pieces, one chunk per tool call, finish, usage."""
    out = [sse(_chunk(a, {"role": "assistant", "content": ""}))] if with_role else []
    out += [sse(_chunk(a, {"content": p})) for p in pieces if p]
    for k, call in enumerate(tool_calls_json(a.parsed.tool_calls)):
        out.append(sse(_chunk(a, {"tool_calls": [{"index": k, **call}]})))
    out.append(sse(_chunk(a, {}, a.openai_finish)))
    if include_usage:
        out.append(sse({"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
                        "choices": [], "usage": usage(a)}))
    out.append(sse("[DONE]"))
    return out


def now() -> int:
    return int(time.time())
