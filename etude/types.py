"""Payloads that cross component boundaries: dataclasses, nothing heavy imported.

Every component speaks in these. They serialise to plain JSON with `to_dict()` and load back
with `from_dict()`, so trajectories, tasks and verdicts can be written as JSONL and read by
any other component (or any other tool) without importing the one that produced them.
The RL training payloads at the end (`Problem`, `TurnSample`, `Episode`) stay in memory
between an environment and the learner.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


def _asdict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _asdict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_asdict(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _asdict(v) for k, v in obj.items()}
    return obj


class _Serialisable:
    def to_dict(self) -> dict[str, Any]:
        return _asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclass(frozen=True)
class ToolCall(_Serialisable):
    """One call the model asked for. `arguments` is the decoded JSON object."""

    id: str
    name: str
    arguments: dict[str, Any]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolCall:
        return cls(id=str(d["id"]), name=str(d["name"]), arguments=dict(d.get("arguments") or {}))


@dataclass(frozen=True)
class ToolResult(_Serialisable):
    """What a tool returns. A failure is a value (ok=False, error=...), never an exception."""

    ok: bool
    output: str = ""
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def fail(cls, error: str, **meta: Any) -> ToolResult:
        return cls(ok=False, output="", error=error, meta=meta)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolResult:
        return cls(ok=bool(d["ok"]), output=d.get("output", ""), error=d.get("error"), meta=dict(d.get("meta") or {}))


@dataclass(frozen=True)
class Message(_Serialisable):
    """A chat message in OpenAI shape. `tool_calls` only on assistant messages,
    `tool_call_id` only on tool messages."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Message:
        return cls(
            role=d["role"],
            content=d.get("content") or "",
            tool_calls=tuple(ToolCall.from_dict(t) for t in d.get("tool_calls") or ()),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
        )


@dataclass(frozen=True)
class ParseResult(_Serialisable):
    """The parser's reading of one model output: free text, well-formed calls, and one error
    string per malformed call (bad JSON, missing name, ...). Errors are shown to the model."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation(_Serialisable):
    """One sampled completion, with what the trainer needs for importance correction."""

    text: str
    prompt_token_ids: tuple[int, ...] = ()  # [num_prompt_tokens]
    token_ids: tuple[int, ...] = ()  # [num_completion_tokens]
    logprobs: tuple[float, ...] = ()  # [num_completion_tokens], of the distribution sampled from
    finish_reason: str = "stop"  # "stop" | "length" | "tool_calls"
    policy_id: str = ""
    policy_version: int = 0
    tool_calls: tuple[ToolCall, ...] | None = None  # set by backends that parse natively (OpenAI API)
    latency_s: float = 0.0


@dataclass(frozen=True)
class NativeGeneration(Generation):
    """A `Generation` from a backend that parses tool calls itself (an OpenAI API).

    It adds what such a backend knows and `Generation` has no field for: the malformed tool
    calls it could not decode (so the harness shows them to the model instead of dropping them)
    and the token usage the server reported. The harness reads these with `getattr`, so any
    Generation works; these fields are simply absent on the others."""

    tool_call_errors: tuple[str, ...] = ()  # one per malformed entry of the response's tool_calls
    prompt_tokens: int | None = None  # usage.prompt_tokens, when the server reports it
    completion_tokens: int | None = None  # usage.completion_tokens
    response_id: str | None = None  # the response `id` (on etude serve: the interaction id feedback refers to)


@dataclass(frozen=True)
class ToolExecution(_Serialisable):
    """A tool call as it was run (or refused) in one turn."""

    call: ToolCall
    result: ToolResult
    started_s: float  # seconds since episode start
    duration_s: float


@dataclass(frozen=True)
class Turn(_Serialisable):
    """One step of the agent loop: the model's output and what the tools answered."""

    index: int
    generation: Generation
    tool_executions: tuple[ToolExecution, ...] = ()
    parse_errors: tuple[str, ...] = ()  # malformed calls in this turn, each shown to the model

    @property
    def broken_calls(self) -> int:
        return len(self.parse_errors) + sum(1 for t in self.tool_executions if not t.result.ok)


StopReason = Literal["answer", "submit", "max_steps", "max_tokens", "timeout", "repeating", "error"]


@dataclass(frozen=True)
class Trajectory(_Serialisable):
    """A whole episode. Written as JSONL after every step by the harness."""

    episode_id: str
    task_id: str | None
    policy_id: str
    policy_version: int
    messages: tuple[Message, ...]
    turns: tuple[Turn, ...]
    stop_reason: StopReason
    diff: str = ""
    wall_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    config: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def final_message(self) -> str:
        for m in reversed(self.messages):
            if m.role == "assistant":
                return m.content
        return ""

    @property
    def tool_calls(self) -> list[ToolExecution]:
        return [t for turn in self.turns for t in turn.tool_executions]

    @property
    def broken_calls(self) -> int:
        return sum(t.broken_calls for t in self.turns)


@dataclass(frozen=True)
class Task(_Serialisable):
    """A SWE-bench-compatible instance plus etude's own fields.

    The first twelve fields are SWE-bench's. FAIL_TO_PASS / PASS_TO_PASS are pytest node ids.
    `repo_dir` is not part of the schema on disk semantics: loaders resolve it (a cached,
    unpacked sdist at base) so environments know where the template repository lives.
    """

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    environment_setup_commit: str = ""
    FAIL_TO_PASS: tuple[str, ...] = ()
    PASS_TO_PASS: tuple[str, ...] = ()
    # etude's fields
    source: dict[str, Any] = field(default_factory=dict)  # {"package", "version", "sha256", ...}
    strategy: str = ""  # "release-diff" | "synth:<mutators>" | "swe-bench" | ...
    test_cmd: str = "python -m pytest -x -q"
    timeout_s: float = 120.0
    setup: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Flag(_Serialisable):
    """A reward-hacking detector's finding."""

    name: str
    evidence: str
    voids: bool = False  # True: the episode's reward is voided and it is never "resolved"


@dataclass(frozen=True)
class Outcome(_Serialisable):
    """Grading verdict of one patch on one task, from a clean workspace."""

    instance_id: str
    resolved: bool
    partial: bool
    fail_to_pass: dict[str, str]  # node id -> "passed" | "failed" | "error" | "skipped" | "missing"
    pass_to_pass: dict[str, str]
    patch_applied: bool = True
    error: str | None = None
    duration_s: float = 0.0
    log_tail: str = ""


@dataclass(frozen=True)
class RewardBreakdown(_Serialisable):
    """Total reward and every term; None means the term does not apply to this episode."""

    total: float
    terms: dict[str, float | None]
    weights: dict[str, float] = field(default_factory=dict)
    flags: tuple[Flag, ...] = ()


# --- RL training payloads: what environments hand the learner ------------------------------------


@dataclass(frozen=True)
class Problem:
    """One prompt of a training environment (`protocols.Env.problems`)."""

    id: str
    family: str
    messages: tuple[Message, ...]
    answer: Any = None  # what the checker compares against (family-specific)


@dataclass
class TurnSample:
    """One assistant turn as the learner sees it."""

    prompt_ids: list[int]  # [num_prompt_tokens]
    completion_ids: list[int]  # [num_completion_tokens]
    logprobs: list[float]  # [num_completion_tokens], behaviour log-probs at sampling time
    routes: Any = None  # MoE policies only: etude.scale.moe.Routes, replayed by the learner

    @classmethod
    def of(cls, g: Generation) -> TurnSample:
        return cls(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), getattr(g, "routes", None))


@dataclass
class Episode:
    """A scored rollout of one problem: one `TurnSample` per assistant turn, its reward and
    reward terms, and the policy version that produced it (`protocols.Env.rollout`)."""

    problem_id: str
    family: str
    reward: float
    terms: dict[str, float | None]
    resolved: bool
    turns: list[TurnSample]
    policy_version: int
    text: str = ""  # the final answer, for logs
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped. MoE routes are not written (they are replayed in-process only)."""
        turns = [{"prompt_ids": list(t.prompt_ids), "completion_ids": list(t.completion_ids),
                  "logprobs": list(t.logprobs)} for t in self.turns]
        return {"problem_id": self.problem_id, "family": self.family, "reward": self.reward, "terms": dict(self.terms),
                "resolved": self.resolved, "turns": turns, "policy_version": self.policy_version, "text": self.text,
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        turns = [TurnSample(list(t["prompt_ids"]), list(t["completion_ids"]), list(t["logprobs"])) for t in d["turns"]]
        return cls(problem_id=d["problem_id"], family=d["family"], reward=float(d["reward"]), terms=dict(d["terms"]),
                   resolved=bool(d["resolved"]), turns=turns, policy_version=int(d["policy_version"]),
                   text=d.get("text", ""), meta=dict(d.get("meta") or {}))
