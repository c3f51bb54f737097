"""Should the specialised agent's evaluations verify its edits? Decided on the select slice of
a finished `etude specialise` run (train-side functions kept out of training for choices like
this one; never the held-out functions).

Evaluates the run's base and its adapter (RUN/merged) on RUN/tasks/select.jsonl with one greedy
attempt per edit turn and with `--verify-edits K` attempts (HarnessConfig.verify_edits: an edit
turn that leaves the request's failing test failing is undone and sampled again), in sandboxes,
as `etude specialise` evaluates. Four arms, paired by task.

    python bench/specialise_select.py --run runs/bench_specialise [--verify-edits 8]

Writes bench/results/specialise_select.json and .records.jsonl through write_result.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from etude.evals import EvalConfig, run_eval
from etude.evals.results import write_result
from etude.pipeline.compare import eval_records, paired_figures
from etude.policy import resolve_backend
from etude.provenance import provenance
from etude.train.sft import load_sft_config

RESULTS = Path(__file__).resolve().parent / "results"


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
    for k in (0, a.verify_edits):
        for name, model in models.items():
            arm = f"{name}-verify{k}"
            d = run / "select-eval" / arm
            t = time.monotonic()
            cfg = EvalConfig(workers=a.workers, harness=h0.replace(verify_edits=k), bootstrap=200,
                             backend=resolve_backend(a.backend))
            run_eval(run / "tasks" / "select.jsonl", model, d, cfg, fresh_for_new_weights=True)
            stages[arm] = {"seconds": round(time.monotonic() - t, 1)}
            arms[arm] = d
    k = a.verify_edits
    figures = {**paired_figures("greedy", "base-verify0", "adapter-verify0"),
               **paired_figures(f"verify{k}", f"base-verify{k}", f"adapter-verify{k}"),
               **paired_figures("base", "base-verify0", f"base-verify{k}"),
               **paired_figures("adapter", "adapter-verify0", f"adapter-verify{k}")}
    meta = {"what": "select slice of an etude specialise run (train-side functions kept out of training): "
                    f"base and adapter, one greedy attempt vs up to {k} verified attempts per edit turn",
            "run": str(run), "models": models, "verify_edits": k, "verify_scope": h0.verify_scope}
    write_result(Path(a.out), figures, eval_records(arms), provenance(started=t0, stages=stages), meta=meta)
    doc = json.loads(Path(a.out).read_text())
    print(json.dumps({n: {f: v.get(f) for f in ("a_k", "b_k", "n", "p")} for n, v in doc["figures"].items()
                      if v.get("kind") == "paired" and v.get("field") == "resolved"}, indent=1))


if __name__ == "__main__":
    main()
