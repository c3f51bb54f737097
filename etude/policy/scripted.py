"""`ScriptedPolicy`: a deterministic fake model that replays fixed outputs, for tests and demos.

Each output is one of:
- a str: model text, read by the harness like a local model's (`<tool_call>` blocks parsed);
- a `Generation`: returned as is (policy id/version filled in when empty);
- a dict: {"text": str, "tool_calls": [...], "finish_reason": str} where tool_calls are native
  calls, either {"name", "arguments"} or OpenAI's {"id", "type", "function": {"name",
  "arguments": "json string"}}; malformed entries become `tool_call_errors` exactly as with a
  real OpenAI server. {"raise": "message"} makes `generate` raise RuntimeError (crash tests).

When the outputs run out it answers `final` with no tool calls, which ends an episode. It keeps
every conversation it was shown in `seen`, so tests can check what the model would have read.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.protocols import NativeToolsPolicy
from etude.toolcalls import parse_openai_tool_calls
from etude.types import Generation, Message, NativeGeneration

Output = str | Generation | dict[str, Any]


class ScriptedPolicy(NativeToolsPolicy):
    native_tools = False  # the harness renders tools into the prompt, as for a local model

    def __init__(self, outputs: Sequence[Output], *, id: str = "scripted", version: int = 0, final: str = "Done.",
                 native_tools: bool = False) -> None:
        self.outputs = list(outputs)
        self.id, self.version, self.final = id, version, final
        self.native_tools = native_tools
        self.seen: list[list[Message]] = []
        self._next = 0

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> ScriptedPolicy:
        """A script file: a JSON list of outputs, or {"request": ..., "outputs": [...]}."""
        data = load_script(path)
        return cls(data["outputs"], **kw)

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, max_tokens: int = 512,
                 temperature: float = 0.7) -> Generation:
        self.seen.append(list(messages))
        k, self._next = self._next, self._next + 1
        out = self.outputs[k] if k < len(self.outputs) else self.final
        return self._generation(out, k)

    def _generation(self, out: Output, k: int) -> Generation:
        if isinstance(out, Generation):
            return dataclasses.replace(out, policy_id=out.policy_id or self.id, policy_version=out.policy_version or self.version)
        if isinstance(out, str):
            return Generation(text=out, policy_id=self.id, policy_version=self.version)
        if not isinstance(out, dict):
            raise TypeError(f"scripted output {k} must be str, Generation or dict, not {type(out).__name__}")
        if "raise" in out:
            raise RuntimeError(str(out["raise"]))
        text = str(out.get("text", out.get("content")) or "")
        calls = None
        errors: tuple[str, ...] = ()
        if "tool_calls" in out:
            res = parse_openai_tool_calls(out["tool_calls"], id_prefix=f"scripted_{k}_")
            calls, errors = res.tool_calls, res.errors
        return NativeGeneration(text=text, tool_calls=calls, tool_call_errors=errors, policy_id=self.id,
                                policy_version=self.version, finish_reason=str(out.get("finish_reason", "stop")))


def load_script(path: str | Path) -> dict[str, Any]:
    """Read a script file into {"request": str | None, "outputs": [...]}; bad files are EtudeErrors."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise EtudeError(f"cannot read script {p}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise EtudeError(f"script {p} is not valid JSON: {e}") from e
    if isinstance(data, list):
        data = {"outputs": data}
    if not isinstance(data, dict) or not isinstance(data.get("outputs"), list):
        raise EtudeError(f'script {p} must be a JSON list of outputs or an object with an "outputs" list')
    return {"request": data.get("request"), "outputs": data["outputs"], "repo": data.get("repo")}
