"""Our GRPO trainer vs TRL's GRPOTrainer, in one run, on the same model, prompts, reward,
group size, completion length, learning rate and number of steps (CPU, fp32, no gradient
checkpointing for either; token-level loss normalisation "dapo" ≙ our "token_mean";
group-std reward scaling for both; clip ε = 0.2 / 0.28 for both; no KL).

Each trainer runs in its own subprocess (so peak RSS is its own), one after the other.
Measured per full step (generate + score + update): samples/s and completion tokens/s (median
over steps, first step excluded as warm-up), peak RSS, and the training reward per step.

"The reward after N steps" is measured the same way for both: the trained weights (and the base
model, once) are scored by one evaluator — etude's LocalPolicy sampling `--eval-samples` answers
at temperature 1 for each of the `--eval-problems` held-out problems, fixed seed — so the two
figures differ only by what the training did. The training-reward curves are reported too, but
the two trainers draw their prompts in different orders, so those are not paired. RL runs this
short vary a lot from seed to seed, so both trainers run every seed of `--seeds`.

Is etude's reward as good as TRL's? A non-inferiority test, not "no significant difference" (which
a handful of answers always gives): per held-out problem, each trainer's mean reward over seeds and
samples; H0: mean(etude − TRL) ≤ −`--margin` (reward units), one-sided paired t at `--alpha`
(`etude.evals.stats.paired_noninferiority`). The output states the margin, n (problems), the
power this n had to show non-inferiority if the two were equal (observed sd of the differences
as the planning value) and the n that 80% power needs. Few problems → low power → "not shown",
never "equal". The test is conditional on these training runs (per-seed means are in `meta`).

Written through `etude.evals.results.write_result`: `<out>.json` (figures, provenance, meta) and
`<out>.records.jsonl` (every held-out answer, every step's speed, every run's peak RSS), which
`bench/verify.py` recomputes the figures from. Throughput ratios are medians over all steps of all
seeds (the first step of each run excluded as warm-up) of etude over TRL.

Two settings (`--setting`):
- `short` (bench/results/trainer_vs_trl.json): "What is a + b?" prompts, 12-token answers;
  prefix sharing dominates there.
- `realistic` (bench/results/trainer_vs_trl_realistic.json): the agent's own multi-turn prompts,
  ~1k tokens — the harness's system prompt, a repository task's request, and the scripted
  expert's first turns with what the real tools returned (grep, read), rendered by the one
  renderer of serving and SFT — cut before the expert's edit; 128 new tokens. Training prompts
  come from curriculum train-split tasks, held-out ones from validation-split packages. Reward
  (the same function for both trainers): 1 for a reply whose tool calls all parse and name a
  harness tool, +0.5 when one of them is `edit_file` (the step that comes next), 0.1 for a
  `<tool_call>` that does not parse, 0 for prose.

    python bench/trainer_vs_trl.py [--setting short|realistic] [--model smollm2] [--steps 20] [--prompts 4]
                                   [--group 4] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from etude.envs.families import SingleTurnEnv
from etude.evals.results import compute_figure, compute_figures, write_result
from etude.provenance import provenance
from etude.types import Message, Problem

ROOT = Path(__file__).resolve().parents[1]
EVAL_SEED = 12345


def _arith(num_train: int):
    from etude.envs.families import ArithEnv

    return ArithEnv(num_train=num_train, num_test=8, seed=0)


PROMPTS_ENV = "harness_prompts"  # registered in the child processes (etude.envs.families.ENVS)


class HarnessPromptEnv(SingleTurnEnv):
    """Single-turn env over stored agent prompts (the realistic setting): problems from a JSONL
    of {"id", "split", "messages"}; `check` scores one reply's tool calls."""

    name = PROMPTS_ENV

    def __init__(self, tasks_file: str | None = None, num_train: int = 0, num_test: int = 0, **_: object):
        rows = [json.loads(ln) for ln in Path(str(tasks_file)).read_text().splitlines() if ln.strip()]
        self.by_split = {sp: [Problem(r["id"], PROMPTS_ENV, tuple(Message.from_dict(m) for m in r["messages"]), None)
                              for r in rows if r["split"] == sp] for sp in ("train", "test")}
        for sp, n in (("train", num_train), ("test", num_test)):
            if n:
                self.by_split[sp] = self.by_split[sp][:n]

    def problems(self, split: str) -> list[Problem]:
        return list(self.by_split[split])

    def check(self, problem: Problem, text: str) -> tuple[float, dict, bool]:
        return prompt_reward(text)


def prompt_reward(text: str) -> tuple[float, dict, bool]:
    from etude.harness.config import DEFAULT_TOOLS
    from etude.toolcalls import OPEN_TAG, parse_hermes

    res = parse_hermes(text, tools=set(DEFAULT_TOOLS) | {"submit"})
    valid = bool(res.tool_calls) and not res.errors
    edit = valid and any(c.name == "edit_file" for c in res.tool_calls)
    broken = not valid and OPEN_TAG in text
    return 1.0 * valid + 0.5 * edit + 0.1 * broken, {"valid": float(valid), "edit": float(edit)}, edit


def build_prompts(path: Path, model: str, num_train: int, num_test: int) -> dict:
    """Agent prompts from the expert's trajectories (see the module doc): train-split tasks for
    training, validation-split tasks (other packages) held out. Returns token-length figures."""
    from etude.policy.local import encode_conversation
    from etude.policy.models import load_model
    from etude.toolcalls import parse_hermes
    from etude.train.sft import expert_trajectories, load_sft_config, load_task_source

    cfg = load_sft_config(ROOT / "configs" / "agent_sft.toml")
    tok = load_model(model)[1]
    rows, lens = [], []
    cache = path.parent / "expert"
    cache.mkdir(parents=True, exist_ok=True)
    for split, source, n in (("train", "builtin:train", num_train), ("test", "builtin:validation", num_test)):
        tasks = load_task_source(source, 1, max_tasks=2 * n, use="train")
        trajs = expert_trajectories(tasks, cfg.harness_config(), cache / f"{split}.jsonl", workers=2)
        for tr in trajs:
            msgs = list(tr.messages)
            cut = next((i for i, m in enumerate(msgs) if m.role == "assistant"
                        and any(c.name == "edit_file" for c in parse_hermes(m.content).tool_calls)), None)
            if cut is None or sum(r["split"] == split for r in rows) >= n:
                continue
            rows.append({"id": f"{split}-{tr.task_id}", "split": split, "messages": [m.to_dict() for m in msgs[:cut]]})
            lens.append(len(encode_conversation(tok, msgs[:cut])))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counts = {sp: sum(r["split"] == sp for r in rows) for sp in ("train", "test")}
    if min(counts.values()) == 0:
        raise SystemExit(f"no prompts built for a split: {counts}")
    return {"prompts": counts, "prompt_tokens_median": statistics.median(lens), "prompt_tokens_min": min(lens),
            "prompt_tokens_max": max(lens)}


def _env(a: argparse.Namespace):
    if a.setting == "realistic":
        return HarnessPromptEnv(a.prompts_file)
    return _arith(a.num_train)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def held_out(model: object, tokenizer: object, a: argparse.Namespace) -> list[dict]:
    """Per-answer {"problem", "sample", "reward"} of `model` on the held-out problems (the same
    evaluator for both)."""
    import torch

    from etude.policy.local import LocalPolicy

    env = _env(a)
    if a.setting == "realistic":
        probs = env.problems("test")[: a.eval_problems]
    else:
        env.num["test"] = a.eval_problems
        probs = env.problems("test")
    pol = LocalPolicy(model, tokenizer, id="eval")
    model.eval()
    with torch.inference_mode():
        eps = env.rollout(pol, probs, n=a.eval_samples, max_tokens=a.max_new_tokens, temperature=1.0, seed=EVAL_SEED)
    seen: Counter[str] = Counter()
    out = []
    for e in eps:
        out.append({"problem": e.problem_id, "sample": seen[e.problem_id], "reward": float(e.reward)})
        seen[e.problem_id] += 1
    return out


def run_etude(a: argparse.Namespace) -> dict:
    from etude.envs.families import ENVS
    from etude.train import TrainConfig, train
    from etude.train.metrics import read_metrics

    ENVS[PROMPTS_ENV] = HarnessPromptEnv  # type: ignore[assignment]  # the bench's own family

    cfg = TrainConfig.from_dict({
        "model": a.model, "steps": a.steps, "prompts_per_step": a.prompts, "group_size": a.group,
        "max_new_tokens": a.max_new_tokens, "temperature": 1.0, "lr": a.lr, "micro_batch_tokens": 4096,
        "advantage": "grpo", "aggregation": "token_mean", "precision": "fp32", "checkpoint_every": a.steps,
        "eval_problems": 1, "seed": int(a.seeds),
        "env": ({"name": PROMPTS_ENV, "tasks_file": a.prompts_file, "num_test": 1} if a.setting == "realistic"
                else {"name": "arith", "num_train": a.num_train, "num_test": 8}),
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "kl_coef": 0.0},
    })
    out = Path(tempfile.mkdtemp(prefix="etude-vs-trl-"))
    summary = train(cfg, out, resume=False, progress=False)
    recs = [r for r in read_metrics(out) if r["kind"] == "train"]
    peak = _peak_mb()  # of training, before the evaluation loads more models
    from etude.policy.models import load_model

    trained, tok = load_model(str(summary["checkpoint"]))
    out = {"step_s": [r["step_s"] for r in recs], "completion_tokens": [r["gen_tokens"] for r in recs],
           "reward": [r["reward"] for r in recs], "samples_per_step": a.prompts * a.group,
           "held_out": held_out(trained, tok, a), "peak_rss_mb": peak}
    if a.eval_base:
        out["held_out_base"] = held_out(load_model(a.model)[0], tok, a)
    return out


def run_trl(a: argparse.Namespace) -> dict:
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from etude.policy.local import render_messages
    from etude.policy.models import resolve

    env = _env(a)
    probs = env.problems("train")
    # the same conversations, through the same renderer (TRL applies the same chat template to them)
    ds = Dataset.from_list([{"prompt": render_messages(p.messages), "pid": p.id} for p in probs])
    by_id = {p.id: p for p in probs}

    def reward(prompts, completions, pid, **kw):  # the same check as ours
        return [env.check(by_id[i], c[0]["content"])[0] for i, c in zip(pid, completions, strict=True)]

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

    # One generation batch (prompts x group samples) per optimiser step, trained in micro-batches
    # of --trl-micro-batch samples by gradient accumulation (ours packs rows of micro_batch_tokens).
    per_step = a.prompts * a.group
    micro = a.trl_micro_batch or per_step
    if per_step % micro:
        raise SystemExit(f"--trl-micro-batch {micro} does not divide {per_step} samples a step")
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), max_steps=a.steps, per_device_train_batch_size=micro,
        num_generations=a.group, max_completion_length=a.max_new_tokens, learning_rate=a.lr, temperature=1.0,
        top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        gradient_accumulation_steps=per_step // micro, gradient_checkpointing=a.trl_gradient_checkpointing, bf16=False, use_cpu=True, logging_steps=1,
        report_to="none", save_strategy="no", seed=int(a.seeds), lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=str(resolve(a.model)), reward_funcs=[reward], args=args, train_dataset=ds,
                          callbacks=[Timer()])
    trainer.train()
    if len(times) != a.steps:  # the timer must see optimiser steps, not accumulation micro-steps
        raise SystemExit(f"TRL's step timer saw {len(times)} steps for {a.steps} optimiser steps")
    peak = _peak_mb()
    lens = [lg.get("completions/mean_length", 0.0) * a.prompts * a.group for lg in records]
    return {"step_s": times, "completion_tokens": lens, "reward": [lg["reward"] for lg in records],
            "samples_per_step": a.prompts * a.group, "held_out": held_out(trainer.model, trainer.processing_class, a),
            "peak_rss_mb": peak}


def held_out_figure(margin: float, alpha: float) -> dict:
    """The reward check as a figure spec: etude (b) non-inferior to TRL (a) by `margin`, per problem."""
    return {"kind": "noninferiority", "a": {"kind": "held_out", "trainer": "trl"},
            "b": {"kind": "held_out", "trainer": "etude"}, "key": "problem", "field": "reward",
            "margin": margin, "alpha": alpha}


def reward_decision(records: list[dict], margin: float, alpha: float = 0.05) -> dict:
    """Is etude's held-out reward no worse than TRL's by more than `margin`? From the held-out
    answer records ({"kind": "held_out", "trainer", "problem", "reward"}): n, margin, p, the lower
    bound, power at the margin, and `noninferior` (False when not shown, e.g. too few problems)."""
    return compute_figure(held_out_figure(margin, alpha), records, "etude_noninferior_to_trl")


def result_records(runs: list[dict]) -> list[dict]:
    """The records the figures summarise: every held-out answer (base: the first seed's etude
    worker scores the untrained model), every step's speed, every run's peak RSS."""
    recs: list[dict] = []
    for run in runs:
        seed = run["seed"]
        for name in ("etude", "trl"):
            raw = run[name]["raw"]
            recs += [{"kind": "held_out", "trainer": name, "seed": seed, **r} for r in raw["held_out"]]
            recs += [{"kind": "held_out", "trainer": "base", "seed": seed, **r} for r in raw.get("held_out_base") or []]
            steps = list(zip(raw["step_s"], raw["completion_tokens"], strict=False))
            recs += [{"kind": "step", "trainer": name, "seed": seed, "step": i, "step_s": s, "completion_tokens": t,
                      "samples_per_s": raw["samples_per_step"] / s, "tokens_per_s": t / s,
                      "warmup": i == 0 and len(steps) > 1} for i, (s, t) in enumerate(steps)]
            recs.append({"kind": "run", "trainer": name, "seed": seed, "peak_rss_mb": raw["peak_rss_mb"]})
    return recs


def result_figures(margin: float, alpha: float, *, base: bool) -> dict:
    """The headline figures (specs; `write_result` computes them from `result_records`)."""
    def steps(trainer: str) -> dict:
        return {"kind": "step", "trainer": trainer, "warmup": False}

    figs: dict = {f"held_out_{t}": {"kind": "mean", "of": {"kind": "held_out", "trainer": t}, "field": "reward"}
                  for t in ("etude", "trl") + (("base",) if base else ())}
    figs["etude_noninferior_to_trl"] = held_out_figure(margin, alpha)
    for field in ("samples_per_s", "tokens_per_s"):
        figs[f"throughput_ratio_{field}"] = {"kind": "ratio", "num": steps("etude"), "den": steps("trl"),
                                             "field": field, "stat": "median"}
    figs["peak_rss_ratio"] = {"kind": "ratio", "num": {"kind": "run", "trainer": "etude"},
                              "den": {"kind": "run", "trainer": "trl"}, "field": "peak_rss_mb", "stat": "median"}
    return figs


def summarise(raw: dict, last_k: int) -> dict:
    steps = list(zip(raw["step_s"], raw["completion_tokens"], strict=False))[1:] or list(
        zip(raw["step_s"], raw["completion_tokens"], strict=False))
    sps = [raw["samples_per_step"] / s for s, _ in steps]
    tps = [t / s for s, t in steps]
    rew = raw["reward"]
    return {"median_step_s": statistics.median(s for s, _ in steps), "samples_per_s": statistics.median(sps),
            "completion_tokens_per_s": statistics.median(tps), "reward_first": rew[0] if rew else None,
            f"reward_last{last_k}_mean": statistics.mean(rew[-last_k:]) if rew else None,
            "train_reward_mean": statistics.mean(rew) if rew else None,
            "held_out_reward": statistics.mean(r["reward"] for r in raw["held_out"]), "held_out_n": len(raw["held_out"]),
            "peak_rss_mb": raw["peak_rss_mb"], "steps": len(raw["step_s"]), "raw": raw}


def child(a: argparse.Namespace) -> None:
    raw = run_etude(a) if a.worker == "etude" else run_trl(a)
    Path(a.json).write_text(json.dumps(raw))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--setting", choices=["short", "realistic"], default="short")
    ap.add_argument("--prompts-file", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--num-train", type=int, default=256)
    ap.add_argument("--eval-problems", type=int, default=64)
    ap.add_argument("--eval-samples", type=int, default=4)
    ap.add_argument("--trl-micro-batch", type=int, default=0,
                    help="TRL's per-device batch (samples per forward/backward; 0 = all of a step's samples): its "
                         "gradient accumulation covers the rest of the step, one generation batch per optimiser step. "
                         "The realistic setting needs a small one to fit memory (16 x 2k-token samples in one batch "
                         "were OOM-killed at 23.8 GB)")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL recomputes activations in backward. Its padded batches (left-padded prompts, "
                         "right-padded completions) carry an attention mask, which on CPU sends SDPA to the math "
                         "kernel: every layer keeps its L x L attention probabilities for backward (about 0.2 GB a "
                         "layer at 2.4k tokens and one sample), which is what a user turns this on for. Ours "
                         "trains unpadded rows through the fused causal kernel and does not need it")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds; both trainers run each")
    ap.add_argument("--eval-base", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=["etude", "trl"])
    ap.add_argument("--json")
    ap.add_argument("--margin", type=float, default=0.05,
                    help="non-inferiority margin in reward units: etude passes when its held-out mean reward is "
                         "shown to be above TRL's minus this (one-sided paired t over problems)")
    ap.add_argument("--alpha", type=float, default=0.05, help="one-sided level of the non-inferiority test")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.worker:
        return child(a)
    name = "trainer_vs_trl" + ("_realistic" if a.setting == "realistic" else "")
    a.out = a.out or ROOT / "bench" / "results" / f"{name}.json"
    started = time.time()
    stages: dict = {}
    prompt_stats = None
    if a.setting == "realistic":
        work = Path(tempfile.mkdtemp(prefix="etude-vs-trl-prompts-"))
        a.prompts_file = str(work / "prompts.jsonl")
        prompt_stats = build_prompts(Path(a.prompts_file), a.model, a.num_train, a.eval_problems)
        print(f"prompts: {prompt_stats}", flush=True)
    import torch
    import transformers
    import trl

    seeds = [int(x) for x in a.seeds.split(",")]
    res: dict = {"bench": "trainer_vs_trl", "machine": platform.platform(), "torch": torch.__version__,
                 "transformers": transformers.__version__, "trl_version": trl.__version__,
                 "settings": {k: getattr(a, k) for k in ("model", "steps", "prompts", "group", "max_new_tokens", "lr",
                                                         "eval_problems", "eval_samples", "trl_micro_batch",
                                                         "trl_gradient_checkpointing", "margin", "alpha")}
                 | {"seeds": seeds},
                 "setting": a.setting, "prompt_stats": prompt_stats,
                 "env": {k: os.environ.get(k) for k in ("MALLOC_ARENA_MAX", "OMP_NUM_THREADS")},
                 "note": f"CPU only, 2 cores; same {a.setting} prompts and reward; held-out reward of the final weights "
                         "by one evaluator for both", "runs": []}
    for seed in seeds:
        run: dict = {"seed": seed}
        for name in ("etude", "trl"):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                path = f.name
            argv = [sys.executable, __file__, "--worker", name, "--json", path, "--seeds", str(seed)] + [
                x for k in ("setting", "model", "steps", "prompts", "group", "max_new_tokens", "lr", "num_train",
                            "eval_problems", "eval_samples", "prompts_file", "trl_micro_batch")
                if getattr(a, k) is not None for x in (f"--{k.replace('_', '-')}", str(getattr(a, k)))]
            argv += ["--trl-gradient-checkpointing"] if a.trl_gradient_checkpointing else []
            if name == "etude" and seed == seeds[0]:
                argv.append("--eval-base")
            t0 = time.time()
            rc = subprocess.run(argv, check=False).returncode
            stages[f"seed{seed}.{name}"] = {"seconds": time.time() - t0, "resumed": False}
            if rc != 0:  # e.g. SIGKILL from the OOM killer: keep what the other trainer measured, outside results/
                why = " (SIGKILL: on this machine, the OOM killer)" if rc == -9 else ""
                run[name] = {"failed": f"worker exited {rc}{why}", "wall_s": time.time() - t0}
                res["runs"].append(run)
                res["incomplete"] = True
                partial = Path(tempfile.mkdtemp(prefix="trainer-vs-trl-failed-")) / a.out.name
                partial.write_text(json.dumps(res, indent=1))
                raise SystemExit(f"the {name} worker failed (exit {rc}{why}); partial results in {partial}")
            run[name] = summarise(json.loads(Path(path).read_text()), last_k=min(3, a.steps))
            run[name]["wall_s"] = time.time() - t0
        e, t = run["etude"], run["trl"]
        res["runs"].append(run)
        print(f"seed {seed}: samples/s etude {e['samples_per_s']:.3g} trl {t['samples_per_s']:.3g}, held-out etude "
              f"{e['held_out_reward']:.3f} trl {t['held_out_reward']:.3f}", flush=True)

    runs = res["runs"]
    records = result_records(runs)
    figs = result_figures(a.margin, a.alpha, base=any(r["trainer"] == "base" for r in records))
    computed = compute_figures(figs, records)
    ni = computed["etude_noninferior_to_trl"]
    res["runs"] = [{"seed": r["seed"], **{k: {x: y for x, y in r[k].items() if x != "raw"} for k in ("etude", "trl")}}
                   for r in runs]  # the raw values are the records
    res["held_out"] = {"problems": a.eval_problems, "samples_each": a.eval_samples, "temperature": 1.0,
                       "etude_per_seed": [r["etude"]["held_out_reward"] for r in runs],
                       "trl_per_seed": [r["trl"]["held_out_reward"] for r in runs]}
    res["target_1_5x_met"] = computed["throughput_ratio_samples_per_s"]["value"] >= 1.5
    res["target_met"] = res["target_1_5x_met"] and ni["noninferior"]
    doc = write_result(a.out, figs, records, provenance(seeds={"train": seeds, "eval_sampling": EVAL_SEED},
                                                        started=started, stages=stages), meta=res)
    print(json.dumps({"figures": doc["figures"], "target_met": res["target_met"]}, indent=1))
    print(f"reward check (non-inferiority, margin {a.margin}, n = {ni['n']} problems): "
          f"{'shown' if ni['noninferior'] else 'NOT shown'}; p = {ni['p']}, power at the margin "
          f"{ni['power_at_margin']}, n for {ni['power_target']:.0%} power {ni['n_for_power']} -> {a.out}")


if __name__ == "__main__":
    main()
