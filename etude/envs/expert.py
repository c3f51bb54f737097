"""A scripted expert for tasks with a gold patch: it works the way a good agent does, through the
real harness, tools and sandbox, so its trajectories are what a model should learn to write.

Plan (varied per task by a seeded RNG, so a model learns the skill rather than one script):
1. locate — grep for the function's definition, or run the failing test and grep in one reply,
   or semantic search by the function's name;
2. read the function in windows of READ_LINES lines from its `def` line (the line grep or
   semantic search showed), window after window until the function's end is on screen (at most
   four windows): nothing the agent could not have seen decides what it reads. Parallel calls:
   running the test and grepping in one reply; and in half of the grep plans, grepping for the
   failing test's `def` beside the function's, then reading the test (TEST_READ_LINES from its
   `def` line) beside the function's first window;
3. edit with `old_str`/`new_str` taken from the gold patch's hunk (made unique in the file by
   adding context lines). Recovery: when the changed line alone is not unique, half of those
   plans first try it alone, see the edit tool's real "occurs N times" error, and retry with the
   context lines (what the SFT model most often failed to do). A wrong fix first: in DECOY_SHARE
   of the plans short enough, the expert first changes the buggy line the wrong way (another
   operator, constant or integer in it: `_decoy_lines`), re-runs the test, sees it still fail,
   sometimes reads the function again, then makes the right edit and re-runs the test. The wrong
   edit's turn is listed in `untrained` (SFT puts no loss on it: the model is to learn what to do
   after a failed re-run, not the wrong fix), and a plan whose wrong fix happened to pass the test
   is reported by `decoy_failed` (False) for the caller to drop or to plan again without one
   (`wrong_first=False`). The SFT models before these plans submitted in every episode, even
   after their re-run test failed;
4. re-run the failing test (most of the time; always after a wrong fix);
5. answer in one sentence that says what changed and where (sometimes through `submit`; a
   `submit` answer names the function, file and test but quotes no code, since code inside a
   JSON string needs its quotes escaped, which the SFT model most often got wrong there).

The expert reads the task's template and gold patch (it is privileged), but every observation in
its trajectory is what the real tools returned, and `run_episode` grades its diff in a clean copy
like anyone's: a plan that fails is dropped by the caller, never kept as a demonstration.
What this does not do: handle multi-file or multi-hunk gold patches (it returns None for them).
"""

from __future__ import annotations

import ast
import io
import random
import re
import threading
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etude.envs.episode import TEST_COMMAND
from etude.harness.prompt import render_tool_calls_text
from etude.protocols import NativeToolsPolicy
from etude.types import Generation, Message, Task, ToolCall

_AST_LOCK = threading.Lock()


def _parse(source: str) -> ast.Module | None:
    """The module's AST, or None when it does not parse."""
    try:
        with _AST_LOCK:  # NOTE: CPython 3.11's ast.parse is not thread-safe ("recursion depth mismatch")
            return ast.parse(source)
    except (SyntaxError, ValueError, SystemError, RecursionError):
        return None


@dataclass(frozen=True)
class Hunk:
    path: str
    old: list[str]  # lines removed by the gold patch (present at base)
    new: list[str]  # lines that replace them
    before: list[str]  # context lines just above, at base


def gold_hunk(patch: str) -> Hunk | None:
    """The single hunk of a one-file, one-hunk gold patch; None for anything bigger."""
    files = re.findall(r"^\+\+\+ b/(.+)$", patch, re.M)
    hunks = re.split(r"^@@[^\n]*@@[^\n]*\n", patch, flags=re.M)[1:]
    if len(files) != 1 or len(hunks) != 1:
        return None
    old: list[str] = []
    new: list[str] = []
    before: list[str] = []
    for ln in hunks[0].splitlines():
        if ln.startswith("-"):
            old.append(ln[1:])
        elif ln.startswith("+"):
            new.append(ln[1:])
        elif ln.startswith(" ") and not old and not new:
            before.append(ln[1:])
        elif ln.startswith(" ") and (old or new):
            break  # a second change block in the same hunk: keep to the first
    if not old:
        return None
    return Hunk(files[0], old, new, before)


def unique_old_str(source: str, hunk: Hunk) -> tuple[str, str] | None:
    """(old_str, new_str) for edit_file, with as many context lines above as make old_str unique."""
    for k in range(len(hunk.before) + 1):
        ctx = hunk.before[len(hunk.before) - k :] if k else []
        old = "\n".join(ctx + hunk.old)
        if source.count(old) == 1:
            return old, "\n".join(ctx + hunk.new)
    return None


def span_of(source: str, name: str, line: int | None = None) -> tuple[int, int] | None:
    """(first, last) line of the function/method `name` (dotted path allowed) holding `line`."""
    tree = _parse(source)
    if tree is None:
        return None
    leaf = name.split(".")[-1]
    best = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == leaf:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            last = getattr(node, "end_lineno", node.lineno)
            if line is None or first <= line <= last:
                if best is None or first >= best[0]:
                    best = (first, last)
    return best


READ_LINES = 25  # the expert reads a function in windows of this many lines, from its `def` line


def read_capped(hc: Any) -> bool:
    """Whether the harness `hc` caps read_file at READ_LINES lines, so that a read naming only its
    start_line shows one expert window and ends with the tool's "read more with start_line=N"
    (etude.tools.read_file): the next window is then a number copied from the screen, where an
    explicit end_line is an addition a small model gets wrong. (The SFT models read windows of
    4-5 lines where the expert read 25, on the general validation split, and ran out of turns
    before the function's bug was on screen.)"""
    return hc.tools_config.read_max_lines == READ_LINES


def _windows(first: int, bug: int, last: int, most: int = 4) -> list[tuple[int, int]]:
    """Windows of READ_LINES lines from the definition's line `first`, window after window until
    the function's `last` line is on screen, at most `most` windows. Only what the agent has seen
    decides what it reads: the `def` line (grep and semantic search show it) and whether the
    window it just read still ends inside the function. Stopping once the bug is on screen (what
    stages before the fifth did) used what the expert alone knows, and the model learned to read
    one window and edit there: in half of its held-out episodes the bug was below that window."""
    out = [(first, first + READ_LINES - 1)]
    while out[-1][1] < last and len(out) < most:
        lo = out[-1][1] + 1
        out.append((lo, lo + READ_LINES - 1))
    if out[-1][1] < bug:
        raise ValueError(f"the bug is more than {most * READ_LINES} lines into its function")
    return out


TEST_READ_LINES = 15  # the failing test is read in one window of this many lines from its `def` line


def _test_def(template: Path, test_id: str) -> tuple[str, str, int] | None:
    """(file, test function, its `def` line) of a pytest id such as `tests/t.py::Cls::test_x[1]`:
    what a grep for `def test_x` in that file shows the agent. None when the id names no file
    of the template or the function is not found there exactly once."""
    tpath, _, rest = test_id.split("[", 1)[0].partition("::")
    leaf = rest.split("::")[-1]
    f = template / tpath
    if not leaf or not f.is_file():
        return None
    src = f.read_text(encoding="utf-8", errors="replace")
    lines = [i for i, ln in enumerate(src.splitlines(), 1) if re.match(rf"\s*(async\s+)?def {re.escape(leaf)}\b", ln)]
    return (tpath, leaf, lines[0]) if len(lines) == 1 else None


ANSWERS = (
    "Fixed `{func}` in `{path}`: `{old}` is now `{new}`, and `{test}` passes.",
    "The bug was in `{func}` ({path}): it used `{old}` where it needs `{new}`. Changed it; `{test}` passes now.",
    "Changed `{old}` to `{new}` in `{func}` in `{path}`, which fixes `{test}`.",
    "`{func}` in `{path}` had `{old}`; I replaced it with `{new}` and `{test}` now passes.",
)
SUBMIT_ANSWERS = (  # no code quoted inside the JSON string (see the module doc)
    "Fixed the bug in `{func}` in `{path}`; `{test}` passes.",
    "The bug was in `{func}` ({path}). Changed that line; `{test}` passes now.",
    "Corrected `{func}` in `{path}`, which fixes `{test}`.",
)


class ExpertPolicy(NativeToolsPolicy):
    """A `Policy` that follows a plan for one task (see the module doc)."""

    native_tools = False

    def __init__(self, task: Task, template: Path, seed: int = 0, *, semantic_search: bool = True,
                 wrong_first: bool = True, drill: bool = False, capped_reads: bool = False, tool_format: str = "hermes"):
        self.id, self.version = "expert", 0
        self.tool_format = tool_format  # the text syntax of its calls: the trained model's (etude.toolcalls)
        self.task = task
        # capped_reads: the harness's read_file shows READ_LINES lines at most (`read_capped`), so
        # every read names its start_line alone, copied from what is on screen (see the module doc)
        self.capped_reads = capped_reads
        self.rng = random.Random(f"{seed}:{task.instance_id}")
        self.untrained: list[int] = []  # assistant turns (0-based) SFT must not learn from (a wrong fix)
        self.decoy_failed: bool | None = None  # whether that run failed, as it must for the plan to be kept
        self.turns = self._drill(template) if drill else self._plan(template, semantic_search, wrong_first)

    @classmethod
    def for_task(cls, task: Task, template: Path, seed: int = 0, **kw: Any) -> ExpertPolicy | None:
        try:
            p = cls(task, template, seed, **kw)
        except ValueError:
            return None
        return p

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], *, max_tokens: int = 512,
                 temperature: float = 0.7, **_: Any) -> Generation:
        k = sum(1 for m in messages if m.role == "assistant")
        if k == self.decoy_check and messages and messages[-1].role == "tool":
            self.decoy_failed = bool(_FAILED.search(messages[-1].content))
        out = self.turns[k] if k < len(self.turns) else self.turns[-1]
        text = out if isinstance(out, str) else render_tool_calls_text(out, self.tool_format)
        return Generation(text=text, policy_id=self.id, policy_version=self.version)

    @property
    def decoy_check(self) -> int | None:
        """The turn that reads the test run after the wrong fix (None: no wrong fix)."""
        return self.untrained[0] + 2 if self.untrained else None

    # -- the plan

    def _site(self, template: Path) -> tuple[Hunk, str, tuple[str, str], str, int, tuple[int, int]]:
        """What every plan starts from: the gold hunk, its file's text at base, the unique
        (old_str, new_str) edit, the function, the bug's line and the function's (first, last) lines."""
        t = self.task
        hunk = gold_hunk(t.patch)
        if hunk is None:
            raise ValueError("the gold patch is not one hunk in one file")
        src = (template / hunk.path).read_text(encoding="utf-8", errors="replace")
        edit = unique_old_str(src, hunk)
        if edit is None:
            raise ValueError("no unique old_str")
        bug_line = int((t.meta.get("lines") or [0])[0]) or _line_of(src, hunk.old[0])
        func = t.meta.get("function") or ""
        span = span_of(src, func, bug_line) if func else None
        if span is None:
            raise ValueError("the bug is not inside a known function")
        return hunk, src, edit, func, bug_line, span

    def _grep_and_reads(self, hunk: Hunk, func: str, bug_line: int,
                        span: tuple[int, int]) -> tuple[ToolCall, list[list[ToolCall]]]:
        """The grep for the function's `def` and its reads, window by window (`_windows`)."""
        grep = ToolCall("", "grep", {"pattern": f"def {func.split('.')[-1]}\\b", "path": hunk.path})
        reads = [[ToolCall("", "read_file", self._read_args(hunk.path, lo, hi))]
                 for lo, hi in _windows(span[0], bug_line, span[1])]
        return grep, reads

    def _read_args(self, path: str, lo: int, hi: int) -> dict[str, Any]:
        """A read of lines lo..hi: with capped reads, `start_line` alone (the cap ends it at hi)."""
        return {"path": path, "start_line": lo} if self.capped_reads else {"path": path, "start_line": lo, "end_line": hi}

    def _drill(self, template: Path) -> list[list[ToolCall] | str]:
        """A fix drill (see `drill_trajectories` in etude.envs.sources): grep for the function, read it
        window by window, make the gold edit, answer. Nothing runs the tests, so the answer turn is
        untrained (it would claim a pass nobody saw); what is learnt is locate, read, edit."""
        hunk, _, edit, func, bug_line, span = self._site(template)
        grep, reads = self._grep_and_reads(hunk, func, bug_line, span)
        fix = [ToolCall("", "edit_file", {"path": hunk.path, "old_str": edit[0], "new_str": edit[1]})]
        plan: list[list[ToolCall] | str] = [[grep], *reads, fix, f"Changed `{func}` in `{hunk.path}`."]
        self.untrained.append(len(plan) - 1)
        return plan

    def _plan(self, template: Path, semantic: bool, wrong_first: bool) -> list[list[ToolCall] | str]:
        t, rng = self.task, self.rng
        hunk, src, edit, func, bug_line, span = self._site(template)
        grep, reads = self._grep_and_reads(hunk, func, bug_line, span)
        test = t.FAIL_TO_PASS[0].split("[", 1)[0] if t.FAIL_TO_PASS else ""
        run = ToolCall("", "run_terminal", {"command": f"{TEST_COMMAND} -q -x --tb=short {test}"})
        roll = rng.random()
        if semantic and roll < 0.15:
            locate = [ToolCall("", "semantic_search", {"query": func.replace(".", " "), "k": 3})]
        elif test and roll < 0.4:
            locate = [run, grep]
        else:
            locate = [grep]
        # Half of the grep plans also find and read the failing test, each beside the function's
        # own grep and first read: independent calls in one reply (the parallel calls to learn).
        test_at = _test_def(template, t.FAIL_TO_PASS[0]) if t.FAIL_TO_PASS and grep in locate else None
        if test_at is not None and rng.random() < 0.5:
            tpath, tleaf, tline = test_at
            locate.append(ToolCall("", "grep", {"pattern": f"def {tleaf}\\b", "path": tpath}))
            reads[0].append(ToolCall("", "read_file", self._read_args(tpath, tline, tline + TEST_READ_LINES - 1)))
        old_str, new_str = edit
        fix = [ToolCall("", "edit_file", {"path": hunk.path, "old_str": old_str, "new_str": new_str})]
        bare = "\n".join(hunk.old)
        tries: list[list[ToolCall] | str] = []
        if bare != old_str and src.count(bare) > 1 and len(reads) <= 2 and rng.random() < 0.5:  # recovery: see the module doc
            tries.append([ToolCall("", "edit_file", {"path": hunk.path, "old_str": bare,
                                                     "new_str": "\n".join(hunk.new)})])
        check = [ToolCall("", "run_terminal", {"command": f"{TEST_COMMAND} -q {test}"})]
        decoy = wrong_first and test and not tries and rng.random() < DECOY_SHARE
        wrong = _decoy_edit(src, hunk, edit, rng) if decoy else None
        if wrong is not None and len(reads) + 6 <= MAX_PLAN_TURNS:  # a wrong fix first: see the module doc
            first, second = wrong
            self.untrained.append(1 + len(reads))  # the wrong edit's turn is not trained on
            again = [reads[-1][:1]] if len(reads) + 7 <= MAX_PLAN_TURNS and rng.random() < 0.5 else []
            fix = [ToolCall("", "edit_file", {"path": hunk.path, "old_str": second[0], "new_str": second[1]})]
            bad = [ToolCall("", "edit_file", {"path": hunk.path, "old_str": first[0], "new_str": first[1]})]
            plan: list[list[ToolCall] | str] = [locate, *reads, bad, check, *again, fix, check]
        else:
            plan = [locate, *reads, *tries, fix]
            if test and rng.random() < 0.8:
                plan.append(check)
        fields = dict(func=func, path=hunk.path, old=" ".join(hunk.old[0].split()),
                      new=" ".join((hunk.new or [""])[0].split()), test=test or "the test")
        if rng.random() < 0.3:
            plan.append([ToolCall("", "submit", {"message": rng.choice(SUBMIT_ANSWERS).format(**fields)})])
        else:
            plan.append(rng.choice(ANSWERS).format(**fields))
        return plan


DECOY_SHARE = 0.8  # of the plans that can have one, the share that first make a wrong fix
MAX_PLAN_TURNS = 8  # configs/agent_sft.toml's harness max_steps: a plan must fit in it
_FAILED = re.compile(r"\b\d+ (failed|error)")  # pytest's summary line of a failing run
_DECOY_OPS = {"<": ("<=", ">"), "<=": ("<", ">="), ">": (">=", "<"), ">=": (">", "<="), "==": ("!=",),
              "!=": ("==",), "+": ("-",), "-": ("+",), "*": ("//",), "//": ("*",), "%": ("//",),
              "and": ("or",), "or": ("and",), "True": ("False",), "False": ("True",)}


def _decoy_lines(line: str) -> list[str]:
    """The line with one operator, keyword constant or integer changed: the kind of fix a level-1
    bug invites, here the wrong kind."""
    toks = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            toks.append(tok)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # an unclosed bracket on this line: the tokens read so far still serve
    out = []
    for tok in toks:
        if tok.start[0] != 1 or tok.end[0] != 1:
            continue
        subs = _DECOY_OPS.get(tok.string, ()) if tok.type in (tokenize.OP, tokenize.NAME) else ()
        if tok.type == tokenize.NUMBER and tok.string.isdigit():
            n = int(tok.string)
            subs = (str(n + 1),) + ((str(n - 1),) if n > 1 else ())
        out += [line[: tok.start[1]] + sub + line[tok.end[1]:] for sub in subs]
    return out


def _decoy_edit(src: str, hunk: Hunk, edit: tuple[str, str],
                rng: random.Random) -> tuple[tuple[str, str], tuple[str, str]] | None:
    """A wrong fix of a one-line hunk and the edit that then corrects it: ((old_str, wrong_str),
    (old_str', new_str)), each old_str unique in the file it is applied to, the wrong file still
    parsing. None when the line offers no such change."""
    if len(hunk.old) != 1 or len(hunk.new) != 1:
        return None
    bug, gold = hunk.old[0], hunk.new[0]
    cands = [c for c in dict.fromkeys(_decoy_lines(bug)) if c not in (bug, gold)]
    rng.shuffle(cands)
    old_str, _ = edit
    ctx = old_str.split("\n")[:-1]
    for wrong_line in cands:
        wrong = "\n".join([*ctx, wrong_line])
        after = src.replace(old_str, wrong, 1)
        second = unique_old_str(after, Hunk(hunk.path, [wrong_line], [gold], hunk.before))
        if second is not None and _parse(after) is not None:
            return (old_str, wrong), second
    return None


def _line_of(src: str, text: str) -> int:
    for i, ln in enumerate(src.splitlines(), 1):
        if ln == text:
            return i
    return 0


