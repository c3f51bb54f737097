"""summary.json from the records of a run: correctness, adherence, efficiency, reward, flags.

Every rate is a mean over tasks of the per-task mean over samples, with a bootstrap interval over
tasks. An episode whose record is an infrastructure error counts as unresolved (and is counted
under `errors`); a task with no record at all is `missing` and counts as unresolved too, so an
incomplete run never looks better than it is.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from etude.evals.adherence import COMPONENTS
from etude.evals.config import EvalConfig
from etude.evals.stats import mean_ci, pass_at_k, wilson_ci
from etude.types import Task

EFFICIENCY = ("turns", "tool_calls", "parallel_calls", "prompt_tokens", "completion_tokens", "tokens", "wall_s",
              "broken_calls", "clarifications")  # fmt: skip


def by_task(records: Sequence[dict[str, Any]], tasks: Sequence[Task]) -> dict[str, list[dict[str, Any]]]:
    """Records grouped by instance id, for the suite's tasks only, in suite order."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[r["instance_id"]].append(r)
    return {t.instance_id: sorted(groups.get(t.instance_id, []), key=lambda r: r.get("sample", 0)) for t in tasks}


def task_mean(recs: list[dict[str, Any]], get: Callable[[dict[str, Any]], Any]) -> float | None:
    vals = [v for v in (get(r) for r in recs) if v is not None]
    return sum(float(v) for v in vals) / len(vals) if vals else None


def _ok(r: dict[str, Any]) -> bool:
    return r.get("status") == "ok"


def getters() -> dict[str, Callable[[dict[str, Any]], Any]]:
    """Per-record value of each metric (None where it does not apply)."""
    g: dict[str, Callable[[dict[str, Any]], Any]] = {
        "resolved": lambda r: float(bool(r.get("resolved"))),
        "partial": lambda r: float(bool(r.get("partial"))),
        "adherence": lambda r: (r.get("adherence") or {}).get("score") if _ok(r) else None,
        "reward": lambda r: (r.get("reward") or {}).get("total") if _ok(r) else None,
    }
    for name in EFFICIENCY:
        g[name] = lambda r, name=name: (r.get("efficiency") or {}).get(name) if _ok(r) else None
    return g


def _per_task(groups: dict[str, list[dict[str, Any]]], get: Callable, missing_as: float | None) -> list[float | None]:
    return [task_mean(recs, get) if recs else missing_as for recs in groups.values()]


def _pass_at(groups: dict[str, list[dict[str, Any]]], samples: int, kw: dict) -> dict[str, Any]:
    out = {}
    for k in range(1, samples + 1):
        vals = [pass_at_k(len(r), sum(bool(x.get("resolved")) for x in r), k) if len(r) >= k else 0.0
                for r in groups.values()]  # fmt: skip
        out[str(k)] = mean_ci(vals, **kw)
    return out


def _efficiency(groups: dict[str, list[dict[str, Any]]], kw: dict) -> dict[str, Any]:
    out = {}
    recs = [r for rs in groups.values() for r in rs if _ok(r)]
    for name, get in getters().items():
        if name not in EFFICIENCY:
            continue
        vals = [float(v) for v in (get(r) for r in recs) if v is not None]
        out[name] = {**mean_ci(_per_task(groups, get, None), **kw),
                     "median": statistics.median(vals) if vals else None, "total": sum(vals)}  # fmt: skip
    out["stop_reasons"] = dict(Counter((r.get("efficiency") or {}).get("stop_reason") for r in recs))
    return out


def behaviour(groups: dict[str, list[dict[str, Any]]], confidence: float = 0.95) -> dict[str, Any]:
    """How the agent works, over every finished episode: the share of its tool calls that were
    well formed and of its calls issued alongside others in one turn (Wilson intervals over calls),
    the share of its turns that repeated an earlier turn exactly (etude.harness.loop),
    and per-episode means of turns, tool calls and tokens; tokens per resolved episode is all
    tokens spent divided by the episodes resolved (None when none was)."""
    recs = [r for rs in groups.values() for r in rs if _ok(r)]
    eff = [r.get("efficiency") or {} for r in recs]
    issued = sum(int(e.get("calls_issued", 0)) for e in eff)
    good = sum(int(e.get("calls_well_formed", 0)) for e in eff)
    calls = sum(int(e.get("tool_calls", 0)) for e in eff)
    parallel = sum(int(e.get("parallel_calls", 0)) for e in eff)
    tokens = [float(e.get("tokens", 0)) for e in eff]
    resolved = sum(1 for r in recs if r.get("resolved"))
    turns = sum(int(e.get("turns", 0)) for e in eff)
    repeated = sum(int(e.get("repeated_turns", 0)) for e in eff)

    def prop(k: int, n: int) -> dict[str, Any]:
        low, high = wilson_ci(k, n, confidence) if n else (None, None)
        return {"mean": k / n if n else None, "ci_low": low, "ci_high": high, "k": k, "n": n}

    def avg(key: str) -> float | None:
        vals = [float(e.get(key, 0)) for e in eff]
        return statistics.fmean(vals) if vals else None

    return {
        "episodes": len(recs),
        "valid_call_rate": prop(good, issued),
        "parallel_call_share": prop(parallel, calls),
        "repeated_turn_share": prop(repeated, turns),
        "turns_mean": avg("turns"),
        "tool_calls_mean": avg("tool_calls"),
        "tokens_mean": statistics.fmean(tokens) if tokens else None,
        "tokens_per_resolved": sum(tokens) / resolved if resolved else None,
    }


def _component_getter(c: str) -> Callable[[dict[str, Any]], Any]:
    def get(r: dict[str, Any]) -> Any:
        return ((r.get("adherence") or {}).get("components") or {}).get(c) if _ok(r) else None

    return get


def _adherence(groups: dict[str, list[dict[str, Any]]], kw: dict) -> dict[str, Any]:
    comps = {c: mean_ci(_per_task(groups, _component_getter(c), None), **kw) for c in COMPONENTS}
    return {"score": mean_ci(_per_task(groups, getters()["adherence"], None), **kw), "components": comps}


def by_repo(groups: dict[str, list[dict[str, Any]]], tasks: Sequence[Task], kw: dict) -> dict[str, Any]:
    """Per repository (a suite of several, e.g. builtin:history): tasks, resolved rate, adherence
    score and turns and tokens per episode, each a mean over that repository's tasks."""
    repo_of = {t.instance_id: t.repo for t in tasks}
    g, out = getters(), {}
    for repo in sorted(set(repo_of.values())):
        sub = {i: rs for i, rs in groups.items() if repo_of.get(i) == repo}
        out[repo] = {"tasks": len(sub), "resolved_rate": mean_ci(_per_task(sub, g["resolved"], 0.0), **kw),
                     "adherence": mean_ci(_per_task(sub, g["adherence"], None), **kw),
                     **{k: mean_ci(_per_task(sub, g[k], None), **kw) for k in ("turns", "tokens")}}  # fmt: skip
    return out


def summarise(records: Sequence[dict[str, Any]], tasks: Sequence[Task], cfg: EvalConfig,
              manifest: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The run's summary (see the module docstring)."""
    groups = by_task(records, tasks)
    kw = {"resamples": cfg.bootstrap, "confidence": cfg.confidence, "seed": cfg.seed}
    g = getters()
    flags = Counter(f["name"] for rs in groups.values() for r in rs for f in r.get("flags") or ())
    return {
        "model": manifest["model"],
        "suite_sha256": manifest["suite_sha256"],
        "tasks": len(tasks),
        "samples": cfg.samples,
        "episodes": sum(len(r) for r in groups.values()),
        "errors": sum(1 for rs in groups.values() for r in rs if not _ok(r)),
        "missing": [i for i, rs in groups.items() if not rs],
        "confidence": cfg.confidence,
        "correctness": {
            "resolved_rate": mean_ci(_per_task(groups, g["resolved"], 0.0), **kw),
            "partial_rate": mean_ci(_per_task(groups, g["partial"], 0.0), **kw),
            "pass_at_k": _pass_at(groups, cfg.samples, kw),
        },
        "adherence": _adherence(groups, kw),
        "efficiency": _efficiency(groups, kw),
        "behaviour": behaviour(groups, cfg.confidence),
        "reward": mean_ci(_per_task(groups, g["reward"], None), **kw),
        "flags": dict(sorted(flags.items())),
        **({"by_repo": by_repo(groups, tasks, kw)} if len({t.repo for t in tasks}) > 1 else {}),
    }
