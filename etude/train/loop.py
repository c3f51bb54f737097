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
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from etude.envs.families import make_env
from etude.errors import EtudeError
from etude.policy.vllm_backend import require_vllm
from etude.protocols import Env
from etude.tasks.seal import check_sources
from etude.train import distributed
from etude.train.checkpoint import ckpt_root, latest_checkpoint, load_checkpoint, save_checkpoint
from etude.train.config import TrainConfig
from etude.train.distributed import broadcast_object, full_optimizer_tensors
from etude.train.learner import Learner, Sample
from etude.train.losses import RunningBaseline, group_advantages, token_weights
from etude.train.metrics import MetricsWriter, read_metrics
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
        # an episode that carries its own baseline (meta["baseline"], e.g. the real-time loop's
        # leave-one-out over other sessions of its request) is already an advantage: not re-centred
        own = {i for i, e in enumerate(eps) if e.meta.get("baseline")}
        rest = [i for i in range(len(eps)) if i not in own]
        adv = list(rewards)
        for i, a in zip(rest, baseline.advantages([rewards[i] for i in rest], [eps[i].family for i in rest]),
                        strict=True):
            adv[i] = a
    else:
        groups = [i // cfg.group_size for i in range(len(eps))]
        adv = group_advantages(rewards, groups, scale=cfg.advantage == "grpo")
    flat = dropped_groups(cfg, eps)  # no signal: DAPO-style dynamic sampling drops them (counted per step)
    samples = [Sample(t.prompt_ids, t.completion_ids, t.logprobs, a, routes=t.routes)
               for i, (e, a) in enumerate(zip(eps, adv, strict=True)) if i // cfg.group_size not in flat
               for t in e.turns if t.completion_ids]
    weights = token_weights([len(s.completion_ids) for s in samples], cfg.aggregation,
                            constant_len=cfg.max_new_tokens)
    for s, w in zip(samples, weights, strict=True):
        s.weight = w
    return samples


def reward_up_val_down(records: list[dict[str, Any]], now: dict[str, Any]) -> bool:
    """The hack alarm: held-out success fell since the previous evaluation while the mean training
    reward of the steps since then rose above that of the steps before it."""
    evals = [r for r in records if r.get("kind") == "eval" and r["step"] < now["step"]]
    if not evals:
        return False
    prev = evals[-1]
    train = [r for r in records if r.get("kind") == "train" and "reward" in r]
    before = [r["reward"] for r in train if r["step"] <= prev["step"]]
    since = [r["reward"] for r in train if prev["step"] < r["step"] <= now["step"]]
    if not before or not since:
        return False
    return now["eval/resolved"] < prev["eval/resolved"] and sum(since) / len(since) > sum(before) / len(before)


def flat_groups(cfg: TrainConfig, eps: list[Episode]) -> set[int]:
    """GRPO groups whose rewards are all equal (their advantages are all zero): skipped, counted.
    Only for group advantages ("grpo", "drgrpo"); a running baseline still learns from them."""
    if cfg.advantage == "baseline" or cfg.group_size < 2:
        return set()
    groups: dict[int, list[float]] = {}
    for i, e in enumerate(eps):
        groups.setdefault(i // cfg.group_size, []).append(e.reward)
    return {g for g, r in groups.items() if max(r) - min(r) < 1e-9}


def dropped_groups(cfg: TrainConfig, eps: list[Episode]) -> set[int]:
    """The flat groups the step leaves out — all of them unless every group is flat: then the
    batch is kept (zero policy gradient) so the learner still reports its statistics and applies
    what does not need an advantage (KL to the reference, an MoE router's balancing loss)."""
    flat = flat_groups(cfg, eps)
    return flat if len(flat) < math.ceil(len(eps) / max(1, cfg.group_size)) else set()


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

    def __init__(self, cfg: TrainConfig, out: Path, resume: bool, dist: Any = None):
        self.cfg, self.out, self.dist = cfg, out, dist
        self.main = dist is None or dist.is_main  # rank 0 (or the only process): rollouts, evals, files
        torch.manual_seed(cfg.seed)
        self.learner = Learner(cfg, dist=dist)
        self.state: dict[str, Any] = {"step": 0, "version": 0, "cursor": 0, "consumed": [], "baseline": {}}
        ckpt = latest_checkpoint(out) if resume else None
        if dist is not None:  # every rank must agree on where it starts
            ckpt = broadcast_object(ckpt, dist)
        if not resume and self.main and ckpt_root(out).exists():  # --fresh: old checkpoints must not be resumed later
            shutil.rmtree(ckpt_root(out))
        if ckpt is not None:
            self.state = load_checkpoint(ckpt, self.learner)
        self.state["world_size"] = dist.world if dist is not None else 1
        self.baseline = RunningBaseline(means=dict(self.state.get("baseline") or {}))
        self.resumed_from = str(ckpt) if ckpt else None
        self._published: dict[str, torch.Tensor] = {}
        if dist is not None:  # rank 0's unsharded rollout copy gets the (possibly resumed) weights
            self._published = self.learner.publish_state()
        if not self.main:  # ranks > 0 only train: batches arrive by broadcast
            return
        rollout_learner = self.learner if dist is None else _RankZero(self.learner, self)
        self.env = make_env(cfg.env)
        self.test_problems = self.env.problems("test")
        # the policy that samples (and evaluates): the learner's own model, or a vLLM engine
        self.policy = rollout_policy(cfg, rollout_learner, self.state["version"])
        # A fresh run (no checkpoint) drops every old record; a resumed one keeps those ≤ its step.
        self.metrics = MetricsWriter(out, resume_step=self.state["step"] if ckpt else -1)
        if cfg.use_ray:
            self.executor: Any = RayExecutor(cfg, rollout_learner, self.state["version"])
        else:
            self.executor = LocalExecutor(RolloutWorker(cfg, self.policy, self.env))
        self.dispatcher = Dispatcher(self.executor, 0 if not cfg.use_ray else cfg.max_staleness, cfg.steps,
                                     self.state["cursor"])

    def one_step(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.state
        t0 = time.perf_counter()
        batch = self.dispatcher.take(st["cursor"], st["version"]) if self.main else None
        if self.dist is not None:  # rollouts stay on rank 0; every rank trains on the same batch
            batch = broadcast_object(batch, self.dist)
        wait_s = time.perf_counter() - t0
        staleness = st["version"] - batch.policy_version
        if staleness > cfg.max_staleness:  # cannot happen by construction; refuse rather than train on it
            raise RuntimeError(f"batch {batch.batch_id} is {staleness} versions stale (max {cfg.max_staleness})")
        samples = to_samples(cfg, batch, self.baseline)
        # every group flat: nothing to learn from this batch; the version still advances
        stats = self.learner.step(samples) if samples else {"loss": 0.0, "empty_batch": 1.0}
        st["version"] += 1
        if self.dist is not None:
            self._published = self.learner.publish_state()  # gathered from the shards; all ranks
        if self.main:
            self.executor.publish(st["version"], self.learner if self.dist is None else _RankZero(self.learner, self))
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
               "weight_sync_s": getattr(self.executor, "sync_s", 0.0) if self.main else 0.0,
               "samples": len(batch.episodes), "groups_flat": len(flat_groups(self.cfg, batch.episodes)),
               "groups_skipped": len(dropped_groups(self.cfg, batch.episodes)),
               "world_size": self.state["world_size"], "time": time.time()}
        if self.main:
            self.metrics.write(rec)
        return rec

    def checkpoint(self) -> Path:
        st = {**self.state, "config": self.cfg.to_dict(), "model": self.cfg.model}
        if self.dist is None:
            return save_checkpoint(self.out, self.learner, st, keep=self.cfg.keep_checkpoints)
        # gathered to rank 0 and written as one process writes it: loads on any number of ranks
        opt = full_optimizer_tensors(self.learner.opt, self.learner.param_names, self.learner.model, self.dist)
        path = ckpt_root(self.out) / f"step-{int(st['step']):06d}"
        if self.main:
            path = save_checkpoint(self.out, self.learner, st, keep=self.cfg.keep_checkpoints,
                                   model=self.learner.rollout_model, optimizer_tensors=opt)
        return path

    def evaluate(self) -> dict[str, Any] | None:
        if not self.main:
            return None
        rec = evaluate(self.cfg, self.env, self.policy, self.test_problems, self.state["step"])
        rec["alarm/reward_up_val_down"] = float(reward_up_val_down(read_metrics(self.out), rec))
        if rec["alarm/reward_up_val_down"]:
            print(f"etude: warning: step {rec['step']}: training reward rose while held-out success fell "
                  "(a reward hack? see the monitor/* curves)", file=sys.stderr)
        self.metrics.write(rec)
        return rec

    def close(self) -> None:
        if self.main:
            self.executor.close()
            self.metrics.close()


class _RankZero:
    """What rank 0's rollout side sees of a sharded learner: the unsharded rollout copy (kept
    current by `Learner.publish_state`) and the full weights gathered at the last publish."""

    def __init__(self, learner: Learner, run: _Run):
        self.model, self.tokenizer, self.cfg, self._run = learner.rollout_model, learner.tokenizer, learner.cfg, run

    def publish_state(self) -> dict[str, torch.Tensor]:
        return self._run._published


def _record_config(cfg: TrainConfig, out: Path, ckpt: Path | None) -> None:
    """Write OUT/config.json. Resuming checkpoint `ckpt` under another config keeps the earlier
    one as config.before-step-N.json and names the changed keys on stderr; another base model
    (or LoRA setting) is refused, since the checkpoint's weights belong to the earlier one."""
    path, new = out / "config.json", json.loads(json.dumps(cfg.to_dict()))
    try:
        old = json.loads(path.read_text()) if ckpt is not None else None
    except (OSError, ValueError):
        old = None  # no readable record of the earlier config: nothing to compare or keep
    if old is not None and old != new:
        step = json.loads((ckpt / "state.json").read_text()).get("step")  # type: ignore[operator]
        for key in ("model", "lora"):
            if old.get(key) != new.get(key):
                raise EtudeError(f"{out} holds a checkpoint (step {step}) trained with {key} = {old.get(key)!r}; "
                                 f"resume with the same {key} or pass --fresh to start over")
        kept = out / f"config.before-step-{step}.json"
        path.replace(kept)
        changed = "; ".join(_changed(old, new)[:8])
        print(f"etude: resuming {out} at step {step} with a changed config ({changed}); "
              f"the earlier config is {kept.name}", file=sys.stderr)
    path.write_text(json.dumps(new, indent=1))


def _changed(old: Any, new: Any, key: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs between two JSON-shaped configs."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [c for k in sorted(set(old) | set(new)) for c in _changed(old.get(k), new.get(k), f"{key}.{k}".lstrip("."))]
    return [] if old == new else [f"{key}: {old!r} -> {new!r}"]


def train(cfg: TrainConfig, out_dir: str | Path, *, resume: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train (or resume) into `out_dir`; returns a summary (last record, evals, checkpoint)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar (ours), not one per shard load/save
    if cfg.rollout_backend == "vllm":  # before any model is loaded: one line naming the fix
        require_vllm("rollout_backend = \"vllm\"")
    out = Path(out_dir)
    # the sealed test split: before anything is loaded or written (etude.tasks.seal)
    contamination = check_sources([("env.tasks_file", cfg.env.tasks_file),
                                   ("env.eval_tasks_file", cfg.env.eval_tasks_file)], cfg.allow_test_split)
    dist = distributed.init(cfg.parallel.backend, cfg.device)  # None unless launched on > 1 rank
    try:
        if dist is None or dist.is_main:
            out.mkdir(parents=True, exist_ok=True)
            _record_config(cfg, out, latest_checkpoint(out) if resume else None)
            if contamination:
                (out / "contamination.json").write_text(json.dumps(contamination, indent=1) + "\n")
        run = _Run(cfg, out, resume, dist)
    except BaseException:
        distributed.abort(dist)
        raise
    evals, last, ckpt = [], {}, None
    try:
        if run.state["step"] == 0 and (rec := run.evaluate()):
            evals.append(rec)
        with _progress(progress and run.main) as bar:
            task = bar.add_task("train", total=cfg.steps, completed=run.state["step"], reward=float("nan"))
            t_start = time.monotonic()
            while run.state["step"] < cfg.steps:
                if last and cfg.time_limit_s is not None and time.monotonic() - t_start >= cfg.time_limit_s:
                    break  # the budget is spent: evaluate and checkpoint this step below
                last = run.one_step()
                step = run.state["step"]
                if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps and (rec := run.evaluate()):
                    evals.append(rec)
                if step % cfg.checkpoint_every == 0 and step < cfg.steps:
                    ckpt = run.checkpoint()
                bar.update(task, completed=step, reward=last["reward"])
                if cfg.step_delay_s:
                    time.sleep(cfg.step_delay_s)
        if last:
            if rec := run.evaluate():
                evals.append(rec)
            ckpt = run.checkpoint()
        else:  # resumed a finished run: nothing to do
            ckpt = latest_checkpoint(out)
    except BaseException:
        run.close()
        distributed.abort(dist)
        raise
    run.close()
    distributed.close(dist)
    return {"steps": run.state["step"], "consumed": list(run.state["consumed"]), "last": last, "evals": evals,
            "checkpoint": str(ckpt) if ckpt else None, "resumed_from": run.resumed_from,
            "world_size": run.state["world_size"], "rank": dist.rank if dist is not None else 0,
            "contamination": contamination}


def _progress(enabled: bool) -> Any:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("reward {task.fields[reward]:.3f}"), TimeElapsedColumn(), disable=not enabled)
