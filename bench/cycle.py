"""Loop benchmark: wall time of one real-time RL cycle, stage by stage, against the number of
interactions, on the tiny model with scripted users (etude.loop.users — scripted, not real people).

For each user count (default 2, 4, 8; one session each, a dissatisfied follow-up after every
unresolved session, so about 2 interactions per session and phase) it runs one full cycle of
configs/loop_tiny.toml in a fresh root (fresh SQLite store, fresh registry: production = tiny)
through `etude.loop.run_cycle`, and records each stage's wall seconds from the cycle's state.json.

Beside ours: the per-stage least-squares slope (seconds per interaction) and intercept (fixed
cost) over the runs, and the peer's figure — Cursor's published real-time RL cadence of about
one cycle every 5 hours at production scale (field notes; not measured here, a reference scale).

    .venv/bin/python bench/cycle.py [--users 2,4,8] [--out bench/results/cycle.json]

Not controlled: the machine is shared (its load average is recorded); the first cycle of the
run also pays Python/torch import costs inside the process; the production eval is run in
every cycle here (a long-running loop caches it per production checkpoint).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

PEER = {"name": "Cursor real-time RL (published)", "cycle_s": 5 * 3600, "scale": "production traffic, GPU cluster",
        "measured_here": False}


def one_cycle(users: int, workdir: Path) -> dict[str, Any]:
    from etude.loop import LoopConfig, run_cycle
    from etude.loop.state import STAGES

    cfg = LoopConfig.from_toml(ROOT / "configs" / "loop_tiny.toml")
    cfg = dataclasses.replace(cfg, root=str(workdir / f"users-{users}"),
                              traffic=dataclasses.replace(cfg.traffic, users=users))
    t0 = time.perf_counter()
    rep = run_cycle(cfg, progress=True).to_dict()
    wall = time.perf_counter() - t0
    n = (rep["collect"] or {}).get("interactions", 0) + (rep["canary"] or {}).get("interactions", 0)
    return {"users": users, "interactions_collect": rep["collect"].get("interactions"),
            "interactions_canary": rep["canary"].get("interactions"), "interactions": n, "wall_s": round(wall, 2),
            "stages_s": {s: rep["stages"][s]["wall_s"] for s in STAGES}, "decision": rep["decision"],
            "samples": (rep["distill"] or {}).get("samples"), "load_avg": os.getloadavg()}


def fit(xs: list[float], ys: list[float]) -> dict[str, float | None]:
    if len(set(xs)) < 2:
        return {"slope_s_per_interaction": None, "intercept_s": None}
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {"slope_s_per_interaction": round(slope, 4), "intercept_s": round(my - slope * mx, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", default="2,4,8")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "cycle.json"))
    args = ap.parse_args()
    counts = [int(x) for x in args.users.split(",")]
    with tempfile.TemporaryDirectory(prefix="etude-bench-cycle-") as tmp:
        runs = [one_cycle(u, Path(tmp)) for u in counts]
    from etude.loop.state import STAGES

    xs = [float(r["interactions"]) for r in runs]
    per_stage = {s: {"median_s": statistics.median(r["stages_s"][s] or 0.0 for r in runs),
                     **fit(xs, [r["stages_s"][s] or 0.0 for r in runs])} for s in STAGES}
    med = statistics.median(r["wall_s"] for r in runs)
    result = {"benchmark": "loop cycle (tiny model, scripted users)", "machine": platform.platform(),
              "cpus": os.cpu_count(), "python": platform.python_version(), "runs": runs, "per_stage": per_stage,
              "cycle": {"median_wall_s": med, **fit(xs, [r["wall_s"] for r in runs])},
              "peer": PEER, "ratio_peer_cycle_to_ours": round(PEER["cycle_s"] / med, 1),
              "note": "users are scripted; peer figure is a published cadence at production scale, not a same-run measurement"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    for r in runs:
        print(f"users {r['users']:>2} · interactions {r['interactions']:>3} · cycle {r['wall_s']:7.1f} s · "
              + " ".join(f"{s} {v:.1f}" for s, v in r["stages_s"].items() if v is not None))
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
