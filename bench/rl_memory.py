"""Peak memory of the specialisation's GRPO stage with and without gradient checkpointing.

Runs the specialisation's stage 4 (GRPO on the edit turn, configs/fix_rl.toml, LoRA continued
from an `etude specialise` run's SFT adapter, rollouts on vLLM; the TrainConfig is
etude.pipeline.specialise.rl_stage_config's, without the select-slice evaluations) for `--steps`
steps twice, `gradient_checkpointing` false then true, each in a spawned child as the stage runs
it. The whole process tree (this process, the learner, its vLLM engine and worker, sandboxes) is
sampled every 0.5 s for its summed PSS (etude.pipeline.memory.PeakMemory). The recorded result
(2026-12-05) predates this shared builder: it ran `etude train --set ...` in a subprocess with the
same settings, from a process that had not imported torch.

    .venv-vllm/bin/python bench/rl_memory.py --run runs/demo_s38b/specialise --base runs/demo_s38b/sft/final

Writes bench/results/rl_memory.json and .records.jsonl through write_result.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from etude.evals.results import write_result
from etude.pipeline.memory import PeakMemory
from etude.provenance import provenance

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "what": "str",
    "run": "str",
    "base": "str",
    "steps": "int",
}

RESULTS = Path(__file__).resolve().parent / "results"


def one_run(run: Path, base: str, steps: int, checkpointing: bool, out: Path) -> dict:
    from etude.pipeline.isolate import in_child
    from etude.pipeline.specialise import SpecialiseConfig, rl_stage_config
    from etude.train import train

    # the stage's own configuration (etude.pipeline.specialise.rl_stage_config), without its
    # select-slice evaluations; the learner runs in a spawned child as the stage runs it
    cfg = rl_stage_config(SpecialiseConfig.rl_config, run, base, str(run / "sft" / "adapter"), "vllm",
                          lr=SpecialiseConfig.rl_lr, steps=steps, seed=0, every=0,
                          gradient_checkpointing=checkpointing)
    t = time.monotonic()
    with PeakMemory() as pm:
        in_child(train, cfg, out)
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
    if not (run / "sft" / "adapter").is_dir() or not (run / "tasks" / "train.jsonl").is_file():
        raise SystemExit(f"--run {run}: not an `etude specialise` run past its SFT stage (sft/adapter, tasks/train.jsonl)")
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
