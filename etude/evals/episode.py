"""One evaluation episode as a results.jsonl record: the episode (etude.envs.run_episode: fresh
workspace, harness, grading in a clean copy), its reward breakdown and hack flags
(etude.rewards), adherence against the gold patch and efficiency counts.

Both executors of `run_eval` (etude.evals.runner: a thread pool here, or a Ray task on any node,
etude.evals.raypool) call `episode_record`; it never raises: a failure outside the model is a
record with status "error".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etude.envs import run_episode
from etude.evals.adherence import adherence, patch_facts
from etude.evals.config import EvalConfig
from etude.rewards import apply_flags, breakdown_json, score
from etude.rewards.terms import answers, asks_question, repeats
from etude.tasks.repo import prepare_repo
from etude.types import Task, Trajectory

_GOLD: dict[str, Any] = {}
_GOLD_LOCK = threading.Lock()


def _gold_facts(task: Task, template: Path, cfg: EvalConfig) -> Any:
    # Keyed by content, not id: two suites may reuse an instance id for another patch.
    key = hashlib.sha256(json.dumps([str(template), task.patch, list(cfg.ruff_select)]).encode()).hexdigest()
    with _GOLD_LOCK:
        if key not in _GOLD:
            _GOLD[key] = patch_facts(template, task.patch, cfg.ruff_select)
        return _GOLD[key]


def adherence_of(task: Task, diff: str, cfg: EvalConfig) -> dict[str, Any]:
    """The adherence block of a record (see etude.evals.adherence); never raises for a bad patch."""
    template = prepare_repo(task)
    try:
        gold = _gold_facts(task, template, cfg)
        agent = patch_facts(template, diff, cfg.ruff_select)
    except Exception as e:  # noqa: BLE001 - an analysis failure must not void the episode's record
        return {"score": None, "components": {}, "error": f"{type(e).__name__}: {e}"}
    return adherence(agent, gold, cfg.adherence_weights)


def efficiency(traj: Trajectory) -> dict[str, Any]:
    """Counts of one episode. `parallel_calls`: calls issued in a turn together with others."""
    per_turn = [sum(1 for x in t.tool_executions if x.call.name != "submit") for t in traj.turns]
    executed = [x for t in traj.turns for x in t.tool_executions]
    malformed = sum(len(t.parse_errors) for t in traj.turns) + sum(1 for x in executed if _malformed(x.result))
    all_calls = len(executed) + sum(len(t.parse_errors) for t in traj.turns)
    return {
        "turns": len(traj.turns),
        "repeated_turns": len(traj.meta.get("repeated_turns") or ()),  # the same reply and results again
        "repeated_calls": repeats(traj),  # calls identical (tool, arguments) to an earlier one: the loop's repeat_rate
        "tool_calls": sum(per_turn),
        "calls_issued": all_calls,  # every call the model wrote, well-formed or not (submit included)
        "calls_well_formed": all_calls - malformed,  # parsed, named a tool offered, arguments fit its schema
        "parallel_calls": sum(n for n in per_turn if n > 1),
        "max_calls_per_turn": max(per_turn, default=0),
        "prompt_tokens": traj.prompt_tokens,
        "completion_tokens": traj.completion_tokens,
        "tokens": traj.prompt_tokens + traj.completion_tokens,
        "wall_s": round(traj.wall_s, 3),
        "broken_calls": traj.broken_calls,
        "clarifications": sum(1 for a in answers(traj) if asks_question(a)),
        "stop_reason": traj.stop_reason,
        "token_counts": traj.meta.get("token_counts"),
    }


def _malformed(r: Any) -> bool:
    kind = (r.meta or {}).get("error_kind")
    return (not r.ok) and (kind in ("unknown_tool", "invalid_arguments", "invalid_call")
                           or (r.error or "").startswith("unknown tool"))


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120]


def episode_record(
    task: Task, sample: int, factory: Callable, cfg: EvalConfig, out: Path, model: str
) -> dict[str, Any]:
    """One episode, scored and measured, as a results.jsonl record (status "error" on failure)."""
    t0 = time.monotonic()
    rel = trajectory_path(task, sample)
    (out / rel).parent.mkdir(parents=True, exist_ok=True)
    try:
        policy = factory(task, sample)
        traj, outcome = run_episode(task, policy, cfg.harness_config(), trajectory_path=out / rel)
        breakdown = score(traj, task, outcome, cfg.reward_config())
        reported = apply_flags(outcome, breakdown.flags)
        adh = adherence_of(task, traj.diff, cfg)
    except Exception as e:  # noqa: BLE001 - one broken episode must not stop the run
        return error_record(task, sample, model, f"{type(e).__name__}: {e}", time.monotonic() - t0, os.getpid())
    base = {"instance_id": task.instance_id, "sample": sample, "model": model, "pid": os.getpid()}
    outcome_d = dataclasses.replace(reported, log_tail=reported.log_tail[-1500:]).to_dict()
    return {
        **base, "status": "ok", "policy_id": traj.policy_id, "policy_version": traj.policy_version,
        "resolved": reported.resolved, "partial": reported.partial, "resolved_before_flags": outcome.resolved,
        "outcome": outcome_d, **breakdown_json(breakdown), "adherence": adh, "efficiency": efficiency(traj),
        "diff": traj.diff, "trajectory": str(rel), "episode_s": round(time.monotonic() - t0, 3), "finished_at": _now(),
    }  # fmt: skip


def trajectory_path(task: Task, sample: int) -> Path:
    """Where an episode's trajectory lies, relative to the run folder."""
    return Path("trajectories") / f"{_safe(task.instance_id)}-{sample}.jsonl"


def error_record(task: Task, sample: int, model: str, error: str, seconds: float, pid: int | None) -> dict[str, Any]:
    """The record of an episode that failed for a reason outside the model (status "error");
    `pid` None: the process that ran it is unknown (a Ray worker that died)."""
    return {"instance_id": task.instance_id, "sample": sample, "model": model, "pid": pid,
            "status": "error", "error": error, "resolved": False, "partial": False,
            "episode_s": round(seconds, 3), "finished_at": _now()}  # fmt: skip


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
