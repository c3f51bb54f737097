"""`OpenAIPolicy`: any OpenAI-compatible chat-completions server as a `protocols.Policy`.

It sends tool schemas natively (`tools=`) and returns a `NativeGeneration` with the decoded
`tool_calls` (malformed ones listed in `tool_call_errors`, never dropped), the usage token
counts, latency, and per-token log-probs when the server returns them (ask with
`logprobs=True`; not every server supports it). Token ids are filled only if the server sends
them (`token_ids` / `prompt_token_ids` extensions, as vLLM does); the OpenAI API itself does not.

A connection failure or an HTTP error status becomes an `EtudeError` with one clear line (the
harness turns that into stop reason "error"); the client retries `max_retries` times first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from typing import Any

from etude.errors import EtudeError
from etude.protocols import NativeToolsPolicy
from etude.toolcalls import parse_openai_tool_calls
from etude.types import Message, NativeGeneration


class OpenAIPolicy(NativeToolsPolicy):
    native_tools = True

    def __init__(self, base_url: str, model: str, api_key: str | None = None, extra_headers: dict[str, str] | None = None,
                 *, timeout_s: float = 300.0, max_retries: int = 2, logprobs: bool = False, id: str | None = None,
                 version: int = 0) -> None:
        import openai  # lazy: importing openai costs ~0.3 s and only this backend needs it

        self.base_url, self.model, self.logprobs = base_url, model, logprobs
        self.id, self.version = id or model, version
        key = api_key or os.environ.get("ETUDE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "none"
        self._client = openai.OpenAI(base_url=base_url, api_key=key, default_headers=extra_headers or None,
                                     timeout=timeout_s, max_retries=max_retries)

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, max_tokens: int = 512,
                 temperature: float = 0.7) -> NativeGeneration:
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(messages),
                                "max_tokens": max_tokens, "temperature": temperature}
        if tools:
            body["tools"] = list(tools)
        if self.logprobs:
            body["logprobs"] = True
        start = time.monotonic()
        resp = self._create(body)
        return self._generation(resp, time.monotonic() - start)

    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        import openai

        try:
            return self._client.chat.completions.create(**body).model_dump()
        except openai.APIConnectionError as e:
            raise EtudeError(f"cannot reach the model server at {self.base_url}: {e}") from e
        except openai.APIStatusError as e:
            raise EtudeError(f"model server {self.base_url} answered HTTP {e.status_code}: {_short(str(e.message))}") from e

    def _generation(self, resp: dict[str, Any], latency: float) -> NativeGeneration:
        choices = resp.get("choices") or []
        if not choices:
            raise EtudeError(f"model server {self.base_url} returned no choices")
        choice = choices[0]
        msg = choice.get("message") or {}
        parsed = parse_openai_tool_calls(msg.get("tool_calls") or None)
        usage = resp.get("usage") or {}
        return NativeGeneration(
            text=msg.get("content") or "",
            tool_calls=parsed.tool_calls if msg.get("tool_calls") else None,
            tool_call_errors=parsed.errors,
            logprobs=_logprobs(choice),
            token_ids=_ints(choice.get("token_ids")),
            prompt_token_ids=_ints(resp.get("prompt_token_ids") or choice.get("prompt_token_ids")),
            finish_reason=str(choice.get("finish_reason") or "stop"),
            policy_id=self.id, policy_version=self.version, latency_s=latency,
            prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
            response_id=resp.get("id") or None,
        )


def to_openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages -> chat-completions dicts. A tool message answers an API call id only when the
    assistant message before it made that call; results of text-format (`<tool_call>`) calls
    have no API id, so they go as user messages wrapped in <tool_response> tags."""
    out: list[dict[str, Any]] = []
    open_ids: set[str] = set()
    for m in messages:
        if m.role == "assistant":
            d: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                d["tool_calls"] = [{"id": c.id, "type": "function",
                                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in m.tool_calls]
            open_ids = {c.id for c in m.tool_calls}
            out.append(d)
        elif m.role == "tool" and m.tool_call_id in open_ids:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _logprobs(choice: dict[str, Any]) -> tuple[float, ...]:
    content = (choice.get("logprobs") or {}).get("content") or []
    return tuple(float(t["logprob"]) for t in content if isinstance(t, dict) and t.get("logprob") is not None)


def _ints(xs: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in xs) if isinstance(xs, list) and all(isinstance(x, int) for x in xs) else ()


def _short(s: str, n: int = 200) -> str:
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 3] + "..."
