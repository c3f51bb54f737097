"""Does the always-valid readout promote on noise, with and without a burn-in? The loop's whole
decision rule (`etude.loop.plan.aa_check`: hack alarms, guardrails, primary) on real
production-only traffic: the collect windows of bench/loop_cycles.py's runs, each re-dealt
`--splits` times into two arms of half its users, read once with every interim look counted
(`min_look_users = 0`, the rule before stop 54) and once with a burn-in (`--burn-in`, looks
counted once each arm has that many users). Every promotion of an A/A re-deal is false; issue 46
asks for at most alpha.

    .venv/bin/python bench/aa_burnin.py --window runs/loop_cycles_nw0/loop [--window ...]

A window is a loop root (its etude.db and cycle-0001/state.json's collect window); the plan is
configs/loop_behaviour.toml's with the window's measured user_cv and its mde. The databases are
not committed (they hold the simulated users' sessions): the records are the re-deals' outcomes,
which bench/verify.py recomputes the rates from. Not guaranteed: that other windows behave alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from etude.configfile import shipped
from etude.evals.results import write_result
from etude.loop import LoopConfig
from etude.loop.plan import CanaryPlan, collect_user_cv, window_rows, with_user_cv
from etude.loop.readout import aa_rates
from etude.provenance import provenance
from etude.store import open_store

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "config": "str",
    "splits": "int",
    "burn_in": "int",
    "alpha": "float",
    "windows": "list",
}
ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--window", action="append", required=True, help="a loop root with a collected cycle-0001")
    ap.add_argument("--splits", type=int, default=200)
    ap.add_argument("--burn-in", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "aa_burnin.json"))
    a = ap.parse_args(argv)
    t0, stages = time.time(), {}
    base = LoopConfig.from_toml(shipped("configs/loop_behaviour.toml"))
    records, figures, windows = [], {}, []
    for w in a.window:
        root = Path(w).resolve()
        state = root / "cycle-0001" / "state.json"
        if not (state.is_file() and (root / "etude.db").is_file()):
            print(f"aa_burnin: {root} has no cycle-0001/state.json and etude.db")
            return 2
        c = json.loads(state.read_text())["stages"]["collect"]["outputs"]
        name = root.parent.name
        cfg = dataclasses.replace(base, root=str(root), org="loop", db=None)
        store = open_store(cfg.db_url())
        rows = window_rows(store, cfg, c["since"], c["until"])
        cv, users = collect_user_cv(rows, cfg)
        windows.append({"name": name, "users": users, "user_cv": cv, "since": c["since"], "until": c["until"]})
        for burn in (0, a.burn_in):
            t = time.time()
            p = CanaryPlan("ab", base.canary.mde, "window", (users // 2,) * 2, (users / 2,) * 2, "", cv)
            planned = dataclasses.replace(cfg, canary=with_user_cv(base.canary, cv, mde=p.mde, min_look_users=burn))
            aa = aa_rates(rows, planned, splits=a.splits, seed=1)
            sel = {"record": "aa_split", "window": name, "burn_in": burn}
            records += [{**sel, "split": o["split"], "outcome": o["outcome"], "promote": int(o["outcome"] == "promote"),
                         "rollback": int(o["outcome"] in ("guardrail", "alarm"))} for o in aa["outcomes"]]
            figures[f"aa_false_promotion_rate.{name}.burn_in_{burn}"] = {"kind": "rate", "of": sel, "field": "promote"}
            figures[f"aa_false_rollback_rate.{name}.burn_in_{burn}"] = {"kind": "rate", "of": sel, "field": "rollback"}
            stages[f"{name} burn-in {burn}"] = round(time.time() - t, 3)
            print(f"{name}: {users} users, burn-in {burn}: promote {aa['false_promotion']['k']}/{a.splits}, "
                  f"guardrail or alarm rollback {aa['false_guardrail_rollback']['k'] + aa['false_alarm_rollback']['k']}")
    meta = {"what": "A/A re-deals of real production-only collect windows under the loop's rule, every interim look "
                    "counted against a burn-in", "config": "configs/loop_behaviour.toml", "splits": a.splits,
            "burn_in": a.burn_in, "alpha": base.canary.alpha, "windows": windows}
    write_result(Path(a.out), figures, records, provenance(seeds={"aa": 1}, started=t0, stages=stages), meta=meta)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
