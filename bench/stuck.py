"""Should the agent's harness end an episode that is stuck repeating itself? Decided on the
general validation split (never the test split, never an org's held-out functions).

`HarnessConfig.stop_on_repeats` = k ends an episode after k turns in a row that each repeat an
earlier turn exactly (same reply, same tool results). This script measures it two ways:

1. live — evaluates one model on the validation split twice, in sandboxes, greedy, with the
   agent's harness (configs/agent_sft.toml) with the rule off and with it at k; paired by task:
   resolved, edited (a non-empty diff), turns and tokens per episode, wall seconds per episode;
2. replay (`--replay DIR ...`) — reads finished evaluations (run folders whose trajectories list
   their `meta.repeated_turns`) and finds, for each episode, the turn where the rule would have
   ended it: the turns it would have saved, and whether the episode edited a file after that turn
   (the only way a cut could change its outcome) or was resolved.

    python bench/stuck.py [--model runs/general_sft/final] [--tasks 30] [--repeats 2] \
        [--replay runs/bench_specialise_v8/eval-general-base ...]

Writes bench/results/stuck.json and .records.jsonl through write_result.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from etude.evals import EvalConfig, run_eval
from etude.evals.records import read_records
from etude.evals.results import write_result
from etude.harness.record import load_trajectories
from etude.harness.verify import WRITING_TOOLS
from etude.pipeline.compare import eval_records, paired_figures
from etude.pipeline.learning import eval_harness
from etude.policy import resolve_backend
from etude.provenance import provenance

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "model": "str",
    "suite": "str",
    "tasks": "int",
    "repeats": "int",
    "harness": "dict",
    "backend": "str",
    "workers": "int",
    "replay": "list",
    "wall_s": "dict",
}

RESULTS = Path(__file__).resolve().parent / "results"


def live_records(arms: dict[str, Path]) -> list[dict[str, Any]]:
    """eval_records plus turns, stop reason and wall seconds of each episode."""
    extra = {}
    for arm, run in arms.items():
        for r in read_records(run / "results.jsonl").values():
            eff = r.get("efficiency") or {}
            extra[(arm, r["instance_id"])] = {"turns": eff.get("turns"), "stop_reason": eff.get("stop_reason"),
                                              "episode_s": r.get("episode_s")}
    return [{**rec, "kind": "live", **extra[(rec["arm"], rec["task"])]} for rec in eval_records(arms)]


def replay_records(run: Path, k: int) -> list[dict[str, Any]]:
    """One record per episode of a finished evaluation: where `stop_on_repeats = k` would have
    ended it (`cut`: the turn index, -1 for never), the turns that saves, and whether a file was
    edited after the cut or the episode was resolved."""
    resolved = {r["instance_id"]: int(bool(r.get("resolved"))) for r in read_records(run / "results.jsonl").values()}
    out = []
    for path in sorted((run / "trajectories").glob("*.jsonl")):
        snapshots = load_trajectories(path)  # the file is rewritten each turn: the last one is the episode
        if not snapshots:
            continue
        traj = snapshots[-1]
        turns, repeated = traj.get("turns") or [], set((traj.get("meta") or {}).get("repeated_turns") or [])
        cut, run_len = -1, 0
        for i in range(len(turns)):
            run_len = run_len + 1 if i in repeated else 0
            if run_len >= k:
                cut = i
                break
        later = turns[cut + 1:] if cut >= 0 else []
        edit_after = any(x["call"]["name"] in WRITING_TOOLS and (x.get("result") or {}).get("ok")
                         for t in later for x in (t.get("tool_executions") or []))
        cut_resolved = cut >= 0 and resolved.get(traj["task_id"], 0)
        out.append({"kind": "replay", "arm": f"replay:{run.parent.name}/{run.name}", "task": traj["task_id"],
                    "turns": len(turns), "cut": cut, "stopped": int(cut >= 0),
                    "saved": len(turns) - 1 - cut if cut >= 0 else 0, "edit_after_cut": int(edit_after),
                    "resolved": resolved.get(traj["task_id"], 0), "resolved_cut": int(bool(cut_resolved))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="runs/general_sft/final")
    ap.add_argument("--suite", default="builtin:curriculum:validation")
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=2, help="k of stop_on_repeats in the 'on' arm")
    ap.add_argument("--agent-config", default="configs/agent_sft.toml")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--replay", nargs="*", default=[], help="finished evaluation folders to replay the rule on")
    ap.add_argument("--runs", default="runs/bench_stuck")
    ap.add_argument("--out", default=str(RESULTS / "stuck.json"))
    a = ap.parse_args()
    t0 = time.time()
    if a.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    for d in a.replay:
        if "test" in Path(d).name or not (Path(d) / "trajectories").is_dir():
            raise SystemExit(f"--replay {d}: not an evaluation folder of a validation suite")
    h = eval_harness(a.agent_config)
    backend = resolve_backend(a.backend)
    arms = {"off": Path(a.runs) / "off", "on": Path(a.runs) / f"on-{a.repeats}"}
    stages: dict[str, dict[str, float]] = {}
    for arm, k in (("off", 0), ("on", a.repeats)):
        t = time.monotonic()
        cfg = EvalConfig(workers=a.workers, harness=h.replace(stop_on_repeats=k), bootstrap=200, backend=backend,
                         max_tasks=a.tasks)
        run_eval(a.suite, a.model, arms[arm], cfg, use="select", fresh_for_new_weights=True)
        stages[arm] = {"seconds": round(time.monotonic() - t, 1)}
    records = live_records(arms)
    for d in a.replay:
        records += replay_records(Path(d), a.repeats)
    on, off = {"arm": "on"}, {"arm": "off"}
    figures = {
        **paired_figures("live", "off", "on"),
        "live.edited.on_vs_off": {"kind": "paired", "a": off, "b": on, "key": "task", "field": "edited"},
        "live.turns.off": {"kind": "mean", "of": off, "field": "turns"},
        "live.turns.on": {"kind": "mean", "of": on, "field": "turns"},
        "live.tokens.on_over_off": {"kind": "ratio", "num": on, "den": off, "field": "tokens", "stat": "mean"},
        "live.episode_s.on_over_off": {"kind": "ratio", "num": on, "den": off, "field": "episode_s",
                                       "stat": "median"},
    }
    if a.replay:
        rp = {"kind": "replay"}
        figures |= {"replay.stopped": {"kind": "rate", "of": rp, "field": "stopped"},
                    "replay.edit_after_cut": {"kind": "rate", "of": rp, "field": "edit_after_cut"},
                    "replay.resolved_cut": {"kind": "rate", "of": rp, "field": "resolved_cut"},
                    "replay.turns": {"kind": "mean", "of": rp, "field": "turns"},
                    "replay.saved": {"kind": "mean", "of": rp, "field": "saved"}}
    meta = {"what": f"HarnessConfig.stop_on_repeats = {a.repeats} vs off, on the general validation split",
            "model": a.model, "suite": a.suite, "tasks": a.tasks, "repeats": a.repeats, "harness": h.to_dict(),
            "backend": backend, "workers": a.workers, "replay": a.replay,
            "wall_s": {arm: s["seconds"] for arm, s in stages.items()}}
    write_result(Path(a.out), figures, records, provenance(started=t0, stages=stages), meta=meta)
    doc = json.loads(Path(a.out).read_text())
    print(json.dumps({n: {f: v.get(f) for f in ("a_k", "b_k", "n", "p", "rate", "mean", "value", "k")
                          if f in v} for n, v in doc["figures"].items()}, indent=1))


if __name__ == "__main__":
    main()
