"""`HarnessConfig`: every knob of the agent loop, documented where it is declared."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from etude.configfile import build
from etude.errors import EtudeError
from etude.protocols import ToolsConfig
from etude.toolcalls import FORMATS, TEXT_FORMATS, text_format_of

# The tools an agent gets unless told otherwise. semantic_search loads its embedding model only
# when the agent first calls it (and reuses the template's index), so offering it costs nothing.
DEFAULT_TOOLS: tuple[str, ...] = (
    "read_file", "edit_file", "write_file", "grep", "glob", "list_dir", "run_terminal", "semantic_search",
)

# Tools that only read the workspace: consecutive calls to these run in parallel. Anything else
# (edits, writes, commands) runs alone, in the order the model wrote it.
READ_ONLY_TOOLS: frozenset[str] = frozenset({"read_file", "grep", "glob", "list_dir", "semantic_search"})


@dataclass(frozen=True)
class HarnessConfig:
    max_steps: int = 30
    """Most model turns in one episode; the episode stops with `max_steps` after that many."""
    max_total_tokens: int = 32768
    """Context budget: the episode stops with `max_tokens` once a turn's prompt plus completion
    reaches this many tokens (that is how long the conversation has become)."""
    max_tokens_per_turn: int = 1024
    """`max_tokens` passed to the policy for each turn. A turn cut at this limit that holds no
    tool call ends the episode with `max_tokens`."""
    time_limit_s: float = 600.0
    """Wall-clock budget of the episode, checked between turns (a running generation or command
    is not interrupted; commands have their own sandbox timeout)."""
    temperature: float = 0.7
    """Sampling temperature passed to the policy."""
    tools: tuple[str, ...] = DEFAULT_TOOLS
    """Names of the tools offered (from etude.tools). Calls to any other name get an error result."""
    allow_submit: bool = True
    """Offer the `submit` pseudo-tool, which ends the episode (stop reason `submit`). A reply
    without tool calls always ends it too (stop reason `answer`)."""
    parallel_tools: bool = True
    """Run consecutive read-only calls of one turn concurrently (results keep the model's order)."""
    max_parallel: int = 4
    """Threads for concurrent tool calls."""
    system_prompt: str | None = None
    """Replaces the default system text (the tool block is still appended for text-format models)."""
    tool_format: str = "auto"
    """How tools are offered: "openai" passes schemas natively; "hermes", "mistral" or
    "llama3_json" render them into the system prompt and read calls from the text in that family's
    syntax (`<tool_call>{json}</tool_call>`, `[TOOL_CALLS][...]`, `{"name", "parameters"}`:
    etude.toolcalls); "auto" picks "openai" iff the policy has `native_tools = True`, else the
    text format the policy's chat template writes (etude.toolcalls.text_format_of: "hermes" for
    SmolLM2 and any template without tool calls). Native `Generation.tool_calls` are taken as they
    are in every mode."""
    max_observation_chars: int = 30000
    """A tool output longer than this is cut (head and tail kept) before the model sees it."""
    tool_prompt: str = "compact"
    """How tools are listed in the system prompt for text-format models: "compact" (one line per
    tool: name, arguments with types, first sentence of the description) or "json" (each full JSON
    schema). Training and serving must use the same value; every shipped config uses compact."""
    repeat_notice: bool = False
    """When a turn repeats an earlier turn of the episode exactly (the same reply and the same
    tool results, so nothing changed), tell the model so in a user message after the results.
    Repeats are counted in the trajectory's `meta.repeated_turns` either way. Off by default:
    on the LoRA-SFT SmolLM2 (greedy, 118 held-out tasks) it changed nothing resolved (5/118 with
    and without, bench/results/legacy/harness_ablation.json); the model stopped repeating the last turn
    but went back to an earlier one instead."""
    stop_on_repeats: int = 0
    """End the episode (stop reason `repeating`) after this many turns in a row that each repeat
    an earlier turn exactly (the `repeat_notice` test: same reply, same tool results, so nothing
    in the workspace changed); 0: off. A model stuck in a loop otherwise spends every remaining
    turn on it, the longest prompts of the episode. configs/agent_sft.toml sets 2, chosen on the
    general validation split (bench/results/stuck.json): the warm start's episodes went from 8.0
    to 4.3 turns and their median wall time to 0.42x, and of 260 finished validation episodes
    the 154 it would have ended edited no file after that turn and none was resolved."""
    verify_edits: int = 0
    """Verified edits, for requests that name failing tests (pytest ids such as
    `tests/t.py::test_x`, read from the request's text): after a turn that changes files (only
    edits, writes and read-only calls, none writing the named test files or a conftest.py, at
    least one edit applied; see `verify_unapplied` for a turn whose edits were all refused),
    the harness runs `verify_command` with those ids in the workspace; when they still fail, it
    puts the files back and samples that turn again at `verify_temperature`, up to
    `verify_edits` attempts in all (and within `time_limit_s`), keeping the first whose tests
    pass. When none passes, the first attempt stands, its files as it left them (folders a
    rejected write created, and the checks' .pytest_cache, stay). Every attempt is recorded in
    `meta.verified_edits` (reply, whether its tests passed, the command's output tail). 0 or
    1: off. For evaluation and serving, where a user's request names the failing test; keep it
    off for RL rollouts (a kept turn was chosen by the test, not sampled from the
    policy alone)."""
    verify_temperature: float = 1.0
    """Sampling temperature of the second and later attempts of a verified edit."""
    verify_command: str = "python -m pytest -o addopts= -q -x"
    """The command a verified edit runs, with what `verify_scope` says appended; exit 0 passes."""
    verify_scope: str = "files"
    """What a verified edit's check runs: "files", every test in the files that hold the named
    tests (a fix that makes the named test pass while breaking its neighbours is rejected: a
    request often names one of several tests the bug fails), or "tests", the named tests alone."""
    verify_unapplied: bool = False
    """With verified edits on: an edit turn whose every edit was refused (old_str not in the
    file, the same as new_str, ...) is sampled again too, like one whose tests still fail; when
    no later attempt passes, the refused first attempt stands and the model sees its errors.
    False (the default): such a turn is not verified (the model retries on its next turn, if it
    has one). Chosen on the select slice of acme (bench/results/specialise_select.json): with it
    the specialised SmolLM2 had 26 edit turns verified instead of 7, but 112 of its 199
    re-samples did not apply either (it misquotes the code, e.g. `if message is n:`), resolved
    stayed 2/13 and the evaluation took 1.5x as long."""
    tools_config: ToolsConfig = field(default_factory=ToolsConfig)
    """Limits of the tools (output sizes, run_terminal's default and largest timeout, the
    semantic_search config); `run_agent` hands it to every tool call. A TOML table
    `[harness.tools_config]` gives its fields. A task episode caps the terminal timeout at the
    task's limit (etude.envs.episode)."""

    def __post_init__(self) -> None:
        if isinstance(self.tools_config, dict):
            known = {f.name for f in dataclasses.fields(ToolsConfig)}
            if bad := sorted(set(self.tools_config) - known):
                raise EtudeError(f"tools_config: unknown key(s) {', '.join(bad)} (known: {', '.join(sorted(known))})")
            object.__setattr__(self, "tools_config", ToolsConfig(**self.tools_config))
        elif not isinstance(self.tools_config, ToolsConfig):
            raise EtudeError(f"tools_config must be a ToolsConfig or a table, not {type(self.tools_config).__name__}")
        if self.tool_prompt not in ("compact", "json"):
            raise EtudeError(f"tool_prompt must be compact or json, not {self.tool_prompt!r}")
        if self.tool_format not in FORMATS:
            raise EtudeError(f"tool_format must be one of {', '.join(FORMATS)}, not {self.tool_format!r}")
        if self.stop_on_repeats < 0:
            raise EtudeError(f"stop_on_repeats must be 0 or more, not {self.stop_on_repeats}")
        if self.verify_edits < 0:
            raise EtudeError(f"verify_edits must be 0 or more, not {self.verify_edits}")
        if self.verify_scope not in ("files", "tests"):
            raise EtudeError(f"verify_scope must be files or tests, not {self.verify_scope!r}")
        if self.verify_temperature < 0:
            raise EtudeError(f"verify_temperature must be 0 or more, not {self.verify_temperature}")
        if self.max_steps < 1 or self.max_parallel < 1 or self.max_tokens_per_turn < 1:
            raise EtudeError("max_steps, max_parallel and max_tokens_per_turn must be at least 1")
        object.__setattr__(self, "tools", tuple(self.tools))

    def text_format(self, policy: Any = None) -> str:
        """The text syntax of calls: `tool_format` when it names one, else the one `policy`'s chat
        template writes (etude.toolcalls.text_format_of; "hermes" for a policy without one)."""
        return self.tool_format if self.tool_format in TEXT_FORMATS else text_format_of(policy)

    def to_dict(self) -> dict[str, Any]:
        """JSON-shaped (tuples as lists), so a trajectory reads back equal to what was written."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_table(cls, table: Any, where: str = "harness") -> HarnessConfig:
        """From a config table through the config library (etude.configfile.build): a key that is
        not a field, or a value of the wrong type ("harness.max_steps must be an integer"), is one
        EtudeError naming the key under `where` (the table's dotted name, e.g. "env.harness");
        `[where.tools_config]` is checked the same way; an integer is taken where a float is
        expected, as everywhere else."""
        return build(cls, table, where)

    def replace(self, **changes: Any) -> HarnessConfig:
        return dataclasses.replace(self, **changes)
