"""Loop benchmark: wall time of one real-time RL cycle, stage by stage, against the number of
interactions, on the tiny model with scripted users (etude.loop.users — scripted, not real people).

For each user count (default 2, 4, 8; one session each, a dissatisfied follow-up after every
unresolved session, so about 2 interactions per session and phase) it runs one full cycle of
configs/loop_tiny.toml in a fresh root (fresh SQLite store, fresh registry: production = tiny)
through `etude.loop.run_cycle`, and records each stage's wall seconds from the cycle's state.json.

Written through `etude.evals.results.write_result`: cycle.json and cycle.records.jsonl, one record
per cycle (users, interactions, wall seconds, decision) and per stage of each cycle (its seconds;
collect and canary also per interaction of theirs). `bench/verify.py` recomputes the median cycle
and stage seconds and the median seconds per canary and per collect interaction. The per-stage
least-squares slope (seconds per interaction) and intercept (fixed cost) over the runs are kept in
`meta` (derived from the records, not verified), beside the peer's figure: Cursor's published
real-time RL cadence of about one cycle every 5 hours at production scale (field notes; not
measured here, a reference scale, so not a same-run ratio).

    .venv/bin/python bench/cycle.py [--users 2,4,8] [--out bench/results/cycle.json] [--quick]

Not controlled: the machine is shared (its load average is recorded; run it alone); the first
cycle of the run also pays Python/torch import costs inside the process; the production eval is
run in every cycle here (a long-running loop caches it per production checkpoint). The cycle's
sessions and its eval gate run on Ray (the config's default), as `etude loop` runs them. `--quick`
is one cycle with 2 users.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from etude.evals.results import write_result
from etude.loop import LoopConfig, run_cycle
from etude.loop.state import STAGES
from etude.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent

PEER = {"name": "Cursor real-time RL (published)", "cycle_s": 5 * 3600, "scale": "production traffic, GPU cluster",
        "measured_here": False}


def one_cycle(users: int, workdir: Path) -> list[dict[str, Any]]:
    """One cycle's records: the cycle's own and one per stage."""
    cfg = LoopConfig.from_toml(ROOT / "configs" / "loop_tiny.toml")
    cfg = dataclasses.replace(cfg, root=str(workdir / f"users-{users}"),
                              traffic=dataclasses.replace(cfg.traffic, users=users))
    t0 = time.perf_counter()
    rep = run_cycle(cfg, progress=True).to_dict()
    wall = time.perf_counter() - t0
    n_collect = (rep["collect"] or {}).get("interactions", 0) or 0
    n_canary = (rep["canary"] or {}).get("interactions", 0) or 0
    at = {"users": users, "interactions": n_collect + n_canary}
    out: list[dict[str, Any]] = [{"measure": "cycle", **at, "seconds": wall, "decision": rep["decision"],
                                  "rolled_back": int(rep["decision"] != "promote"),
                                  "samples": (rep["distill"] or {}).get("samples"),
                                  "load_avg_1m": os.getloadavg()[0]}]
    for s in STAGES:
        r: dict[str, Any] = {"measure": "stage", "stage": s, **at, "seconds": rep["stages"][s]["wall_s"] or 0.0}
        own = {"collect": n_collect, "canary": n_canary}.get(s)
        if own:
            r["stage_interactions"] = own
            r["s_per_interaction"] = r["seconds"] / own
        out.append(r)
    return out


def fit(xs: list[float], ys: list[float]) -> dict[str, float | None]:
    if len(set(xs)) < 2:
        return {"slope_s_per_interaction": None, "intercept_s": None}
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"slope_s_per_interaction": round(slope, 4), "intercept_s": round(my - slope * mx, 3)}


def figures(records: list[dict[str, Any]]) -> dict[str, dict]:
    figs: dict[str, dict] = {
        "cycle_median_s": {"kind": "quantile", "of": {"measure": "cycle"}, "field": "seconds", "q": 0.5},
        "rolled_back": {"kind": "rate", "of": {"measure": "cycle"}, "field": "rolled_back"},
    }
    for s in STAGES:
        figs[f"{s}.median_s"] = {"kind": "quantile", "of": {"measure": "stage", "stage": s}, "field": "seconds", "q": 0.5}
        if any(r.get("stage") == s and "s_per_interaction" in r for r in records):
            if all("s_per_interaction" in r for r in records if r.get("stage") == s):
                figs[f"{s}.median_s_per_interaction"] = {"kind": "quantile", "of": {"measure": "stage", "stage": s},
                                                         "field": "s_per_interaction", "q": 0.5}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default="2,4,8")
    ap.add_argument("--quick", action="store_true", help="smoke run: one cycle with 2 users")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cycle.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.users = "2"
    counts = [int(x) for x in args.users.split(",")]
    started = time.time()
    load0 = os.getloadavg()[0]
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="etude-bench-cycle-") as tmp:
        for u in counts:
            records += one_cycle(u, Path(tmp))
    cycles = [r for r in records if r["measure"] == "cycle"]
    xs = [float(r["interactions"]) for r in cycles]
    meta = {"benchmark": "loop cycle (tiny model, scripted users)", "config": "configs/loop_tiny.toml",
            "users": counts, "load_avg_1m_start": load0,
            "fit_not_verified": {
                "cycle": fit(xs, [r["seconds"] for r in cycles]),
                **{s: fit(xs, [r["seconds"] for r in records if r.get("stage") == s]) for s in STAGES}},
            "peer": PEER,
            "note": "users are scripted; the peer figure is a published cadence at production scale, not a same-run "
                    "measurement"}
    prov = provenance(started=started, argv=["bench/cycle.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(Path(args.out), figures(records), records, prov, meta=meta)
    for c in cycles:
        stages = [r for r in records if r["measure"] == "stage" and r["users"] == c["users"]]
        print(f"users {c['users']:>2} · interactions {c['interactions']:>3} · cycle {c['seconds']:7.1f} s · "
              + " ".join(f"{r['stage']} {r['seconds']:.1f}" for r in stages) + f" · {c['decision']}")
    med = doc["figures"]["cycle_median_s"]["value"]
    print(f"median cycle {med:.1f} s; peer (published, not measured here) {PEER['cycle_s']} s per cycle")
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
