"""Should the specialised agent's evaluations verify its edits? Decided on the select slice of
a finished `etude specialise` run (train-side functions kept out of training for choices like
this one; never the held-out functions).

Evaluates the run's base and its adapter (RUN/merged) on RUN/tasks/select.jsonl with one greedy
attempt per edit turn and with `--verify-edits K` attempts (HarnessConfig.verify_edits: an edit
turn that leaves the request's failing test failing is undone and sampled again), the latter
without and with `verify_unapplied` (an edit turn whose edits were all refused is sampled again
too), in sandboxes, as `etude specialise` evaluates. Six arms, paired by task; `meta.attempts`
counts how each arm's verified attempts ended.

    python bench/specialise_select.py --run runs/bench_specialise [--verify-edits 8]

Writes bench/results/specialise_select.json and .records.jsonl through write_result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path

from etude.evals import EvalConfig, run_eval
from etude.evals.results import write_result
from etude.pipeline.compare import eval_records, paired_figures
from etude.policy import resolve_backend
from etude.provenance import provenance
from etude.train.sft import load_sft_config

RESULTS = Path(__file__).resolve().parent / "results"


def attempt_outcomes(out: Path) -> dict[str, int]:
    """How the verified edit attempts of an evaluation ended (meta.verified_edits of its
    trajectories), and how many edit turns were verified."""
    counts: Counter[str] = Counter()
    for path in sorted((out / "trajectories").glob("*.jsonl")):
        lines = path.read_text().splitlines()
        for rec in json.loads(lines[-1]).get("meta", {}).get("verified_edits", []) if lines else []:
            counts["turns"] += 1
            counts.update(a["outcome"].split(":")[0] for a in rec["attempts"])
    return dict(sorted(counts.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="runs/bench_specialise")
    ap.add_argument("--verify-edits", type=int, default=8)
    ap.add_argument("--agent-config", default="configs/agent_sft.toml")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS / "specialise_select.json"))
    a = ap.parse_args()
    t0 = time.time()
    if a.verify_edits < 2:
        raise SystemExit("--verify-edits must be at least 2 (1 is the greedy arm already evaluated)")
    run = Path(a.run).resolve()
    if not (run / "tasks" / "select.jsonl").is_file() or not (run / "merged").is_dir():
        raise SystemExit(f"--run {run}: not a finished `etude specialise` run (tasks/select.jsonl, merged/)")
    base = json.loads((run / "report.json").read_text())["base"]
    models = {"base": base, "adapter": str(run / "merged")}
    h0 = dataclasses.replace(load_sft_config(a.agent_config).harness_config(), temperature=0.0)
    arms: dict[str, Path] = {}
    stages: dict[str, dict[str, float]] = {}
    k = a.verify_edits
    settings = {"verify0": (0, False), f"verify{k}": (k, False), f"verify{k}-unapplied": (k, True)}
    for setting, (edits, unapplied) in settings.items():
        for name, model in models.items():
            arm = f"{name}-{setting}"
            d = run / "select-eval" / arm
            t = time.monotonic()
            h = h0.replace(verify_edits=edits, verify_unapplied=unapplied)
            cfg = EvalConfig(workers=a.workers, harness=h, bootstrap=200, backend=resolve_backend(a.backend))
            run_eval(run / "tasks" / "select.jsonl", model, d, cfg, fresh_for_new_weights=True)
            stages[arm] = {"seconds": round(time.monotonic() - t, 1)}
            arms[arm] = d
    v, u = f"verify{k}", f"verify{k}-unapplied"
    figures = {**paired_figures("greedy", "base-verify0", "adapter-verify0"),
               **paired_figures(v, f"base-{v}", f"adapter-{v}"),
               **paired_figures(u, f"base-{u}", f"adapter-{u}"),
               **paired_figures("base", "base-verify0", f"base-{v}"),
               **paired_figures("adapter", "adapter-verify0", f"adapter-{v}"),
               **paired_figures("unapplied.base", f"base-{v}", f"base-{u}"),
               **paired_figures("unapplied.adapter", f"adapter-{v}", f"adapter-{u}")}
    meta = {"what": "select slice of an etude specialise run (train-side functions kept out of training): "
                    f"base and adapter, one greedy attempt vs up to {k} verified attempts per edit turn, "
                    "the latter without and with re-sampling an edit turn whose edits were all refused "
                    "(HarnessConfig.verify_unapplied)",
            "run": str(run), "models": models, "verify_edits": k, "verify_scope": h0.verify_scope,
            "attempts": {arm: attempt_outcomes(d) for arm, d in arms.items()}}
    write_result(Path(a.out), figures, eval_records(arms), provenance(started=t0, stages=stages), meta=meta)
    doc = json.loads(Path(a.out).read_text())
    print(json.dumps({n: {f: v.get(f) for f in ("a_k", "b_k", "n", "p")} for n, v in doc["figures"].items()
                      if v.get("kind") == "paired" and v.get("field") == "resolved"}, indent=1))


if __name__ == "__main__":
    main()
