"""The training loop: dispatch rollouts → score → advantages → learner step → publish → checkpoint.

Read top to bottom in `train`. The same loop runs in-process (`use_ray = false`, synchronous)
and with Ray rollout actors (`use_ray = true`, up to `max_staleness` versions behind); only
the executor differs. Resuming from `OUT/checkpoints/latest` restores weights, optimizer,
RNG, baseline and the data cursor; batch ids consumed are recorded in every checkpoint.

Not guaranteed: bit-identical continuation after a resume under Ray (actors sample in their
own processes, so the batches are the same problems but not necessarily the same samples).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from etude.protocols import Env
from etude.train.checkpoint import ckpt_root, latest_checkpoint, load_checkpoint, save_checkpoint
from etude.train.config import TrainConfig
from etude.train.envs import make_env
from etude.train.learner import Learner, Sample
from etude.train.losses import RunningBaseline, group_advantages, token_weights
from etude.train.metrics import MetricsWriter
from etude.train.rollout import (
    Dispatcher,
    LocalExecutor,
    RayExecutor,
    RolloutBatch,
    RolloutWorker,
    episodes_summary,
    rollout_policy,
)
from etude.types import Episode, Problem


def to_samples(cfg: TrainConfig, batch: RolloutBatch, baseline: RunningBaseline) -> list[Sample]:
    """Episodes → one `Sample` per assistant turn, each with its episode's advantage."""
    eps = batch.episodes
    rewards = [e.reward for e in eps]
    if cfg.advantage == "baseline":
        adv = baseline.advantages(rewards, [e.family for e in eps])
    else:
        groups = [i // cfg.group_size for i in range(len(eps))]
        adv = group_advantages(rewards, groups, scale=cfg.advantage == "grpo")
    samples = [Sample(t.prompt_ids, t.completion_ids, t.logprobs, a, routes=t.routes)
               for e, a in zip(eps, adv, strict=True) for t in e.turns if t.completion_ids]
    weights = token_weights([len(s.completion_ids) for s in samples], cfg.aggregation,
                            constant_len=cfg.max_new_tokens)
    for s, w in zip(samples, weights, strict=True):
        s.weight = w
    return samples


def evaluate(cfg: TrainConfig, env: Env, policy: Any, problems: list[Problem], step: int) -> dict[str, Any]:
    """Held-out success: `eval_samples` answers per problem at `eval_temperature`."""
    probs = problems[: cfg.eval_problems] if cfg.eval_problems else problems
    eps: list[Episode] = env.rollout(policy, probs, n=cfg.eval_samples, max_tokens=cfg.max_new_tokens,
                                     temperature=cfg.eval_temperature, top_p=1.0, seed=10_007 + step)
    s = episodes_summary(eps)
    return {"kind": "eval", "step": step, "eval/resolved": s["resolved"], "eval/reward": s["reward"],
            "eval/n": len(eps), "eval/successes": int(sum(e.resolved for e in eps)),
            "eval/outcomes": [int(e.resolved) for e in eps]}


class _Run:
    """State of one run: learner, env, executor, cursor; the loop's steps are its methods."""

    def __init__(self, cfg: TrainConfig, out: Path, resume: bool):
        self.cfg, self.out = cfg, out
        torch.manual_seed(cfg.seed)
        self.learner = Learner(cfg)
        self.state: dict[str, Any] = {"step": 0, "version": 0, "cursor": 0, "consumed": [], "baseline": {}}
        ckpt = latest_checkpoint(out) if resume else None
        if not resume and ckpt_root(out).exists():  # --fresh: an old run's checkpoints must not be resumed later
            shutil.rmtree(ckpt_root(out))
        if ckpt is not None:
            self.state = load_checkpoint(ckpt, self.learner)
        self.baseline = RunningBaseline(means=dict(self.state.get("baseline") or {}))
        self.env = make_env(cfg.env)
        self.test_problems = self.env.problems("test")
        # the policy that samples (and evaluates): the learner's own model, or a vLLM engine
        self.policy = rollout_policy(cfg, self.learner, self.state["version"])
        # A fresh run (no checkpoint) drops every old record; a resumed one keeps those ≤ its step.
        self.metrics = MetricsWriter(out, resume_step=self.state["step"] if ckpt else -1)
        if cfg.use_ray:
            self.executor: Any = RayExecutor(cfg, self.learner, self.state["version"])
        else:
            self.executor = LocalExecutor(RolloutWorker(cfg, self.policy, self.env))
        self.dispatcher = Dispatcher(self.executor, 0 if not cfg.use_ray else cfg.max_staleness, cfg.steps,
                                     self.state["cursor"])
        self.resumed_from = str(ckpt) if ckpt else None

    def one_step(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        t0 = time.perf_counter()
        batch = self.dispatcher.take(st["cursor"], st["version"])
        wait_s = time.perf_counter() - t0
        staleness = st["version"] - batch.policy_version
        if staleness > cfg.max_staleness:  # cannot happen by construction; refuse rather than train on it
            raise RuntimeError(f"batch {batch.batch_id} is {staleness} versions stale (max {cfg.max_staleness})")
        samples = to_samples(cfg, batch, self.baseline)
        stats = self.learner.step(samples)
        st["version"] += 1
        self.executor.publish(st["version"], self.learner)
        self.dispatcher.fill(st["version"])  # let workers start on the next batches right away
        st["step"] += 1
        st["cursor"] = batch.batch_id + 1
        st["consumed"].append(batch.batch_id)
        st["baseline"] = dict(self.baseline.means)
        return self._record(batch, stats, staleness, wait_s, time.perf_counter() - t0)

    def _record(self, batch: RolloutBatch, stats: dict[str, float], staleness: int, wait_s: float,
                step_s: float) -> dict[str, Any]:
        summ = episodes_summary(batch.episodes)
        gen_tokens = summ.pop("completion_tokens")
        rec = {"kind": "train", "step": self.state["step"], "batch_id": batch.batch_id,
               "policy_version": batch.policy_version, "staleness": staleness, "worker": batch.worker,
               **summ, **stats, "gen_s": batch.gen_s, "wait_s": wait_s, "step_s": step_s,
               "gen_tokens": gen_tokens, "gen_tokens_per_s": gen_tokens / max(batch.gen_s, 1e-9),
               "weight_sync_s": getattr(self.executor, "sync_s", 0.0),
               "samples": len(batch.episodes), "time": time.time()}
        self.metrics.write(rec)
        return rec

    def checkpoint(self) -> Path:
        st = {**self.state, "config": self.cfg.to_dict(), "model": self.cfg.model}
        return save_checkpoint(self.out, self.learner, st, keep=self.cfg.keep_checkpoints)

    def evaluate(self) -> dict[str, Any]:
        rec = evaluate(self.cfg, self.env, self.policy, self.test_problems, self.state["step"])
        self.metrics.write(rec)
        return rec

    def close(self) -> None:
        self.executor.close()
        self.metrics.close()


def train(cfg: TrainConfig, out_dir: str | Path, *, resume: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) into `out_dir`; returns a summary (last record, evals, checkpoint)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar (ours), not one per shard load/save
    if cfg.rollout_backend == "vllm":  # before any model is loaded: one line naming the fix
        from etude.policy.vllm_backend import require_vllm

        require_vllm("rollout_backend = \"vllm\"")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    run = _Run(cfg, out, resume)
    evals, last, ckpt = [], {}, None
    try:
        if run.state["step"] == 0:
            evals.append(run.evaluate())
        with _progress(progress) as bar:
            task = bar.add_task("train", total=cfg.steps, completed=run.state["step"], reward=float("nan"))
            while run.state["step"] < cfg.steps:
                last = run.one_step()
                step = run.state["step"]
                if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                    evals.append(run.evaluate())
                if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    ckpt = run.checkpoint()
                bar.update(task, completed=step, reward=last["reward"])
                if cfg.step_delay_s:
                    time.sleep(cfg.step_delay_s)
        if last:
            evals.append(run.evaluate())
            ckpt = run.checkpoint()
        else:  # resumed a finished run: nothing to do
            ckpt = latest_checkpoint(out)
    finally:
        run.close()
    return {"steps": run.state["step"], "consumed": list(run.state["consumed"]), "last": last, "evals": evals,
            "checkpoint": str(ckpt) if ckpt else None, "resumed_from": run.resumed_from}


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn(), disable=not enabled)
