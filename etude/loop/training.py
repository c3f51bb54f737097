"""Train a candidate from the served weights on distilled production samples.

The learner is etude.train's own (`Learner`: packed forward, truncated importance sampling
against the behaviour log-probs logged at serving time, PPO clip, AdamW), with the group-free
running-mean baseline (`RunningBaseline`), because production has one response per prompt.
The samples are `ScoredSample.to_episode()` episodes read back from the cycle's samples file.

Resumable: a checkpoint (etude.train.checkpoint, atomic) is written after every step, and a
rerun continues from the latest one; the final checkpoint is a Hugging Face model directory
the server loads as it is. Not guaranteed: bit-identical results after a resume (the sample
order is seeded per step, the weights and optimizer are restored, dropout RNG is restored).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any


def _train_config(base: str, section: Any, temperature: float, seed: int) -> Any:
    from etude.train import LossConfig, TrainConfig

    return TrainConfig(model=base, steps=section.steps, prompts_per_step=section.batch_size, group_size=1,
                       advantage="baseline", aggregation="token_mean", temperature=temperature, top_p=1.0,
                       lr=section.lr, micro_batch_tokens=section.micro_batch_tokens, seed=seed,
                       checkpoint_every=1, keep_checkpoints=1,
                       loss=LossConfig(is_cap=section.is_cap, kl_coef=section.kl_coef))


def load_episodes(samples_path: Path) -> list[Any]:
    from etude.loop.distill import ScoredSample  # noqa: F401 - the file holds ScoredSample.to_dict()
    from etude.train.envs import Episode, TurnSample

    eps = []
    for line in samples_path.read_text().splitlines():
        d = json.loads(line)
        turn = TurnSample(d["prompt_token_ids"], d["completion_token_ids"], d["behaviour_logprobs"])
        eps.append(Episode(problem_id=d["interaction_id"], family="production", reward=d["reward"]["total"],
                           terms=d["reward"]["terms"], resolved=False, turns=[turn],
                           policy_version=d["policy_version"]))
    return [e for e in eps if e.turns[0].completion_ids]


def _batch(eps: list[Any], step: int, size: int, seed: int) -> list[Any]:
    """Step k's batch: positions k*size .. of an endless sequence of seeded epoch shuffles."""
    n, size = len(eps), min(size, len(eps))
    orders: dict[int, list[int]] = {}

    def order(epoch: int) -> list[int]:
        if epoch not in orders:
            orders[epoch] = list(range(n))
            random.Random(seed * 100_003 + epoch).shuffle(orders[epoch])
        return orders[epoch]

    return [eps[order(i // n)[i % n]] for i in range(step * size, step * size + size)]


def train_candidate(samples_path: Path, base_model: str, out_dir: Path, section: Any, *, temperature: float,
                    seed: int = 0) -> dict[str, Any]:
    """Run (or resume) `section.steps` steps from `base_model`; -> summary with the model path."""
    import torch

    from etude.train.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from etude.train.learner import Learner, Sample
    from etude.train.losses import RunningBaseline, token_weights

    cfg = _train_config(base_model, section, temperature, seed)
    eps = load_episodes(samples_path)
    torch.manual_seed(seed)
    learner = Learner(cfg)
    state: dict[str, Any] = {"step": 0, "version": 0, "baseline": {}, "history": []}
    ckpt = latest_checkpoint(out_dir)
    if ckpt is not None:
        state = load_checkpoint(ckpt, learner)
    baseline = RunningBaseline(means=dict(state.get("baseline") or {}))
    while state["step"] < cfg.steps:
        batch = _batch(eps, state["step"], cfg.prompts_per_step, seed)
        adv = baseline.advantages([e.reward for e in batch], [e.family for e in batch])
        samples = [Sample(e.turns[0].prompt_ids, e.turns[0].completion_ids, e.turns[0].logprobs, a)
                   for e, a in zip(batch, adv, strict=True)]
        for s, w in zip(samples, token_weights([len(s.completion_ids) for s in samples], cfg.aggregation),
                        strict=True):
            s.weight = w
        stats = learner.step(samples)
        state["step"] += 1
        state["baseline"] = dict(baseline.means)
        state["history"] = [*state.get("history", []), {"step": state["step"], "reward": _mean(e.reward for e in batch),
                                                       **{k: stats[k] for k in _KEEP if k in stats}}]
        ckpt = save_checkpoint(out_dir, learner, {**state, "config": cfg.to_dict(), "model": base_model}, keep=1)
    return {"checkpoint": str(ckpt), "steps": state["step"], "samples": len(eps), "base": base_model,
            "history": state.get("history", [])}


_KEEP = ("loss", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_truncated_frac", "clip_frac", "kl",
         "grad_norm", "train_tokens", "train_s")


def _mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
