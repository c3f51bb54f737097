"""The built-in reward terms (`BUILTIN_TERMS`), and how a term is checked and called.

A term is a pure function returning a float, or None when it does not apply to the episode
(None is "not counted", never zero). It names the arguments it needs among `trajectory`, `task`,
`outcome`, `config` and `patch` (an episode), or `reply` and `measured` (a single-turn env's
answer and what the env measured of it, `score_reply`); the scorer passes only those, and skips
(None) a term whose required argument is missing — so `score_patch`, which has no trajectory, runs
the same rubric. Terms are collected into a rubric explicitly (etude.rewards.rubric); nothing
registers on import.

Ranges: correctness, parallelism, efficiency and patch_similarity in [0, 1]; penalties in [-1, 0].
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from difflib import SequenceMatcher
from typing import Any

from etude.rewards.config import RewardConfig
from etude.rewards.detectors import is_test_path, task_test_paths
from etude.rewards.diff import parse_diff
from etude.types import Outcome, Task, ToolCall, ToolExecution, Trajectory

TermFn = Callable[..., float | None]
ARGS = ("trajectory", "task", "outcome", "config", "patch", "reply", "measured")
_NEEDED = ("trajectory", "patch", "reply", "measured")  # None: the term does not apply


def check_term(name: str, fn: TermFn) -> None:
    """A term may only name arguments among ARGS (or give them defaults); checked when a rubric
    is built rather than mid-scoring."""
    params = inspect.signature(fn).parameters.items()
    bad = [n for n, p in params if n not in ARGS and p.default is inspect.Parameter.empty]
    if bad:
        raise TypeError(f"reward term {name!r} takes {bad}; a term may only name {', '.join(ARGS)}")


def call_term(fn: TermFn, available: dict[str, Any]) -> float | None:
    """Call `fn` with the arguments it names. A required argument that is None means the term
    does not apply. A protocol-style `(trajectory, task, outcome)` term works unchanged."""
    kwargs = {}
    for name, p in inspect.signature(fn).parameters.items():
        value = available.get(name)
        required = p.default is inspect.Parameter.empty and name in _NEEDED
        if required and value is None:
            return None
        if name in available:
            kwargs[name] = value
    out = fn(**kwargs)
    return None if out is None else float(out)


# --- correctness ---------------------------------------------------------------------------


def correctness(outcome: Outcome | None, config: RewardConfig) -> float | None:
    """1 if resolved; with partial credit, the share of FAIL_TO_PASS passing when no
    PASS_TO_PASS broke; else 0. None without an outcome (production)."""
    if outcome is None:
        return None
    if outcome.resolved:
        return 1.0
    if not config.partial_credit or not outcome.patch_applied or not outcome.fail_to_pass:
        return 0.0
    if any(s != "passed" for s in outcome.pass_to_pass.values()):
        return 0.0
    return sum(s == "passed" for s in outcome.fail_to_pass.values()) / len(outcome.fail_to_pass)


# --- efficiency and parallelism ----------------------------------------------------------------


def efficiency(trajectory: Trajectory, outcome: Outcome | None, config: RewardConfig) -> float | None:
    """1 - mean share of the step, token and wall-time budgets used (each capped at 1).

    With `efficiency_requires_success` (default) it applies to resolved episodes only — also not
    without an outcome — so quitting early or crashing is never rewarded for being quick."""
    if config.efficiency_requires_success and (outcome is None or not outcome.resolved):
        return None
    used = [len(trajectory.turns) / max(1, config.step_budget)]
    tokens = trajectory.prompt_tokens + trajectory.completion_tokens
    if tokens:
        used.append(tokens / max(1, config.token_budget))
    if trajectory.wall_s:
        used.append(trajectory.wall_s / max(1e-9, config.wall_budget_s))
    return 1.0 - sum(min(1.0, u) for u in used) / len(used)


READ_ONLY = frozenset({"read_file", "grep", "glob", "list_dir", "semantic_search"})


def parallelism(trajectory: Trajectory) -> float | None:
    """How well runs of consecutive read-only turns were batched: (calls - turns) / (calls - 1)
    summed over runs; 1 = all in one turn, 0 = one call per turn. None if no run has two calls.

    NOTE: we cannot know whether a read depended on the previous one; consecutive read-only
    turns are our proxy for "independent calls".
    """
    runs: list[tuple[int, int]] = []  # (calls, turns) per run
    calls = turns = 0
    for turn in trajectory.turns:
        names = [t.call.name for t in turn.tool_executions]
        if names and all(n in READ_ONLY for n in names):
            calls, turns = calls + len(names), turns + 1
            continue
        runs.append((calls, turns))
        calls = turns = 0
    runs.append((calls, turns))
    runs = [r for r in runs if r[0] >= 2]
    if not runs:
        return None
    return sum(c - t for c, t in runs) / sum(c - 1 for c, _ in runs)


# --- broken calls ------------------------------------------------------------------------------


def broken_calls(trajectory: Trajectory, config: RewardConfig) -> float:
    """-min(1, n * penalty): each malformed call (parse error) or failing call (ok=False) costs.
    Always applies, so an episode full of broken calls cannot dodge its negative outcome."""
    return -min(1.0, trajectory.broken_calls * config.broken_call_penalty)


# --- repeated calls -----------------------------------------------------------------------------


def _call_key(name: str, arguments: Any) -> str:
    return name + "\x00" + json.dumps(arguments, sort_keys=True, default=str)


def repeats(trajectory: Trajectory) -> int:
    """The trajectory's own tool calls that repeat an identical call (same tool, same arguments)
    made earlier in its conversation: a wasted turn. In a logged production turn the earlier
    calls are the request's history; in an episode, its earlier turns."""
    own = [ex.call for t in trajectory.turns for ex in t.tool_executions]  # in the order they were made
    ids = {c.id for c in own}
    # earlier calls: the conversation's structured calls that are not the trajectory's own (a text-format
    # model's own calls live only in its turns: its assistant messages keep the raw text, no tool_calls)
    seen = {_call_key(c.name, c.arguments) for m in trajectory.messages if m.role == "assistant"
            for c in m.tool_calls if c.id not in ids}
    n = 0
    for c in own:
        key = _call_key(c.name, c.arguments)
        n += key in seen
        seen.add(key)
    return n


def repeated_calls(trajectory: Trajectory, config: RewardConfig) -> float:
    """-min(1, n * penalty) for each own call identical to an earlier one (`repeats`)."""
    return -min(1.0, repeats(trajectory) * config.repeat_call_penalty)


# --- closeness to the reference patch ---------------------------------------------------------


def _changes(patch: str, tests: set[str]) -> str:
    """The lines a patch removes and adds in library files, file by file, each stripped of its
    indentation: what two patches are compared on (hunk headers and context left out)."""
    out = []
    for fd in sorted(parse_diff(patch), key=lambda f: f.path):
        if is_test_path(fd.path, tests):
            continue
        out.append(f"{fd.path}\n")
        for h in fd.hunks:
            out += [f"{m}{t.strip()}\n" for m, t, _ in h.lines if m in "+-"]
    return "".join(out)


def patch_similarity(patch: str, task: Task | None) -> float | None:
    """How close the episode's change is to the task's reference patch, in [0, 1]: difflib's
    ratio between the lines each removes and adds in library files (test files left out) — the
    dense reward SWE-RL (Wei et al., 2025) trains on. An edit of the right line with a wrong fix
    scores well above no edit or an edit elsewhere, so GRPO groups on tasks no sample solves
    still carry a signal. None without a task or a reference patch (production episodes).
    A change far longer than the reference is cut before comparing (its ratio is low anyway)."""
    if task is None or not task.patch.strip():
        return None
    tests = task_test_paths(task)
    gold = _changes(task.patch, tests)
    if not gold:
        return None
    mine = _changes(patch or "", tests)[: 4 * len(gold) + 1000]
    return SequenceMatcher(None, gold, mine, autojunk=False).ratio()


# --- what the agent said -----------------------------------------------------------------------

_CALL_BLOCK = re.compile(r"<tool_call>.*?(</tool_call>|$)", re.S)


def _prose(text: str) -> str:
    """Model text without its `<tool_call>` blocks (text-format models keep them in content)."""
    return _CALL_BLOCK.sub("", text).strip()


def answers(trajectory: Trajectory) -> list[str]:
    """What the agent said to the user: each turn without calls, and the `submit` message.
    A trajectory without turns (a logged production conversation) uses its assistant messages."""
    if not trajectory.turns:
        said = [m.content for m in trajectory.messages if m.role == "assistant" and not m.tool_calls]
        return [a for a in said if a.strip() and "<tool_call>" not in a]  # a text-format call is not an answer
    out = []
    for t in trajectory.turns:
        submit = [e for e in t.tool_executions if e.call.name == "submit"]
        if submit:
            out.append(
                " ".join(filter(None, (_prose(t.generation.text), str(submit[0].call.arguments.get("message", "")))))
            )
        elif not t.tool_executions and not t.parse_errors:
            out.append(_prose(t.generation.text))
    return [a for a in out if a]


def final_answer(trajectory: Trajectory) -> str:
    """The closing answer: the last turn's, if it answered or submitted; "" if it stopped on a limit."""
    if not trajectory.turns:
        said = answers(trajectory)
        return said[-1] if said else ""
    last = trajectory.turns[-1]
    ended = not last.tool_executions and not last.parse_errors
    ended = ended or any(e.call.name == "submit" for e in last.tool_executions)
    said = answers(trajectory)
    return said[-1] if ended and said else ""


# --- unsupported claims ------------------------------------------------------------------------

_TEST_CMD = re.compile(r"\b(pytest|py\.test|unittest|tox|nox)\b|\bmake\s+(test|check)\b|manage\.py\s+test\b")
_EDIT_CMD = re.compile(r"\bsed\s+-i|\bpatch\s+-p|\bgit\s+(apply|checkout|restore)\b|\bperl\s+-pi")
_CLAIM = re.compile(
    r"\b(all\s+)?(the\s+)?tests?\s+(now\s+|all\s+)?(pass(es|ed|ing)?|succeed(s|ed)?|are\s+(passing|green)|(is|are)\s+green)\b"
    r"|\b(bug|issue|problem|error|failure)\s+(is|has\s+been|was|should\s+(now\s+)?be)\s+(now\s+)?(fixed|resolved|solved)\b"
    r"|\b(i(\s+have|'ve)?|have)\s+(fixed|resolved|solved)\b|\bfixed\s+the\s+(bug|issue|problem)\b|\bverified\b|\bconfirmed\b"
)
_NEGATION = re.compile(r"n't\b|\b(not|never|unable|couldn't|cannot|can't|no\s+longer|fail(s|ed|ing)?|yet|unless|if)\b")


def claims_success(text: str) -> bool:
    """A sentence that says tests pass / the bug is fixed, without a negation or hedge in it."""
    for sentence in re.split(r"(?<=[.!?\n])\s+", text.lower()):
        if _CLAIM.search(sentence) and not _NEGATION.search(sentence):
            return True
    return False


def is_test_run(ex: ToolExecution, task: Task | None = None) -> bool:
    """A run_terminal call running a test runner, or the task's own `test_cmd`."""
    if ex.call.name != "run_terminal":
        return False
    cmd = str(ex.call.arguments.get("command", ""))
    return bool(_TEST_CMD.search(cmd)) or bool(task and task.test_cmd.strip() and task.test_cmd.strip() in cmd)


def is_edit(ex: ToolExecution) -> bool:
    """An attempted edit (`attempts_edit`) that took: an edit or write tool's call only if it succeeded."""
    return attempts_edit(ex.call) and (ex.call.name not in EDIT_TOOLS or ex.result.ok)


_FAILED_OUT = re.compile(r"\b\d+\s+(failed|errors?)\b|^FAILED\b|^ERROR\b", re.M)
_PASSED_OUT = re.compile(r"\b\d+\s+passed\b|^OK\b", re.M)


def run_passed(ex: ToolExecution) -> bool:
    """Failed if the output reports failures (so `pytest || true` does not pass); else the exit
    code from result.meta["exit_code"]; without one, a pytest/unittest success line."""
    if not ex.result.ok or _FAILED_OUT.search(ex.result.output):
        return False
    code = ex.result.meta.get("exit_code", ex.result.meta.get("returncode"))
    if isinstance(code, int):
        return code == 0
    return bool(_PASSED_OUT.search(ex.result.output))


def last_test_evidence(trajectory: Trajectory, task: Task | None = None) -> str:
    """Last test run: "passed", "failed", "stale" (edits after it) or "none" (no run at all)."""
    calls = trajectory.tool_calls
    runs = [i for i, ex in enumerate(calls) if is_test_run(ex, task)]
    edits = [i for i, ex in enumerate(calls) if is_edit(ex)]
    if not runs:
        return "none"
    if edits and edits[-1] > runs[-1]:
        return "stale"
    return "passed" if run_passed(calls[runs[-1]]) else "failed"


def unsupported_claims(trajectory: Trajectory, task: Task | None = None) -> float:
    """-1 when the final message claims success but no test ran after the last edit, or the last
    test run failed; 0 otherwise (no claim, or a claim backed by a passing run)."""
    if not claims_success(final_answer(trajectory)):
        return 0.0
    return 0.0 if last_test_evidence(trajectory, task) == "passed" else -1.0


# --- needless clarification ----------------------------------------------------------------------

_ASKS = re.compile(
    r"\b(could|can|would)\s+you\s+(please\s+)?(clarify|provide|share|confirm|specify|tell|explain|give)\b"
    r"|\bplease\s+(clarify|confirm|specify|provide)\b|\b(which|what)\s+(one|file|version|behaviou?r|option)\b[^.?]*\?"
    r"|\bdo\s+you\s+want\s+me\s+to\b|\bshould\s+i\b[^.?]*\?|\bbefore\s+i\s+(proceed|start|continue)\b"
)


def asks_question(text: str) -> bool:
    """The message is mainly a question back to the user: at least half of its sentences end
    with '?' or use a clarification phrase. An explanation that closes with "Want me to refactor
    it?" is an answer, not a clarification."""
    sentences = [x for x in re.split(r"(?<=[.!?])\s+|\n+", text.strip().lower()) if x.strip()]
    asked = sum(1 for x in sentences if x.rstrip().endswith("?") or _ASKS.search(x))
    return asked > 0 and 2 * asked >= len(sentences)


def _made_edits(trajectory: Trajectory) -> bool:
    return bool(trajectory.diff.strip()) or any(is_edit(ex) for ex in trajectory.tool_calls)


def needless_clarification(trajectory: Trajectory, task: Task | None, config: RewardConfig) -> float | None:
    """-1 when the agent answered with a question instead of acting (no edits made) and the task
    gave enough to act; 0 when it acted or the task needs a question
    (task.meta["clarification"] == "needed"); None when the policy is "allow"."""
    policy = (task.meta.get("clarification") if task else None) or trajectory.meta.get("clarification")
    if config.clarification == "allow" or policy == "allowed":
        return None
    asked = [a for a in answers(trajectory) if asks_question(a)]
    if not asked or policy == "needed" or _made_edits(trajectory):
        return 0.0
    return -1.0


# --- an answer that ends the request without an edit ------------------------------------------

EDIT_TOOLS = ("edit_file", "write_file")


def attempts_edit(call: ToolCall) -> bool:
    """The call tries to change a file (whatever its result): an edit or write tool, or a terminal
    command that edits in place."""
    if call.name in EDIT_TOOLS:
        return True
    return call.name == "run_terminal" and bool(_EDIT_CMD.search(str(call.arguments.get("command", ""))))


def answer_without_edit(trajectory: Trajectory, task: Task | None) -> float | None:
    """-1 when the trajectory ends with an answer (its last turn calls no tool and breaks none) and
    no edit was attempted anywhere in the conversation (its own turns or, for a logged production
    turn, the request's history); 0 when it ends after an attempted edit; None when it does not end
    with an answer (a turn that calls a tool, a limit) or the request asks for no change
    (`meta["edit"] == "not_needed"` on the task or the trajectory).

    Quitting is otherwise the cheapest answer a reward made of penalties has: a closing message
    repeats nothing and breaks nothing. bench/results/loop_cycles_measured.json's candidate,
    reinforced on fewer repeats alone, learned to answer at once (edits 0.22 -> 0.008 an interaction)."""
    if (task and task.meta.get("edit") == "not_needed") or trajectory.meta.get("edit") == "not_needed":
        return None
    if not trajectory.turns:
        return None
    last = trajectory.turns[-1]
    if last.tool_executions or last.parse_errors or last.generation.finish_reason == "length":
        return None
    own = any(attempts_edit(ex.call) for t in trajectory.turns for ex in t.tool_executions)
    earlier = any(attempts_edit(c) for m in trajectory.messages if m.role == "assistant" for c in m.tool_calls)
    return 0.0 if own or earlier else -1.0


# --- verbosity ---------------------------------------------------------------------------------


def verbosity(trajectory: Trajectory, config: RewardConfig) -> float | None:
    """0 up to the word budget, then -(excess / budget) down to -1. None without a final answer."""
    words = len(final_answer(trajectory).split())
    if not words:
        return None
    budget = max(1, config.verbosity_budget_words)
    return -min(1.0, max(0, words - budget) / budget)


BUILTIN_TERMS: dict[str, TermFn] = {
    "repeated_calls": repeated_calls,
    "correctness": correctness,
    "efficiency": efficiency,
    "parallelism": parallelism,
    "broken_calls": broken_calls,
    "unsupported_claims": unsupported_claims,
    "needless_clarification": needless_clarification,
    "verbosity": verbosity,
    "answer_without_edit": answer_without_edit,
    "patch_similarity": patch_similarity,
}
