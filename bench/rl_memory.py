"""Peak memory of the specialisation's GRPO stage with and without gradient checkpointing.

Runs `etude train --config configs/fix_rl.toml` (GRPO on the edit turn, LoRA continued from an
`etude specialise` run's SFT adapter, rollouts on vLLM, as the specialisation's stage 4 runs it)
for `--steps` steps twice, `gradient_checkpointing` false then true, each in a child process
whose whole process tree (learner, vLLM engine and worker, sandboxes) is sampled every 0.5 s for
its summed PSS (etude.pipeline.memory.PeakMemory).

    .venv-vllm/bin/python bench/rl_memory.py --run runs/demo_s38b/specialise --base runs/demo_s38b/sft/final

Writes bench/results/rl_memory.json and .records.jsonl through write_result.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from etude.evals.results import write_result
from etude.pipeline.memory import PeakMemory
from etude.provenance import provenance

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(run: Path, base: str, steps: int, checkpointing: bool, out: Path) -> dict:
    sets = {"model": base, "lora.enabled": "true", "lora.init": str(run / "sft" / "adapter"), "steps": str(steps),
            "lr": "5e-5", "eval_every": "0", "checkpoint_every": str(steps), "rollout_backend": "vllm",
            "use_ray": "false", "env.tasks_file": str(run / "tasks" / "rl_train.jsonl"),
            "env.eval_tasks_file": str(run / "tasks" / "select.jsonl"), "env.num_train": "100000",
            "env.num_test": "100000", "gradient_checkpointing": str(checkpointing).lower()}
    cmd = [sys.executable, "-m", "etude.cli", "train", "--config", "configs/fix_rl.toml", "--out", str(out)]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t = time.monotonic()
    with PeakMemory() as pm:
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"etude train failed ({r.returncode}): {r.stderr[-500:]}")
    return {"arm": "on" if checkpointing else "off", "peak_pss_gib": pm.peak_gib,
            "peak_rss_sum_gib": round(pm.peak_rss_sum_bytes / 2**30, 2), "wall_s": round(time.monotonic() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, help="a finished `etude specialise` run (tasks/, sft/adapter)")
    ap.add_argument("--base", required=True, help="the model the adapter sits on")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--work", default="runs/bench_rl_memory")
    ap.add_argument("--out", default=str(RESULTS / "rl_memory.json"))
    a = ap.parse_args()
    run = Path(a.run)
    if not (run / "sft" / "adapter").is_dir() or not (run / "tasks" / "rl_train.jsonl").is_file():
        raise SystemExit(f"--run {run}: not a finished `etude specialise` run (sft/adapter, tasks/rl_train.jsonl)")
    t0 = time.time()
    records = [one_run(run, a.base, a.steps, gc, Path(a.work) / ("on" if gc else "off")) for gc in (False, True)]
    on, off = {"arm": "on"}, {"arm": "off"}
    figures = {"peak_pss_gib.on_over_off": {"kind": "ratio", "num": on, "den": off, "field": "peak_pss_gib"},
               "peak_pss_gib.on_minus_off": {"kind": "difference", "a": off, "b": on, "field": "peak_pss_gib"},
               "wall_s.on_over_off": {"kind": "ratio", "num": on, "den": off, "field": "wall_s"}}
    meta = {"what": "configs/fix_rl.toml GRPO on the edit turn (LoRA, vLLM rollouts), gradient checkpointing off "
                    "vs on: peak summed PSS of the whole process tree", "run": str(run), "base": a.base,
            "steps": a.steps}
    write_result(Path(a.out), figures, records, provenance(started=t0), meta=meta)
    print(records)


if __name__ == "__main__":
    main()
