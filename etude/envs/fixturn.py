"""The edit turn of a repository task: its prompt and its score (env `fix`, `etude.envs.families.FixTurnEnv`,
and bench/fix_probe.py).

Stop 25's fix probe (bench/fix_probe.py) found where the SFT models lose held-out tasks: with the
buggy function on screen they rarely write the right edit. This env trains that one step. A
problem is a fix drill's conversation (`etude.envs.sources.drill_trajectories`: grep for the
function, read it window by window, all through the real harness and tools) up to the edit
turn; the policy writes that turn and is scored by what the edit would do to the file:

  right_fix     1.0   the edit gives the gold file (compared as Python ASTs, so layout aside)
  on_bug_line   0.3   an edit that applies (old_str occurs once) and holds the buggy line, wrong fix
  edits         0.1   an edit that applies elsewhere
  attempted     0.0   well-formed calls with an `edit_file` of the file that does not apply
  well_formed   0.0   well-formed calls, no `edit_file` of the file (it reads, greps, ...)
  malformed    -0.2   a reply that does not parse as tool calls (the broken-call penalty)

With the default weights a reply that does not try to edit scores as well as one that tries and
misses, while most broken replies are edits (code inside a JSON string). From an adapter whose
edits rarely apply, GRPO then learns to stop editing: bench/edit_rl.py, 2026-12-06, saw the
share of applied edits in training fall from 16% to 0 and every reply become a well-formed
non-edit within 8 steps. `[env.rewards] weights` can rank `attempted` above `well_formed`.

`score_edit` gives the probe's figures (`well_formed`, `edits`, `on_bug_line`, `right_fix`, each
true or false on its own: a right fix also edits). The env scores them through the reward rubric
(`FIX_RUBRIC`): one term per tier above, 1 for the best tier the reply reached and 0 for the
others, weighted by `REWARDS` (the defaults; `[env.rewards] weights` changes them), so the reward
is the weight of the best tier. In a training run's metrics, `reward/right_fix` is then the
probe's right-fix rate; `reward/edits` + `reward/on_bug_line` + `reward/right_fix` is the share of
edits that apply. An episode is one turn, so a step costs one prompt of ~1.5k tokens per sample
instead of a whole episode; nothing runs the tests (the gold hunk is the reference, and the AST
comparison cannot be gamed by the reply).

Problems come from `tasks_file` (train) and `eval_tasks_file` (test), each a JSONL or
`builtin:curriculum:SPLIT[:LEVEL]`. Drills are cached under the etude cache, keyed by the
harness config, so a rerun or a second run reads them back.

Not guaranteed: the prompt is the harness's text-format conversation (the tool prompt in the
system message), as for SmolLM2; a model whose chat template takes native tools gets the tools
through its template, which the drill conversation does not show it.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from etude import paths
from etude.envs.expert import gold_hunk, unique_old_str
from etude.envs.sources import drill_trajectories
from etude.harness import HarnessConfig
from etude.rewards import Rubric, make_rubric
from etude.rewards.terms import TermFn
from etude.tasks.repo import prepare_repo
from etude.toolcalls import parse_text
from etude.types import Task

TIERS = ("right_fix", "on_bug_line", "edits", "attempted", "well_formed", "malformed")  # best first
REWARDS = MappingProxyType(dict(zip(TIERS, (1.0, 0.3, 0.1, 0.0, 0.0, -0.2), strict=True)))  # the default weights


def _ast(src: str) -> str | None:
    try:
        return ast.dump(ast.parse(src))
    except (SyntaxError, ValueError, RecursionError):
        return None


def score_edit(reply: str, src: str, gold_src: str, path: str, bug_line: str, fmt: str = "hermes") -> dict[str, bool]:
    """What one reply's first `edit_file` call on `path` does to `src` (see the module doc); the
    reply's calls are read in text format `fmt` (etude.toolcalls.TEXT_FORMATS: the harness's)."""
    parsed = parse_text(reply, fmt)
    edits = [c for c in parsed.tool_calls
             if c.name == "edit_file" and str(c.arguments.get("path", "")).removeprefix("./") == path]
    well_formed = bool(parsed.tool_calls) and not parsed.errors
    out = {"well_formed": well_formed, "attempted": well_formed and bool(edits), "edits": False,
           "on_bug_line": False, "right_fix": False}
    for c in edits[:1]:
        old, new = c.arguments.get("old_str"), c.arguments.get("new_str")
        if not isinstance(old, str) or not isinstance(new, str) or not old or src.count(old) != 1:
            continue
        out["edits"] = True
        out["on_bug_line"] = bug_line.strip() in old
        after = src.replace(old, new, 1)
        out["right_fix"] = after == gold_src or (_ast(after) is not None and _ast(after) == _ast(gold_src))
    return out


def best_tier(s: Mapping[str, bool]) -> str:
    """The best of TIERS a `score_edit` result reached."""
    return next((tier for tier in TIERS[:-1] if s[tier]), "malformed")


def _tier_term(tier: str) -> TermFn:
    def term(measured: Mapping[str, bool]) -> float:
        return float(best_tier(measured) == tier)
    term.__name__ = tier
    return term


FIX_RUBRIC: Rubric = make_rubric({tier: _tier_term(tier) for tier in TIERS})
"""The fix env's rubric over a `score_edit` result (`measured`): 1 for the best tier, 0 for the others."""


def drill_cache(hc: HarnessConfig) -> Path:
    """Where drills made under `hc` are cached (one file per harness config, keyed inside by task).
    The temperature is not part of the key: the scripted expert does not sample, so an RL config
    (temperature 1.0) and the greedy probe share one file."""
    fields = {k: v for k, v in dataclasses.asdict(hc).items() if k != "temperature"}
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]
    d = paths.cache() / "fix_drills"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"drills-{key}.jsonl"


def edit_turn_prompts(tasks: Sequence[Task], hc: HarnessConfig, cache_file: Path, *, workers: int = 2,
                      ) -> list[dict[str, Any]]:
    """Per task that has a drill: the conversation before its edit turn (`messages`) and what
    `score_edit` needs (`src`, `gold`, `path`, `bug_line`)."""
    drills = {tr.task_id: tr for tr in drill_trajectories(tasks, hc, cache_file, workers=workers)}
    out = []
    for t in tasks:
        tr = drills.get(t.instance_id)
        if tr is None:
            continue
        k = next(i for i, m in enumerate(tr.messages) if m.role == "assistant" and "edit_file" in m.content)
        hunk = gold_hunk(t.patch)
        src = (prepare_repo(t) / hunk.path).read_text(encoding="utf-8", errors="replace")
        old, new = unique_old_str(src, hunk)
        out.append({"task": t.instance_id, "messages": tr.messages[:k], "src": src,
                    "gold": src.replace(old, new, 1), "path": hunk.path, "bug_line": hunk.old[0]})
    return out
