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

`--suite general` evaluates on the run's general validation tasks (RUN/tasks/general.jsonl, the
validation split of the built-in curriculum, never the test split) instead: more tasks than the
select slice, from other packages. `--settings` and `--models` keep some arms only.

Writes bench/results/specialise_select.json (with --suite general: specialise_select_general.json)
and .records.jsonl through write_result.
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

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "suite": "str",
    "run": "str",
    "models": "dict",
    "verify_edits": "int",
    "verify_scope": "str",
    "attempts": "dict",
}

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
    ap.add_argument("--suite", choices=("select", "general"), default="select",
                    help="the run's select slice (tasks/select.jsonl) or its general validation tasks (tasks/general.jsonl)")
    ap.add_argument("--settings", default="verify0,verifyK,verifyK-unapplied",
                    help="comma-separated arms' settings: verify0 (one greedy attempt), verifyK, verifyK-unapplied")
    ap.add_argument("--models", default="base,adapter", help="comma-separated: base, adapter")
    ap.add_argument("--out", default=None, help="default: bench/results/specialise_select[_general].json")
    a = ap.parse_args()
    t0 = time.time()
    if a.verify_edits < 2:
        raise SystemExit("--verify-edits must be at least 2 (1 is the greedy arm already evaluated)")
    run = Path(a.run).resolve()
    suite = run / "tasks" / f"{a.suite}.jsonl"
    if not suite.is_file() or not (run / "merged").is_dir() or not (run / "report.json").is_file():
        raise SystemExit(f"--run {run}: not a finished `etude specialise` run (tasks/{a.suite}.jsonl, merged/, report.json)")
    out = Path(a.out) if a.out else RESULTS / ("specialise_select.json" if a.suite == "select"
                                               else "specialise_select_general.json")
    base = json.loads((run / "report.json").read_text())["base"]
    every = {"base": base, "adapter": str(run / "merged")}
    names = a.models.split(",")
    if len(set(names)) != len(names) or any(m not in every for m in names):
        raise SystemExit(f"--models {a.models!r}: name base and/or adapter")
    models = {m: every[m] for m in names}
    h0 = dataclasses.replace(load_sft_config(a.agent_config).harness_config(), temperature=0.0)
    arms: dict[str, Path] = {}
    stages: dict[str, dict[str, float]] = {}
    k = a.verify_edits
    every_setting = {"verify0": (0, False), "verifyK": (k, False), "verifyK-unapplied": (k, True)}
    wanted = a.settings.split(",")
    if any(w not in every_setting for w in wanted):
        raise SystemExit(f"--settings {a.settings!r}: name verify0, verifyK and/or verifyK-unapplied")
    settings = {w.replace("K", str(k)): every_setting[w] for w in wanted}
    for setting, (edits, unapplied) in settings.items():
        for name, model in models.items():
            arm = f"{name}-{setting}"
            d = run / f"{a.suite}-eval" / arm
            t = time.monotonic()
            h = h0.replace(verify_edits=edits, verify_unapplied=unapplied)
            cfg = EvalConfig(workers=a.workers, harness=h, bootstrap=200, backend=resolve_backend(a.backend))
            run_eval(suite, model, d, cfg, use="select", fresh_for_new_weights=True)
            stages[arm] = {"seconds": round(time.monotonic() - t, 1)}
            arms[arm] = d
    v, u = f"verify{k}", f"verify{k}-unapplied"
    pairs = [("greedy", "base-verify0", "adapter-verify0"), (v, f"base-{v}", f"adapter-{v}"),
             (u, f"base-{u}", f"adapter-{u}"), ("base", "base-verify0", f"base-{v}"),
             ("adapter", "adapter-verify0", f"adapter-{v}"), ("unapplied.base", f"base-{v}", f"base-{u}"),
             ("unapplied.adapter", f"adapter-{v}", f"adapter-{u}")]
    figures = {k_: f for name, x, y in pairs if x in arms and y in arms for k_, f in paired_figures(name, x, y).items()}
    what = ("select slice of an etude specialise run (train-side functions kept out of training)" if a.suite == "select"
            else "general validation tasks of an etude specialise run (the built-in curriculum's validation split)")
    meta = {"what": f"{what}: {', '.join(models)}, one greedy attempt vs up to {k} verified attempts per edit turn, "
                    "the latter without and with re-sampling an edit turn whose edits were all refused "
                    "(HarnessConfig.verify_unapplied)",
            "suite": str(suite), "run": str(run), "models": models, "verify_edits": k, "verify_scope": h0.verify_scope,
            "attempts": {arm: attempt_outcomes(d) for arm, d in arms.items()}}
    write_result(out, figures, eval_records(arms), provenance(started=t0, stages=stages), meta=meta)
    doc = json.loads(out.read_text())
    print(json.dumps({n: {f: v.get(f) for f in ("a_k", "b_k", "n", "p")} for n, v in doc["figures"].items()
                      if v.get("kind") == "paired" and v.get("field") == "resolved"}, indent=1))


if __name__ == "__main__":
    main()
