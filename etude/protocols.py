"""The contracts between components. Four methods or fewer each; payloads live in `types`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from etude.types import Episode, Generation, Message, Problem, ToolResult


@runtime_checkable
class Policy(Protocol):
    """Something that answers a conversation. `id` names the checkpoint; `version` counts updates."""

    id: str
    version: int

    def generate(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]],
        *,
        max_tokens: int = 512,
        temperature: float = 0.7,
    ) -> Generation: ...


@dataclass(frozen=True)
class ExecResult:
    """Result of one sandboxed command."""

    returncode: int  # the command's status; 124 on timeout
    stdout: str
    stderr: str
    timed_out: bool = False
    wall_s: float = 0.0
    truncated: bool = False  # output was cut to the configured maximum


@runtime_checkable
class Sandbox(Protocol):
    """Runs commands isolated, with `workspace` mounted at /workspace."""

    workspace: Path

    def exec(self, argv: Sequence[str], *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult: ...


@dataclass
class ToolContext:
    """What a tool may touch: the workspace (host path) and a sandbox for commands."""

    workspace: Path
    sandbox: Sandbox | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """One tool. `schema` is the OpenAI function schema {"name","description","parameters"}."""

    name: str
    schema: dict[str, Any]

    def run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult: ...


@runtime_checkable
class Env(Protocol):
    """A training environment: problems in, scored episodes out. `problems(split)` is
    deterministic with "train" and "test" disjoint; `rollout` returns `n` episodes per problem,
    prompt-major. Every family feeds the same learner."""

    name: str

    def problems(self, split: str) -> list[Problem]: ...

    def rollout(self, policy: Any, problems: Sequence[Problem], *, n: int, max_tokens: int, temperature: float,
                top_p: float, seed: int | None) -> list[Episode]: ...


@runtime_checkable
class Store(Protocol):
    """Durable record of interactions and feedback (see etude.store for the SQL implementation)."""

    def log_interaction(self, record: dict[str, Any]) -> str: ...

    def log_feedback(self, record: dict[str, Any]) -> str: ...

    def interactions(self, **filters: Any) -> list[dict[str, Any]]: ...
