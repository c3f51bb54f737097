"""The contracts between components. Four methods or fewer each; payloads live in `types`. A policy
is a `Policy`; what it can do beyond that (token ids, batches, native tools, an in-process model)
it declares by subclassing the capability protocols, which callers check with `isinstance`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
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


# Capabilities beyond `generate`, declared by the policies that have them (they subclass these)
# and checked once with isinstance where a caller takes another path for them.


@runtime_checkable
class TokenPolicy(Protocol):
    """Token-level generation with log-probs: the policy renders a conversation to prompt ids itself
    (`encode_prompt`, the one renderer of serving, RL and SFT) and samples from ids, each
    Generation carrying its token ids and their log-probs (`generate_ids`); `stop_token_ids` end a
    completion. The batcher, serving's id path and RL rollouts use it (LocalPolicy, VLLMPolicy)."""

    @property
    def stop_token_ids(self) -> list[int]: ...

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]: ...

    def generate_ids(self, prompts: Sequence[Sequence[int]], **kw: Any) -> list[Generation]: ...


@runtime_checkable
class SubmitPolicy(Protocol):
    """A policy whose engine schedules requests itself (continuous batching: VLLMPolicy and its
    views): `submit_ids` hands it one token-id prompt and returns at once; the future resolves when
    that request alone is done. Serving hands such a policy each request as it arrives instead of
    batching requests in front of it (etude.policy.batcher.EngineQueue)."""

    def submit_ids(self, prompt: Sequence[int], **kw: Any) -> Future[Generation]: ...


@runtime_checkable
class BatchPolicy(Protocol):
    """Several conversations in one call (one forward batch), `n` samples each, prompt-major."""

    def generate_batch(self, conversations: Sequence[Sequence[Message]], tools: Sequence[dict[str, Any]] = (),
                       **kw: Any) -> list[Generation]: ...


@runtime_checkable
class NativeToolsPolicy(Protocol):
    """A policy whose API may take tool schemas itself (an OpenAI-compatible endpoint): when
    `native_tools` is true the harness passes them as `tools` instead of rendering them into the
    system prompt. Read it through `native_tools`."""

    native_tools: bool


@runtime_checkable
class ModelPolicy(Protocol):
    """A policy sampling with an in-process transformers `model` (LocalPolicy): RL shares it with
    the learner, the batcher hooks its `generate` to stream tokens."""

    model: Any


@runtime_checkable
class EngineStatsPolicy(Protocol):
    """A policy whose engine reports its own counters (VLLMPolicy: batch sizes, KV cache), merged
    into the batcher's stats on /health."""

    def engine_stats(self) -> dict[str, Any]: ...


@runtime_checkable
class TokenizerPolicy(Protocol):
    """A policy whose `tokenizer` decodes its token ids (to cut a batched completion short)."""

    tokenizer: Any


def native_tools(policy: Any) -> bool:
    """Whether `policy` takes tool schemas natively (see NativeToolsPolicy); False when it says nothing."""
    return isinstance(policy, NativeToolsPolicy) and bool(policy.native_tools)


def policy_name(policy: Any) -> tuple[str, int]:
    """(id, version) of a `Policy`; ("", 0) for a bare object that only generates."""
    return (str(policy.id), int(policy.version)) if isinstance(policy, Policy) else ("", 0)


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


@dataclass(frozen=True)
class ToolsConfig:
    """Limits of the tools, one per episode: `HarnessConfig.tools_config` is the one an agent's
    tools get (`run_agent` puts it on the `ToolContext`). It sits here, beside `ToolContext`,
    because every tool honours it and the harness sets it."""

    read_max_lines: int = 2000  # lines one read_file call returns before the truncation marker
    read_max_line_chars: int = 2000  # a longer line is cut and marked
    max_output_chars: int = 30_000  # hard cap on any tool's output text
    max_file_bytes: int = 5_000_000  # read_file/edit_file refuse bigger files; write_file bigger content
    edit_diff_max_lines: int = 80  # edit_file returns at most this many diff lines
    grep_max_line_chars: int = 300  # a matched line is cut to this many characters
    grep_timeout_s: float = 30.0  # ripgrep is killed after this
    glob_max_results: int = 500  # glob lists at most this many files
    list_max_entries: int = 400  # list_dir shows at most this many entries
    terminal_timeout_s: float = 60.0  # run_terminal's default timeout
    terminal_max_timeout_s: float = 600.0  # the most a model may ask for (an episode sets its task's cap)
    terminal_max_output_chars: int = 16_000  # head and tail are kept, the middle is cut
    # NOTE: typed Any because etude.search sits above this module; semantic_search reads it.
    search: Any = None  # an etude.search.SearchConfig (or its fields as a dict); None: its defaults


@dataclass
class ToolContext:
    """What a tool may touch: the workspace (host path), a sandbox for commands (None: run_terminal
    starts a default `SandboxConfig()` one per command), the limits, and the folder the workspace
    was copied from (semantic_search reuses that folder's index)."""

    workspace: Path
    sandbox: Sandbox | None = None
    config: ToolsConfig = field(default_factory=ToolsConfig)
    template: Path | None = None


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
