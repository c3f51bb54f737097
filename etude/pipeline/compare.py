"""Paired comparisons of evaluations of the same tasks (base and trained models): resolved with
Wilson 95% intervals, exact McNemar p, gained and lost tasks, a one-sided exact test of harm,
valid-call rate and tokens per episode, and the per-task records they were computed from.

`paired_runs` is the one paired comparison of named runs (`b_vs_a` per pair); `outcome_table`
(the demo's held-out table) and bench/agent_learning.py build on it; `paired_table` is
`etude specialise`'s base-vs-adapter report."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etude.evals.records import paired_outcomes, read_records, resolved_by_task, tool_use_by_task
from etude.evals.stats import discordant, mcnemar_exact, paired_summary, wilson_ci


def harm_p(losses: int, gains: int) -> float:
    """One-sided exact p of H0 "the second arm is no worse" against "it loses more tasks than it
    gains" (a sign test on the discordant pairs); 1.0 with no discordant pair."""
    from scipy.stats import binomtest

    if losses + gains == 0:
        return 1.0
    return float(binomtest(losses, losses + gains, 0.5, alternative="greater").pvalue)


def _behaviour(run: Path) -> dict[str, Any]:
    s = json.loads((run / "summary.json").read_text())
    b = s.get("behaviour") or {}
    return {"valid_call_rate": (b.get("valid_call_rate") or {}).get("mean"), "tokens_per_episode": b.get("tokens_mean")}


def arm(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson_ci(k, n)
    return {"resolved": k, "rate": k / n if n else 0.0, "ci95": [lo, hi]}


def paired_table(base_run: Path, new_run: Path, names: tuple[str, str] = ("base", "adapter")) -> dict[str, Any]:
    """The comparison of `new_run` against `base_run` on the tasks both evaluated."""
    a, b = resolved_by_task(Path(base_run)), resolved_by_task(Path(new_run))
    ids = sorted(set(a) & set(b))
    xa, xb = [a[i] for i in ids], [b[i] for i in ids]
    losses, gains = discordant(xa, xb)
    out: dict[str, Any] = {"tasks": len(ids)}
    for name, xs, run in ((names[0], xa, base_run), (names[1], xb, new_run)):
        out[name] = {**arm(sum(xs), len(ids)), **_behaviour(Path(run))}
    out.update({"gain_points": (sum(xb) - sum(xa)) / max(1, len(ids)), "mcnemar_p": mcnemar_exact(xa, xb),
                "gained": gains, "lost": losses, "harm_p": harm_p(losses, gains),
                "per_task": {i: {names[0]: a[i], names[1]: b[i]} for i in ids}})
    return out


def paired_runs(runs: Mapping[str, Path], pairs: Sequence[tuple[str, str]],
                only: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """For each pair (b, a) of run names whose runs are both given, `b_vs_a`: run b against run a
    on the tasks both evaluated (and in `only`): the change in resolved rate, the tasks only b and
    only a resolved, exact McNemar p (etude.evals.records.paired_outcomes)."""
    return {f"{b}_vs_{a}": paired_outcomes(Path(runs[a]), Path(runs[b]), only) for b, a in pairs
            if a in runs and b in runs}


def outcome_table(runs: Mapping[str, Path], pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """On the tasks every run evaluated: per run name, resolved and `tool_use` (episodes with a
    well-formed tool call), each with a Wilson 95% interval; per pair (b, a) of given runs,
    `b_vs_a`: the paired change of both (`gain`, `mcnemar_p`, `tool_use_gain`, `tool_use_mcnemar_p`)."""
    res = {n: resolved_by_task(Path(p)) for n, p in runs.items()}
    use = {n: tool_use_by_task(Path(p)) for n, p in runs.items()}
    ids = sorted(set.intersection(*(set(r) for r in res.values())))
    table: dict[str, Any] = {}
    for n, r in res.items():
        k, u = sum(r[i] for i in ids), sum(use[n][i] for i in ids)
        lo, hi = wilson_ci(k, len(ids))
        table[n] = {"resolved": k, "tasks": len(ids), "rate": k / max(1, len(ids)), "ci95": [lo, hi],
                    "tool_use": {"episodes": u, "rate": u / max(1, len(ids)), "ci95": list(wilson_ci(u, len(ids)))}}
    resolved = paired_runs(runs, pairs, ids)
    for b, a in pairs:
        name = f"{b}_vs_{a}"
        if name not in resolved:
            continue
        p = resolved[name]
        q = paired_summary([use[a][i] for i in ids], [use[b][i] for i in ids])
        table[name] = {"gain": p["gain_points"], "mcnemar_p": p["mcnemar_p"],
                       "tool_use_gain": q["gain_points"], "tool_use_mcnemar_p": q["mcnemar_p"]}
    return table


def eval_records(runs: dict[str, Path]) -> list[dict[str, Any]]:
    """Per-episode records of evaluations (arm name -> run folder), in the flat form that
    etude.evals.results.write_result takes: arm, task, resolved, tool_use (a well-formed call),
    edited (a non-empty diff), tokens. Runs that do not exist are left out."""

    out: list[dict[str, Any]] = []
    for arm_name, run in runs.items():
        f = Path(run) / "results.jsonl"
        if not f.is_file():
            continue
        for r in read_records(f).values():
            ok = r.get("status") == "ok"
            eff = r.get("efficiency") or {}
            out.append({"arm": arm_name, "task": r["instance_id"], "sample": r.get("sample", 0),
                        "resolved": int(bool(r.get("resolved")) and ok),
                        "tool_use": int(ok and int(eff.get("calls_well_formed", 0) or 0) > 0),
                        "edited": int(ok and bool(r.get("diff"))),  # the episode changed the repository
                        "tokens": eff.get("tokens")})
    return out


def paired_figures(prefix: str, a: str, b: str, family: str | None = None) -> dict[str, dict[str, Any]]:
    """Result-file figure specs (etude.evals.results) for arms `a` and `b` on the same tasks:
    each arm's resolved rate and the paired comparison (exact McNemar)."""
    figs: dict[str, dict[str, Any]] = {
        f"{prefix}.{a}.resolved": {"kind": "rate", "of": {"arm": a}, "field": "resolved"},
        f"{prefix}.{b}.resolved": {"kind": "rate", "of": {"arm": b}, "field": "resolved"},
        f"{prefix}.{b}_vs_{a}": {"kind": "paired", "a": {"arm": a}, "b": {"arm": b}, "key": "task",
                                 "field": "resolved"},
    }
    if family:
        figs[f"{prefix}.{b}_vs_{a}"]["family"] = family
    return figs
