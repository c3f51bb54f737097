"""Small builders for trajectories in reward tests (the shapes the harness records)."""

from __future__ import annotations

import itertools
from typing import Any

from etude.types import Generation, Message, Outcome, Task, ToolCall, ToolExecution, ToolResult, Trajectory, Turn

_ids = itertools.count()


def ex(name: str, ok: bool = True, output: str = "", **args: Any) -> ToolExecution:
    """One executed call; `exit_code=` goes to the result's meta for run_terminal."""
    meta = {"exit_code": args.pop("exit_code")} if "exit_code" in args else {}
    call = ToolCall(id=f"c{next(_ids)}", name=name, arguments=args)
    res = ToolResult(ok=ok, output=output, error=None if ok else "failed", meta=meta)
    return ToolExecution(call=call, result=res, started_s=0.0, duration_s=0.01)


def turn(*execs: ToolExecution, parse_errors: tuple[str, ...] = (), text: str = "") -> list:
    return [list(execs), parse_errors, text]


def traj(
    *turns: list, final: str = "Done.", diff: str = "", wall_s: float = 0.0, tokens: int = 0, meta: dict | None = None
) -> Trajectory:
    built, messages = [], [Message(role="user", content="Fix the bug.")]
    for i, (execs, errs, text) in enumerate(turns):
        built.append(Turn(index=i, generation=Generation(text=text), tool_executions=tuple(execs), parse_errors=errs))
        messages.append(Message(role="assistant", content=text, tool_calls=tuple(e.call for e in execs)))
        messages += [Message(role="tool", content=e.result.output, tool_call_id=e.call.id) for e in execs]
    if final is not None:  # the harness records the closing answer as a turn without calls
        built.append(Turn(index=len(built), generation=Generation(text=final)))
        messages.append(Message(role="assistant", content=final))
    return Trajectory(
        episode_id="ep", task_id="t", policy_id="p", policy_version=0, messages=tuple(messages), turns=tuple(built),
        stop_reason="answer", diff=diff, wall_s=wall_s, prompt_tokens=tokens, completion_tokens=0, meta=meta or {},
    )  # fmt: skip


def outcome(resolved: bool, f2p: dict[str, str] | None = None, p2p: dict[str, str] | None = None) -> Outcome:
    return Outcome(instance_id="t", resolved=resolved, partial=False, fail_to_pass=f2p or {}, pass_to_pass=p2p or {})


def task(**kw: Any) -> Task:
    base = dict(instance_id="t", repo="r", base_commit="b", patch="", test_patch="", problem_statement="Fix it.")
    return Task(**{**base, **kw})
