"""Rollouts: workers that turn a batch id into scored episodes, in-process or as Ray actors.

Batch `k` always holds the same problems (`batch_problems(cfg, n, k)`), and its sampling seed
is derived from `k`, so the data stream is a pure function of the batch id: the learner's
cursor (the next batch id) is all a checkpoint needs to resume without repeats or skips.

Staleness: the learner's policy version equals the number of updates done, and it consumes
batch `k` at version `k`. The dispatcher hands batch `k` to a worker only once the published
version `v` satisfies `k - v <= max_staleness`, and the worker generates with exactly `v`
(it loads new weights between batches), so every consumed batch is at most `max_staleness`
versions behind; `max_staleness = 0` is synchronous. The loop re-checks it on arrival.

Weights travel through Ray's object store (`ray.put` once per version; each worker fetches a
version only when it is newer than the one it holds). The in-process executor shares the
learner's model object, so publishing is just a version bump.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from etude.envs.families import make_env
from etude.policy.local import LocalPolicy
from etude.policy.vllm_backend import VLLMPolicy, engine_state, require_vllm
from etude.protocols import ModelPolicy
from etude.raycluster import connect, ray_module
from etude.train.config import TrainConfig
from etude.train.learner import apply_state, build_model
from etude.types import Episode, Problem


@dataclass
class RolloutBatch:
    batch_id: int
    policy_version: int  # version of the weights every episode was sampled with
    episodes: list[Episode]  # prompt-major, group_size per problem
    gen_s: float  # wall time of generation + scoring
    worker: str = "local"


def batch_problems(cfg: TrainConfig, num_problems: int, batch_id: int) -> list[int]:
    """Indices of the problems of batch `batch_id` (deterministic in seed and id)."""
    rng = random.Random(f"{cfg.seed}:{batch_id}")
    k = min(cfg.prompts_per_step, num_problems)
    return rng.sample(range(num_problems), k)


class RolloutWorker:
    """Generates and scores one batch with its policy. Used directly or inside a Ray actor."""

    def __init__(self, cfg: TrainConfig, policy: Any, env: Any = None, name: str = "local"):
        self.cfg, self.policy, self.name = cfg, policy, name
        self.env = env or make_env(cfg.env)
        self.problems: list[Problem] = self.env.problems("train")

    def run(self, batch_id: int) -> RolloutBatch:
        t0 = time.perf_counter()
        choose = getattr(self.env, "choose", None)  # curriculum envs pick by success so far
        idx = (choose(self.problems, self.cfg.prompts_per_step, random.Random(f"{self.cfg.seed}:{batch_id}"))
               if choose else batch_problems(self.cfg, len(self.problems), batch_id))
        version = self.policy.version
        eps = self.env.rollout(self.policy, [self.problems[i] for i in idx], n=self.cfg.group_size,
                               max_tokens=self.cfg.max_new_tokens, temperature=self.cfg.temperature,
                               top_p=self.cfg.top_p, seed=self.cfg.seed * 1_000_003 + batch_id)
        return RolloutBatch(batch_id, version, eps, time.perf_counter() - t0, self.name)


class LocalExecutor:
    """Runs batches in-process: synchronous by construction. The worker's policy is either the
    learner's own model (publishing is a version bump) or a vLLM engine (`rollout_backend =
    "vllm"`: publishing loads the learner's weights into the running engine, timed in `sync_s`)."""

    def __init__(self, worker: RolloutWorker):
        self.worker = worker
        self.slots = 1
        self._pending: set[int] = set()
        self.sync_s = 0.0  # last weight transfer to a separate engine (0 when sharing the model)

    def submit(self, batch_id: int, version: int) -> None:
        self._pending.add(batch_id)  # run when taken, so a step's time holds its own rollout

    def take(self, batch_id: int) -> RolloutBatch:
        self._pending.remove(batch_id)
        return self.worker.run(batch_id)

    def publish(self, version: int, learner: Any) -> None:
        pol = self.worker.policy
        if isinstance(pol, ModelPolicy) and pol.model is learner.model:
            pol.version = version  # same model object: nothing to copy
            return
        t0 = time.perf_counter()
        pol.load_weights(engine_state(learner.model), version=version)
        self.sync_s = time.perf_counter() - t0

    def close(self) -> None:
        self._pending.clear()
        if isinstance(self.worker.policy, VLLMPolicy):
            self.worker.policy.close()  # a separate engine (vLLM): stop its process


def rollout_policy(cfg: TrainConfig, learner: Any, version: int) -> Any:
    """The policy that samples rollouts and evaluations: the learner's own model
    (`rollout_backend = "hf"`) or a vLLM engine loaded with the learner's current weights
    (`"vllm"`; needs the vLLM environment, else one line naming `make setup-vllm`)."""
    if cfg.rollout_backend == "hf":
        return LocalPolicy(learner.model, learner.tokenizer, id=cfg.model, version=version)
    require_vllm("rollout_backend = \"vllm\"")
    pol = VLLMPolicy(cfg.model, id=cfg.model, version=version, dtype=cfg.vllm_dtype, seed=cfg.seed)
    pol.load_weights(engine_state(learner.model), version=version)  # a resumed learner's weights
    return pol


class _RayWorkerImpl:
    """Body of the Ray actor: its own model copy, weights fetched per version."""

    def __init__(self, cfg_dict: dict[str, Any], name: str, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        self.cfg = TrainConfig.from_dict(cfg_dict)
        model, tok = build_model(self.cfg)
        model.eval()
        self.worker = RolloutWorker(self.cfg, LocalPolicy(model, tok, id=self.cfg.model), name=name)

    def run(self, batch_id: int, version: int, weights: list[Any]) -> RolloutBatch:
        import ray

        pol = self.worker.policy
        if version != pol.version:  # pick up new weights between batches, never mid-episode
            apply_state(pol.model, ray.get(weights[0]), self.cfg.lora.enabled)
            pol.version = version
        return self.worker.run(batch_id)


class RayExecutor:
    """Rollout actors on Ray (local `ray.init()` or a cluster address), streaming batches back."""

    def __init__(self, cfg: TrainConfig, learner: Any, version: int):
        # a local Ray started for this run (shut down by close) unless `[ray] address` names a
        # cluster or this process already joined one; an unreachable address is one line
        self.ray = ray = ray_module()
        self.started = connect(cfg.ray.address, cfg.ray.num_cpus)
        remote = ray.remote(num_cpus=cfg.ray.worker_threads)(_RayWorkerImpl)
        self.actors = [remote.remote(cfg.to_dict(), f"ray-{i}", cfg.ray.worker_threads)
                       for i in range(cfg.ray.num_workers)]
        self.slots = len(self.actors)
        self.free = list(self.actors)
        self.pending: dict[int, tuple[Any, Any]] = {}  # batch id -> (future, actor)
        self.publish(version, learner)

    def publish(self, version: int, learner: Any) -> None:
        self.version = version
        self.weights_ref = self.ray.put(learner.publish_state())

    def submit(self, batch_id: int, version: int) -> None:
        # I send the published version, whatever the caller believes: the ref and its number
        # must travel together.
        actor = self.free.pop()
        self.pending[batch_id] = (actor.run.remote(batch_id, self.version, [self.weights_ref]), actor)

    def take(self, batch_id: int) -> RolloutBatch:
        fut, actor = self.pending.pop(batch_id)
        batch = self.ray.get(fut)
        self.free.append(actor)
        return batch

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.free, self.pending = [], [], {}
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
            self.started = False


class Dispatcher:
    """Keeps workers busy within the staleness bound and hands batches back in id order."""

    def __init__(self, executor: Any, max_staleness: int, total: int, cursor: int):
        self.ex, self.s, self.total = executor, max_staleness, total
        self.next = cursor
        self.inflight: list[int] = []

    def fill(self, version: int) -> None:
        while (len(self.inflight) < self.ex.slots and self.next < self.total
               and self.next - version <= self.s):
            self.ex.submit(self.next, version)
            self.inflight.append(self.next)
            self.next += 1

    def take(self, batch_id: int, version: int) -> RolloutBatch:
        self.fill(version)
        if batch_id not in self.inflight:
            raise RuntimeError(f"batch {batch_id} was never dispatched (cursor {self.next})")
        self.inflight.remove(batch_id)
        return self.ex.take(batch_id)


def episodes_summary(eps: Sequence[Episode]) -> dict[str, float]:
    """Reward, each reward term, resolved rate and tokens of a list of episodes."""
    n = max(1, len(eps))
    mean = sum(e.reward for e in eps) / n
    var = sum((e.reward - mean) ** 2 for e in eps) / max(1, n - 1)
    out = {"reward": mean, "reward_std": var**0.5, "resolved": sum(e.resolved for e in eps) / n,
           "completion_tokens": float(sum(e.completion_tokens for e in eps))}
    terms: dict[str, list[float]] = {}
    for e in eps:
        for k, v in e.terms.items():
            if v is not None:
                terms.setdefault(k, []).append(float(v))
    out.update({f"reward/{k}": sum(v) / len(v) for k, v in terms.items()})
    for key in MONITORED:  # hack monitoring (TasksEnv episodes carry these in meta)
        vals = [float(e.meta[key]) for e in eps if isinstance(e.meta.get(key), (int, float))]
        if vals:
            out[f"monitor/{key}"] = sum(vals) / len(vals)
    return out


MONITORED = ("hack_flags", "test_edits", "broken_calls", "clarifications", "answer_chars", "turns", "tokens")
