"""The agent loop: prompt -> policy -> parse -> tools (in parallel) -> observations -> ... until the
model answers without a tool call, calls `submit`, or hits a step / token / time limit.

Guarantees:
- A malformed call (bad JSON, missing name, bad arguments, unknown or disabled tool) never
  raises and is never dropped: parse errors go to the model in one user message after the tool
  results and are recorded in `Turn.parse_errors`; refused calls are `ToolResult(ok=False)`
  answered in their own tool message. Both count in `Turn.broken_calls`.
- A turn that repeats an earlier one exactly (same reply, same results, timings aside) is listed
  in `meta.repeated_turns`; with `HarnessConfig.repeat_notice` the model is told in that user
  message; with `HarnessConfig.stop_on_repeats` = k, k such turns in a row end the episode (stop
  reason `repeating`).
- Consecutive read-only calls of a turn run concurrently in a thread pool; edits, writes and
  commands run alone, in the order written. Results always keep the model's order.
- With `trajectory_path`, the trajectory is rewritten after every turn and once more in a
  `finally:`, so an exception or Ctrl-C loses nothing that happened before it.
- A policy that raises ends the episode with stop reason `error` (message in `meta.error`); the
  trajectory is still returned. KeyboardInterrupt propagates after the file is written.

Not guaranteed: the time limit is checked between turns, so one slow generation or command can
overshoot it (commands are bounded by the sandbox's own timeout). Token counts come from the
policy's token ids, else its reported usage, else an estimate of 4 characters per token
(`meta.token_counts` says which).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.harness import verify
from etude.harness.config import READ_ONLY_TOOLS, HarnessConfig
from etude.harness.prompt import SUBMIT, SUBMIT_SCHEMA, build_messages
from etude.harness.record import TrajectoryWriter
from etude.protocols import Policy, ToolContext, native_tools, policy_name
from etude.toolcalls import parse_text
from etude.tools import available, run_tool, tool_schemas
from etude.types import Generation, Message, StopReason, ToolCall, ToolExecution, ToolResult, Trajectory, Turn


def run_agent(
    policy: Policy,
    request: str,
    ctx: ToolContext,
    config: HarnessConfig | None = None,
    *,
    task_id: str | None = None,
    trajectory_path: str | Path | None = None,
    diff_fn: Callable[[], str] | None = None,
    history: Sequence[Message] | None = None,
    on_turn: Callable[[Turn], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> Trajectory:
    """Run one episode of `policy` on `request` in the workspace of `ctx`; see the module doc.
    `on_turn` is called after each turn (progress display); `meta` seeds `Trajectory.meta`."""
    ep = _Episode(policy, request, ctx, config or HarnessConfig(), task_id, history or ())
    ep.meta.update(meta or {})
    writer = TrajectoryWriter(trajectory_path) if trajectory_path else None
    try:
        while ep.stop is None:
            before = len(ep.turns)
            ep.stop = ep.limit_reached() or ep.step()
            if writer:
                writer.write(ep.snapshot())
            if on_turn and len(ep.turns) > before:
                on_turn(ep.turns[-1])
        ep.finish(diff_fn)
        return ep.trajectory()
    finally:
        ep.close()
        if writer:
            writer.write(ep.snapshot())  # the last word, also after an exception
            writer.close()


class _Episode:
    """Mutable state of one episode; `trajectory()` freezes a snapshot."""

    def __init__(
        self, policy: Policy, request: str, ctx: ToolContext, cfg: HarnessConfig, task_id: str | None,
        history: Sequence[Message],
    ) -> None:
        # NOTE: the harness config's tool limits are the ones in force: one ToolsConfig per episode.
        ctx = dataclasses.replace(ctx, config=cfg.tools_config)
        self.policy, self.ctx, self.cfg, self.task_id = policy, ctx, cfg, task_id
        self.native = cfg.tool_format == "openai" or (cfg.tool_format == "auto" and native_tools(policy))
        self.text_format = cfg.text_format(policy)
        self.schemas = _schemas(cfg)
        self.messages = build_messages(request, self.schemas, native_tools=self.native, system=cfg.system_prompt,
                                       history=history, tool_prompt=cfg.tool_prompt, fmt=self.text_format)
        self.turns: list[Turn] = []
        self.stop: StopReason | None = None
        self.complete = False
        self.meta: dict[str, Any] = {"request": request, "native_tools": self.native, "tool_format": self.text_format}
        self.verify_ids = verify.named_tests(request) if cfg.verify_edits > 1 else ()
        self.verify_targets = verify.check_targets(self.verify_ids, cfg.verify_scope)
        self.prompt_tokens = self.completion_tokens = self.context_tokens = 0
        self.token_sources: set[str] = set()
        self.diff = ""
        self.episode_id = uuid.uuid4().hex
        self.t0 = time.monotonic()
        self.t_end: float | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._dicts: dict[str, list[dict[str, Any]]] = {"messages": [], "turns": []}
        self._seen: dict[str, int] = {}  # a turn's reply and results -> the first turn that had them
        self._repeat_run = 0  # repeated turns in a row, up to the last one

    # -- one turn

    def _generate(self, temperature: float) -> Generation:
        gen = self.policy.generate(
            self.messages, self.schemas if self.native else [],
            max_tokens=self.cfg.max_tokens_per_turn, temperature=temperature,
        )
        self._count_tokens(gen)
        return gen

    def step(self) -> StopReason | None:
        try:
            gen = self._generate(self.cfg.temperature)
        except Exception as e:  # noqa: BLE001 - a failing policy ends the episode, it must not lose it
            self.meta["error"] = f"policy failed: {type(e).__name__}: {e}"
            return "error"
        calls, errors, assistant = self._read(gen)
        if not calls and not errors:
            self.messages.append(assistant)
            self.turns.append(Turn(index=len(self.turns), generation=gen))
            return "max_tokens" if gen.finish_reason == "length" else "answer"
        if self._verifiable(calls, errors):
            gen, calls, errors, assistant, execs, submitted = self._verified(gen, calls, assistant)
        else:
            execs, submitted = self._execute(calls)
        self.messages.append(assistant)
        observed = [_tool_message(x, self.cfg.max_observation_chars) for x in execs]
        self.messages.extend(observed)
        earlier = self._repeat_of(assistant, observed, errors)
        if errors or earlier is not None:
            self.messages.append(_notice_message(errors, earlier))
        self.turns.append(Turn(index=len(self.turns), generation=gen, tool_executions=tuple(execs), parse_errors=tuple(errors)))
        if submitted:
            return "submit"
        return "repeating" if 0 < self.cfg.stop_on_repeats <= self._repeat_run else None

    # -- verified edits (HarnessConfig.verify_edits; etude.harness.verify)

    def _verifiable(self, calls: Sequence[ToolCall], errors: Sequence[str]) -> bool:
        """A turn of edits/writes (and read-only calls) only, every call readable, none writing the
        named tests or a conftest.py, in an episode whose request names tests, verification on."""
        return (self.cfg.verify_edits > 1 and bool(self.verify_ids) and not errors
                and any(c.name in verify.WRITING_TOOLS for c in calls)
                and all(c.name in verify.WRITING_TOOLS or c.name in READ_ONLY_TOOLS for c in calls)
                and not verify.touches_tests(verify.written_paths(calls), self.verify_ids))

    def _check(self, snap: verify.Snapshot) -> tuple[bool, str]:
        snap.drop_bytecode()
        cmd = f"{self.cfg.verify_command} {' '.join(shlex.quote(t) for t in self.verify_targets)}"
        res = _call_tool("run_terminal", {"command": cmd}, self.ctx)
        return verify.passed(res), res.output or res.error or ""

    def _verified(self, gen: Generation, calls: list[ToolCall], assistant: Message) -> tuple[
            Generation, list[ToolCall], list[str], Message, list[ToolExecution], bool]:
        """Run the edit turn; while the request's tests still fail after it, undo it and sample the
        turn again (see HarnessConfig.verify_edits). -> the kept attempt's generation, calls,
        errors, message, executions and submitted flag. Never raises for what a model wrote:
        anything unexpected stops verification and leaves the first attempt in force."""
        snap = verify.Snapshot(self.ctx.workspace)
        snap.add(verify.written_paths(calls))
        execs, submitted = self._execute(calls)
        first = (gen, calls, [], assistant, execs, submitted)
        applied = any(x.result.ok for x in execs if x.call.name in verify.WRITING_TOOLS)
        if not applied and not self.cfg.verify_unapplied:
            return first  # nothing changed: the model sees its errors
        record: dict[str, Any] = {"turn": len(self.turns), "tests": list(self.verify_ids),
                                  "ran": list(self.verify_targets),
                                  "attempts": []}
        attempts = record["attempts"]
        self.meta.setdefault("verified_edits", []).append(record)
        if applied:
            ok, out = self._check(snap)
            attempts.append(verify.attempt_record(gen.text, "passed" if ok else "failed", out))
            if ok:
                return first
        else:
            ok = False  # every edit refused: the files are as they were, the tests as they failed
            attempts.append(verify.attempt_record(gen.text, "not applied"))
        first_state = snap.current()
        kept = first
        try:
            while (len(attempts) < self.cfg.verify_edits
                   and time.monotonic() - self.t0 < self.cfg.time_limit_s):
                if failed := snap.restore():
                    attempts.append(verify.attempt_record("", f"stopped: could not undo {', '.join(failed)}"))
                    break
                g = self._generate(self.cfg.verify_temperature)
                c, errs, a = self._read(g)
                if not self._verifiable(c, errs):
                    attempts.append(verify.attempt_record(g.text, "not an edit"))
                    continue
                snap.add(verify.written_paths(c))
                x, sub = self._execute(c)
                if not any(e.result.ok for e in x if e.call.name in verify.WRITING_TOOLS):
                    attempts.append(verify.attempt_record(g.text, "not applied"))
                    continue
                ok, out = self._check(snap)
                attempts.append(verify.attempt_record(g.text, "passed" if ok else "failed", out))
                if ok:
                    kept = (g, c, [], a, x, sub)
                    break
        except Exception as e:  # noqa: BLE001 - a failed policy or tool mid-verification: the first attempt stands
            attempts.append(verify.attempt_record("", f"stopped: {type(e).__name__}: {e}"))
            ok = False
        if not ok:
            snap.restore(first_state)  # none passed: the first attempt's files, as it left them
            kept = first
        record["kept"] = len(attempts) - 1 if ok else 0
        self.context_tokens = _context_of(kept[0], self.context_tokens)
        return kept

    def _read(self, gen: Generation) -> tuple[list[ToolCall], list[str], Message]:
        """Calls and errors of a generation, and the assistant message to append. A text-format
        reply is kept verbatim (tool_calls empty) so the next prompt holds exactly what the model
        wrote; native calls go in `tool_calls` as the API expects."""
        if gen.tool_calls is not None:
            calls = [c if c.id else ToolCall(f"call_{len(self.turns)}_{k}", c.name, c.arguments) for k, c in enumerate(gen.tool_calls)]
            errors = list(getattr(gen, "tool_call_errors", ()) or ())
            return calls, errors, Message(role="assistant", content=gen.text, tool_calls=tuple(calls))
        res = parse_text(gen.text, self.text_format, id_prefix=f"call_{len(self.turns)}_")
        return list(res.tool_calls), list(res.errors), Message(role="assistant", content=gen.text)

    def _repeat_of(self, assistant: Message, observed: Sequence[Message], errors: Sequence[str]) -> int | None:
        """Record a repeat (`meta.repeated_turns`); -> the earlier turn it repeats when the model is
        to be told (`repeat_notice`), else None. Each turn's key is kept, so a loop of two
        alternating turns is caught as well."""
        calls = [(c.name, json.dumps(c.arguments, sort_keys=True, default=str)) for c in assistant.tool_calls]
        results = [_TIMING.sub("#", m.content) for m in observed]  # "1 failed in 0.21s" twice is a repeat
        key = json.dumps([assistant.content.strip(), calls, results, list(errors)])
        earlier = self._seen.setdefault(key, len(self.turns))
        if earlier == len(self.turns):
            self._repeat_run = 0
            return None
        self._repeat_run += 1
        self.meta.setdefault("repeated_turns", []).append(len(self.turns))
        return earlier if self.cfg.repeat_notice else None

    # -- tools

    def _execute(self, calls: list[ToolCall]) -> tuple[list[ToolExecution], bool]:
        """Run the calls (up to the first `submit`); -> executions in call order, submitted?"""
        cut = next((i for i, c in enumerate(calls) if c.name == SUBMIT and self.cfg.allow_submit), None)
        runnable = calls if cut is None else calls[:cut]
        execs: list[ToolExecution] = []
        for batch in _batches(runnable, self.cfg.parallel_tools):
            if len(batch) == 1:
                execs.append(self._run_one(batch[0]))
            else:
                execs.extend(self._pool_get().map(self._run_one, batch))
        if cut is not None:
            execs.append(self._record(calls[cut], ToolResult(ok=True, output="Submitted."), time.monotonic()))
            skipped = ToolResult.fail("not run: submit ended the episode")
            execs.extend(self._record(c, skipped, time.monotonic()) for c in calls[cut + 1 :])
        return execs, cut is not None

    def _run_one(self, call: ToolCall) -> ToolExecution:
        start = time.monotonic()
        if call.name not in self.cfg.tools:
            offered = list(self.cfg.tools) + ([SUBMIT] if self.cfg.allow_submit else [])
            result = ToolResult.fail(f"unknown tool {call.name!r}; available tools: {', '.join(offered)}")
        else:
            try:
                result = _call_tool(call.name, call.arguments, self.ctx)
            except Exception as e:  # noqa: BLE001 - run_tool promises not to raise; I don't rely on it
                result = ToolResult.fail(f"tool {call.name} crashed: {type(e).__name__}: {e}")
        return self._record(call, result, start)

    def _record(self, call: ToolCall, result: ToolResult, start: float) -> ToolExecution:
        return ToolExecution(call=call, result=result, started_s=start - self.t0, duration_s=time.monotonic() - start)

    def _pool_get(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.cfg.max_parallel, thread_name_prefix="etude-tool")
        return self._pool

    # -- limits, tokens, snapshot

    def limit_reached(self) -> StopReason | None:
        if len(self.turns) >= self.cfg.max_steps:
            return "max_steps"
        if self.context_tokens >= self.cfg.max_total_tokens:
            return "max_tokens"
        if time.monotonic() - self.t0 >= self.cfg.time_limit_s:
            return "timeout"
        return None

    def _count_tokens(self, gen: Generation) -> None:
        p, c, src = _measured(gen) or (
            _estimate(sum(_message_chars(m) for m in self.messages)), _estimate(len(gen.text)), "estimated")
        self.prompt_tokens += p
        self.completion_tokens += c
        self.context_tokens = p + c
        self.token_sources.add(src)

    def finish(self, diff_fn: Callable[[], str] | None) -> None:
        if diff_fn is not None:
            try:
                self.diff = diff_fn()
            except Exception as e:  # noqa: BLE001 - a failed diff must not lose the episode
                self.meta["diff_error"] = f"{type(e).__name__}: {e}"
        self.complete = True
        self.t_end = time.monotonic()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def snapshot(self) -> dict[str, Any]:
        """`trajectory().to_dict()`, built incrementally: messages and turns are frozen and only
        appended, so each is serialised once instead of on every step (that was quadratic)."""
        traj = self.trajectory()
        self._dicts["messages"].extend(m.to_dict() for m in self.messages[len(self._dicts["messages"]) :])
        self._dicts["turns"].extend(t.to_dict() for t in self.turns[len(self._dicts["turns"]) :])
        head = {f.name: getattr(traj, f.name) for f in dataclasses.fields(traj) if f.name not in self._dicts}
        return {**head, **self._dicts}

    def trajectory(self) -> Trajectory:
        meta = dict(self.meta, complete=self.complete, token_counts="+".join(sorted(self.token_sources)) or "none")
        return Trajectory(
            episode_id=self.episode_id, task_id=self.task_id,
            policy_id=policy_name(self.policy)[0], policy_version=policy_name(self.policy)[1],
            messages=tuple(self.messages), turns=tuple(self.turns),
            stop_reason=self.stop if (self.stop and self.complete) else "error",
            diff=self.diff, wall_s=(self.t_end or time.monotonic()) - self.t0,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
            config=dict(self.cfg.to_dict(), native_tools=self.native), meta=meta,
        )


# ---------------------------------------------------------------- helpers


def _call_tool(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return run_tool(name, args, ctx)


def _schemas(cfg: HarnessConfig) -> list[dict[str, Any]]:
    known = available()  # TOOL_NAMES whose module is installed (semantic_search may be absent)
    unknown = [n for n in cfg.tools if n not in known]
    if unknown:
        raise EtudeError(f"unknown tool(s) in HarnessConfig.tools: {', '.join(unknown)}; available: {', '.join(known)}")
    schemas = list(tool_schemas(list(cfg.tools))) if cfg.tools else []
    return schemas + ([SUBMIT_SCHEMA] if cfg.allow_submit else [])


def _batches(calls: Sequence[ToolCall], parallel: bool) -> list[list[ToolCall]]:
    """Group consecutive read-only calls; every other call is a batch of its own."""
    out: list[list[ToolCall]] = []
    for c in calls:
        if parallel and c.name in READ_ONLY_TOOLS and out and out[-1][-1].name in READ_ONLY_TOOLS:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _tool_message(x: ToolExecution, max_chars: int) -> Message:
    r = x.result
    body = r.output if r.ok else f"Error: {r.error}" + (f"\n{r.output}" if r.output else "")
    return Message(role="tool", content=_clip(body, max_chars), tool_call_id=x.call.id, name=x.call.name)


_TIMING = re.compile(r"\d+\.\d+ ?s\b")


def _notice_message(errors: Sequence[str], repeat_of: int | None) -> Message:
    """One user message after the tool results: the calls that could not be read, and/or that
    this turn repeats turn `repeat_of` (1-based in the text, as a person counts steps)."""
    parts = []
    if errors:
        lines = "\n".join(f"- {e}" for e in errors)
        parts.append(f"These tool calls could not be read and were not run:\n{lines}\nFix them and try again.")
    if repeat_of is not None:
        parts.append(f"This step is the same as step {repeat_of + 1}, with the same result: nothing changed. "
                     "Repeating it will not help; do something different.")
    return Message(role="user", content="\n".join(parts))


def _clip(s: str, max_chars: int) -> str:
    if len(s) <= max_chars:
        return s
    half = max_chars // 2
    return f"{s[:half]}\n[... {len(s) - 2 * half} characters cut ...]\n{s[-half:]}"


def _message_chars(m: Message) -> int:
    return len(m.content) + sum(len(c.name) + len(str(c.arguments)) for c in m.tool_calls)


def _measured(gen: Generation) -> tuple[int, int, str] | None:
    """(prompt, completion, source) tokens of `gen` from its token ids, else its reported usage;
    None when it has neither."""
    if gen.token_ids or gen.prompt_token_ids:
        return len(gen.prompt_token_ids), len(gen.token_ids), "ids"
    p, c = getattr(gen, "prompt_tokens", None), getattr(gen, "completion_tokens", None)
    return (int(p), int(c), "usage") if p is not None and c is not None else None


def _context_of(gen: Generation, fallback: int) -> int:
    """The conversation's length after `gen` (prompt + completion), or `fallback` when unmeasured."""
    m = _measured(gen)
    return m[0] + m[1] if m else fallback


def _estimate(chars: int) -> int:
    return math.ceil(chars / 4)
