"""`NativeGeneration`: a `Generation` from a backend that parses tool calls itself (an OpenAI API).

It adds what such a backend knows and `types.Generation` has no field for: the malformed tool
calls it could not decode (so the harness shows them to the model instead of dropping them)
and the token usage the server reported. The harness reads these with `getattr`, so any
Generation works; these fields are simply absent on the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from etude.types import Generation


@dataclass(frozen=True)
class NativeGeneration(Generation):
    tool_call_errors: tuple[str, ...] = ()  # one per malformed entry of the response's tool_calls
    prompt_tokens: int | None = None  # usage.prompt_tokens, when the server reports it
    completion_tokens: int | None = None  # usage.completion_tokens
    response_id: str | None = None  # the response `id` (on etude serve: the interaction id feedback refers to)
