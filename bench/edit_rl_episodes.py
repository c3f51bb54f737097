"""Does the longer edit-turn RL of bench/edit_rl.py resolve more held-out tasks in whole episodes?

bench/edit_rl.py measures one skill, the edit turn with the buggy function on screen, many samples
a task. Issue 30 measures whole episodes: the agent finds the function, reads it and edits it in a
sandbox, and the task's tests grade the result. This bench takes the arms of a finished
bench/edit_rl.py work folder and evaluates each on the held-out tasks of its `etude specialise`
run exactly as `etude specialise` evaluates its adapter (etude.pipeline.specialise.Specialise.evaluate:
the agent's harness from configs/agent_sft.toml, greedy, `--verify-edits` attempts per edit turn,
16 episodes in flight on vLLM):

- `base`: the run's base model (its report.json), the general warm start;
- `start`: the SFT adapter the RL started from, merged into the base (WORK/merged-start);
- `rl`: the RL run's last checkpoint, merged into the base (WORK/merged-rl). Nothing is chosen:
  the arm is fixed before any held-out episode runs, and held-out results are only reported.

Figures, paired by task (exact McNemar): rl vs base (issue 30's comparison: the adapter against
the model it specialises), rl vs start (what the RL steps added) and start vs base; each arm's
resolved, tool-use and edited rates (an episode that changed the repository).

    .venv-vllm/bin/python bench/edit_rl_episodes.py --run runs/s41_bench --work runs/s42_edit_rl \\
        --out bench/results/edit_rl_episodes.json

`--suite select` evaluates on the run's select slice instead (train-side functions kept out of
training), the place for any choice.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ARMS = ("base", "start", "rl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="the `etude specialise` run bench/edit_rl.py started from")
    ap.add_argument("--work", required=True, help="bench/edit_rl.py's --work folder, its RL run finished")
    ap.add_argument("--suite", choices=("heldout", "select"), default="heldout")
    ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    ap.add_argument("--verify-edits", type=int, default=8, help="as `etude specialise` evaluates (0: one greedy attempt)")
    ap.add_argument("--agent-config", default="configs/agent_sft.toml")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--out", default=str(RESULTS / "edit_rl_episodes.json"))
    a = ap.parse_args()

    run, work = Path(a.run).resolve(), Path(a.work).resolve()
    names = a.arms.split(",")
    if len(set(names)) != len(names) or any(n not in ARMS for n in names) or len(names) < 2:
        raise SystemExit(f"--arms {a.arms!r}: name two or more of {', '.join(ARMS)}")
    suite = run / "tasks" / f"{a.suite}.jsonl"
    if not suite.is_file() or not (run / "report.json").is_file():
        raise SystemExit(f"--run {run}: not a finished `etude specialise` run (no tasks/{a.suite}.jsonl or report.json)")
    summary = work / "rl" / "summary.json"
    if "rl" in names and not summary.is_file():
        raise SystemExit(f"--work {work}: no finished RL run (rl/summary.json); run bench/edit_rl.py first")
    if a.verify_edits < 0:
        raise SystemExit("--verify-edits must be 0 or more")

    # heavy imports after the argument checks: a bad flag answers at once
    from etude.evals.results import write_result
    from etude.pipeline.compare import eval_records, paired_figures
    from etude.pipeline.learning import EvalSetup, eval_harness, evaluate
    from etude.policy import resolve_backend
    from etude.provenance import provenance
    from etude.train.lora import merge_adapter_dir

    t0 = time.time()
    base = json.loads((run / "report.json").read_text())["base"]
    rl = json.loads(summary.read_text()) if summary.is_file() else {}
    adapters = {"start": str(run / "sft" / "adapter"), "rl": rl.get("checkpoint")}
    models: dict[str, str] = {}
    for n in names:
        models[n] = base if n == "base" else str(merge_adapter_dir(adapters[n], base, work / f"merged-{n}"))
    h = eval_harness(a.agent_config).replace(verify_edits=a.verify_edits)
    setup = EvalSetup(h, a.workers, resolve_backend(a.backend), bootstrap=200, fresh_for_new_weights=True)
    dirs: dict[str, Path] = {}
    stages: dict[str, dict[str, float]] = {}
    for n, model in models.items():
        t = time.monotonic()
        dirs[n] = work / f"episodes-{a.suite}" / n
        _, line = evaluate(suite, model, dirs[n], setup)
        stages[n] = {"seconds": round(time.monotonic() - t, 1)}
        print(f"{n}: {line}", flush=True)

    figures: dict[str, dict] = {}
    for x, y in (("base", "rl"), ("start", "rl"), ("base", "start")):
        if x in dirs and y in dirs:
            figures |= paired_figures(a.suite, x, y)
    for n in dirs:
        for f in ("tool_use", "edited"):
            figures[f"{a.suite}.{n}.{f}"] = {"kind": "rate", "of": {"arm": n}, "field": f}
    meta = {"what": f"whole episodes on the {a.suite} tasks of an etude specialise run, as it evaluates its adapter: "
                    "the base, the SFT adapter and the adapter after bench/edit_rl.py's GRPO on the edit turn",
            "run": str(run), "work": str(work), "suite": str(suite), "models": models,
            "rl": {k: rl.get(k) for k in ("steps", "checkpoint", "seconds", "weights", "select_right_fix")},
            "verify_edits": a.verify_edits, "harness": a.agent_config,
            "rule": "the rl arm is the RL run's last checkpoint, fixed before any held-out episode; nothing is chosen "
                    "on these results"}
    doc = write_result(Path(a.out), figures, eval_records(dirs), provenance(started=t0, stages=stages), meta=meta)
    for name, fig in doc["figures"].items():
        print(name, {k: fig.get(k) for k in ("k", "n", "rate", "a_k", "b_k", "p") if k in fig})


if __name__ == "__main__":
    main()
