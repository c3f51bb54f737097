"""Our GRPO trainer vs TRL's GRPOTrainer, in one run, on the same model, prompts, reward,
group size, completion length, learning rate and number of steps (CPU, fp32, no gradient
checkpointing for either; token-level loss normalisation "dapo" ≙ our "token_mean";
group-std reward scaling for both; clip ε = 0.2 / 0.28 for both; no KL).

Each trainer runs in its own subprocess (so peak RSS is its own), one after the other.
Measured per full step (generate + score + update): samples/s and completion tokens/s (median
over steps, first step excluded as warm-up), peak RSS, and the training reward at the end
(mean of the last steps). Writes bench/results/trainer_vs_trl.json.

    python bench/trainer_vs_trl.py [--model smollm2] [--steps 6] [--prompts 4] [--group 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _arith(num_train: int):
    from etude.train.envs import ArithEnv

    return ArithEnv(num_train=num_train, num_test=8, seed=0)


def run_etude(a: argparse.Namespace) -> dict:
    from etude.train import TrainConfig, train
    from etude.train.metrics import read_metrics

    cfg = TrainConfig.from_dict({
        "model": a.model, "steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group,
        "max_new_tokens": a.max_new_tokens, "temperature": 1.0, "lr": a.lr, "micro_batch_tokens": 4096,
        "advantage": "grpo", "aggregation": "token_mean", "precision": "fp32", "checkpoint_every": a.steps,
        "eval_problems": 1, "env": {"name": "arith", "num_train": a.num_train, "num_test": 8},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0},
    })
    out = Path(tempfile.mkdtemp(prefix="etude-vs-trl-"))
    train(cfg, out, resume=False, progress=False)
    recs = [r for r in read_metrics(out) if r["kind"] == "train"]
    return {"step_s": [r["step_s"] for r in recs], "completion_tokens": [r["gen_tokens"] for r in recs],
            "reward": [r["reward"] for r in recs], "samples_per_step": a.prompts * a.group}


def run_trl(a: argparse.Namespace) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from etude.policy.models import resolve

    env = _arith(a.num_train)
    probs = env.problems("train")
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p.messages[0].content}], "answer": p.answer}
                            for p in probs])
    by_answer = {p.messages[0].content: p for p in probs}

    def reward(prompts, completions, **kw):  # the same check as ours
        return [env.check(by_answer[p[-1]["content"]], c[0]["content"])[0] for p, c in zip(prompts, completions, strict=True)]

    times: list[float] = []
    records: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                records.append(dict(logs))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), max_steps=a.steps, per_device_train_batch_size=a.prompts * a.group,
        num_generations=a.group, max_completion_length=a.max_new_tokens, learning_rate=a.lr, temperature=1.0,
        top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        gradient_accumulation_steps=1, gradient_checkpointing=False, bf16=False, use_cpu=True, logging_steps=1,
        report_to="none", save_strategy="no", seed=0, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(resolve(a.model)), reward_funcs=[reward], args=args, train_dataset=ds,
                          callbacks=[Timer()])
    trainer.train()
    lens = [lg.get("completions/mean_length", 0.0) * a.prompts * a.group for lg in records]
    return {"step_s": times, "completion_tokens": lens, "reward": [lg["reward"] for lg in records],
            "samples_per_step": a.prompts * a.group}


def summarise(raw: dict, last_k: int) -> dict:
    steps = list(zip(raw["step_s"], raw["completion_tokens"], strict=False))[1:] or list(
        zip(raw["step_s"], raw["completion_tokens"], strict=False))
    sps = [raw["samples_per_step"] / s for s, _ in steps]
    tps = [t / s for s, t in steps]
    rew = raw["reward"]
    return {"median_step_s": statistics.median(s for s, _ in steps), "samples_per_s": statistics.median(sps),
            "completion_tokens_per_s": statistics.median(tps), "reward_first": rew[0] if rew else None,
            f"reward_last{last_k}_mean": statistics.mean(rew[-last_k:]) if rew else None,
            "peak_rss_mb": raw["peak_rss_mb"], "steps": len(raw["step_s"]), "raw": raw}


def child(a: argparse.Namespace) -> None:
    raw = run_etude(a) if a.worker == "etude" else run_trl(a)
    raw["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(a.json).write_text(json.dumps(raw))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--num-train", type=int, default=256)
    ap.add_argument("--worker", choices=["etude", "trl"])
    ap.add_argument("--json")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "trainer_vs_trl.json")
    a = ap.parse_args()
    if a.worker:
        return child(a)
    import torch
    import transformers
    import trl

    res: dict = {"bench": "trainer_vs_trl", "machine": platform.platform(), "torch": torch.__version__,
                 "transformers": transformers.__version__, "trl_version": trl.__version__,
                 "settings": {k: getattr(a, k) for k in ("model", "steps", "prompts", "group", "max_new_tokens", "lr")},
                 "note": "CPU only, shared 2-core machine; medians over steps 2..N; same arith prompts and reward"}
    for name in ("etude", "trl"):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        argv = [sys.executable, __file__, "--worker", name, "--json", path] + [
            x for k in ("model", "steps", "prompts", "group", "max_new_tokens", "lr", "num_train")
            for x in (f"--{k.replace('_', '-')}", str(getattr(a, k)))]
        t0 = time.time()
        subprocess.run(argv, check=True)
        res[name] = summarise(json.loads(Path(path).read_text()), last_k=min(3, a.steps))
        res[name]["wall_s"] = time.time() - t0
    e, t = res["etude"], res["trl"]
    res["throughput_ratio_samples_per_s"] = e["samples_per_s"] / t["samples_per_s"]
    res["throughput_ratio_tokens_per_s"] = e["completion_tokens_per_s"] / max(t["completion_tokens_per_s"], 1e-9)
    res["peak_rss_ratio"] = e["peak_rss_mb"] / t["peak_rss_mb"]
    res["target_1_5x_met"] = res["throughput_ratio_samples_per_s"] >= 1.5
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k not in ("etude", "trl")}, indent=1))
    for n in ("etude", "trl"):
        print(n, {k: v for k, v in res[n].items() if k != "raw"})


if __name__ == "__main__":
    main()
