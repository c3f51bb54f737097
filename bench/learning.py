"""Does the trainer learn? SmolLM2-135M-Instruct with GRPO on a single-turn family on CPU.

Family: `arith` (single-turn: "What is a + b? Reply with only the number.", a, b in [10, 99];
reward = 1 if the last integer of the answer is right, + 0.1 if the answer is only a number).
Held-out problems are disjoint from training ones and evaluated greedily before, during and
after training.

Writes bench/results/learning.json: per-step training reward (mean and 95% CI over the step's
samples), held-out success at each evaluation (Wilson 95% CI), the change from first to last
evaluation on the same problems (exact McNemar test on discordant pairs), the first-vs-last
quarter reward difference (Welch 95% CI), and the wall time.

    python bench/learning.py [--steps 16] [--prompts 6] [--group 4] [--eval-every 4] [--lr 1e-5]
    python bench/learning.py --summarise-only --run-dir DIR --steps N   # a run stopped early
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import torch
import transformers

from etude.evals.stats import discordant, mcnemar_exact, wilson_ci
from etude.train import load_config, train
from etude.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]


def reward_curve(recs: list[dict]) -> list[dict]:
    out = []
    for r in recs:
        half = 1.96 * r["reward_std"] / math.sqrt(max(1, r["samples"]))
        out.append({"step": r["step"], "reward": r["reward"], "ci95": [r["reward"] - half, r["reward"] + half],
                    "resolved": r["resolved"], "format": r.get("reward/format"), "step_s": r["step_s"]})
    return out


def eval_curve(evals: list[dict]) -> list[dict]:
    return [{"step": e["step"], "success": e["eval/resolved"], "n": e["eval/n"],
             "ci95": list(wilson_ci(e["eval/successes"], e["eval/n"]))} for e in evals]


def mcnemar(first: list[int], last: list[int]) -> dict:
    """Held-out problems gained and lost from the first evaluation to the last (0/1 outcomes),
    with the exact McNemar p (etude.evals.stats)."""
    lost, gained = discordant(first, last)
    return {"gained": gained, "lost": lost, "p_value_two_sided": mcnemar_exact(first, last)}


def quarter_diff(recs: list[dict]) -> dict:
    """Mean reward of the last quarter of steps minus the first; the 95% CI treats the samples
    within each step as independent (per-step std / sqrt(samples))."""
    q = max(1, len(recs) // 4)
    a, b = recs[:q], recs[-q:]

    def mean_se(rs: list[dict]) -> tuple[float, float]:
        m = sum(r["reward"] for r in rs) / len(rs)
        se = math.sqrt(sum(r["reward_std"] ** 2 / max(1, r["samples"]) for r in rs)) / len(rs)
        return m, se

    (ma, sa), (mb, sb) = mean_se(a), mean_se(b)
    diff, se = mb - ma, math.sqrt(sa * sa + sb * sb)
    return {"first_quarter_mean": ma, "last_quarter_mean": mb, "diff": diff,
            "ci95": [diff - 1.96 * se, diff + 1.96 * se], "steps_per_quarter": q}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-problems", type=int, default=48)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/etude-bench-learning"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "learning.json")
    ap.add_argument("--summarise-only", action="store_true", help="Only summarise an existing --run-dir.")
    a = ap.parse_args()
    overrides = {"steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group, "eval_every": a.eval_every,
                 "eval_problems": a.eval_problems, "lr": a.lr, "max_new_tokens": a.max_new_tokens,
                 "checkpoint_every": a.steps, "warmup_steps": 1}
    cfg = load_config(ROOT / "configs" / "smollm.toml", overrides)
    if not a.summarise_only:
        train(cfg, a.run_dir, resume=False)
    res = summarise(a.run_dir, a.steps)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("base_success", "final_success", "completed_steps", "wall_s",
                                         "heldout_change_first_to_last", "reward_first_vs_last_quarter")}, indent=1))


def summarise(run_dir: Path, planned_steps: int) -> dict:
    """Curves and tests from a run directory (also one that was stopped before the end)."""
    cfg = json.loads((run_dir / "config.json").read_text())
    recs = read_metrics(run_dir)
    tr = [r for r in recs if r["kind"] == "train"]
    ev = [r for r in recs if r["kind"] == "eval"]
    first, last = ev[0], ev[-1]
    started = (run_dir / "config.json").stat().st_mtime
    return {
        "bench": "learning", "family": "arith (single-turn, exact integer answer)", "model": cfg["model"],
        "machine": platform.platform(), "cpu_threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "config": cfg, "planned_steps": planned_steps,
        "completed_steps": len(tr), "stopped_early": len(tr) < planned_steps,
        "wall_s": max(r["time"] for r in tr) - started if tr else None,
        "base_success": first["eval/resolved"], "base_in_5_to_60_pct": 0.05 <= first["eval/resolved"] <= 0.60,
        "final_success": last["eval/resolved"], "final_eval_step": last["step"], "reward_curve": reward_curve(tr),
        "heldout_curve": eval_curve(ev), "heldout_change_first_to_last": mcnemar(first["eval/outcomes"], last["eval/outcomes"]),
        "reward_first_vs_last_quarter": quarter_diff(tr),
    }


if __name__ == "__main__":
    main()
