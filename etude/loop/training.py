"""Train a candidate from the served weights on distilled production samples.

The trainer is etude's one trainer, `etude.train.loop.train`, on the `episodes` environment
(`etude.envs.families.EpisodesEnv`): the distilled samples, converted once by
`ScoredSample.to_episode()` and written as `Episode.to_dict()` lines, are replayed as the
rollouts, with the behaviour log-probs logged at serving time (truncated importance sampling,
PPO clip, AdamW). One response per prompt, so there is no sampled group: the baseline of a
sample is the mean reward of the window's other answers to the same request (`[train] baseline =
"loo"`: the same first user message at the same turn, from other users' sessions; `loo_rewards`),
and for a request answered once the trainer's running mean (`advantage = "baseline"`,
`group_size = 1`); each batch is a seeded sample of the episodes (`etude.train.rollout.batch_problems`).

Resumable as every training run is: a checkpoint after every step, and a rerun continues from
the latest one; the final checkpoint is a Hugging Face model directory the server loads as it
is. Not guaranteed: bit-identical results after a resume (dropout RNG is restored, not
per-kernel determinism).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from etude.loop.distill import ScoredSample
from etude.train.config import EnvConfig, LoraConfig, TrainConfig
from etude.train.loop import train
from etude.train.lora import merge_adapter_dir
from etude.train.losses import LossConfig
from etude.train.metrics import read_metrics


def request_key(s: ScoredSample) -> str:
    """What makes two samples answers to the same request: the session's first user message and
    how many assistant turns came before this one (turn 0 of a task, turn 1 of it, ...)."""
    msgs = s.trajectory.messages
    first = next((m.content for m in msgs if m.role == "user"), "")
    turn = sum(1 for m in msgs[:-1] if m.role == "assistant")
    return f"{turn}\x00{first}"


def loo_rewards(samples: Sequence[ScoredSample]) -> list[float | None]:
    """Per sample, its reward minus the mean reward of the window's *other* samples of the same
    request (`request_key`): a leave-one-out baseline from other sessions of the same task, as a
    GRPO group would give. None for a request seen once (the trainer's running mean is its baseline)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        groups[request_key(s)].append(i)
    out: list[float | None] = [None] * len(samples)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        total = sum(samples[i].reward.total for i in idx)
        for i in idx:
            r = samples[i].reward.total
            out[i] = r - (total - r) / (len(idx) - 1)
    return out


def episodes_jsonl(samples: Iterable[ScoredSample], baseline: str = "running", negative_weight: float = 1.0) -> str:
    """The learner's episodes file: one `ScoredSample.to_episode().to_dict()` per line. With
    `baseline = "loo"`, a sample whose request was answered more than once in the window carries
    its leave-one-out advantage as its reward (family "production-loo", meta["baseline"] = "loo":
    the trainer uses it as the advantage, not re-centred), a negative one times `negative_weight`;
    its raw reward is in meta["raw_reward"], its advantage before the factor in meta["loo_advantage"]."""
    samples = list(samples)
    centred = loo_rewards(samples) if baseline == "loo" else [None] * len(samples)
    lines = []
    for s, adv in zip(samples, centred, strict=True):
        ep = s.to_episode()
        if adv is not None:
            ep = dataclasses.replace(ep, reward=adv if adv >= 0 else adv * negative_weight, family="production-loo",
                                     meta={**ep.meta, "raw_reward": ep.reward, "baseline": "loo",
                                           "loo_advantage": adv})
        lines.append(json.dumps(ep.to_dict()) + "\n")
    return "".join(lines)


def train_config(base: str, episodes_path: Path, section: Any, temperature: float, seed: int,
                 lora: bool = False) -> TrainConfig:
    """The trainer's config for a loop's `[train]` section (etude.loop.config.TrainSection);
    `lora`: a LoRA adapter on `base` (an organisation's, `etude loop --org`) instead of all weights."""
    adapter = LoraConfig(enabled=True, r=section.lora_r, alpha=section.lora_alpha,
                         target_modules=tuple(section.lora_target_modules)) if lora else LoraConfig()
    return TrainConfig(model=base, lora=adapter, steps=section.steps, prompts_per_step=section.batch_size, group_size=1,
                       advantage="baseline", aggregation="token_mean", temperature=temperature, top_p=1.0,
                       lr=section.lr, micro_batch_tokens=section.micro_batch_tokens, seed=seed,
                       checkpoint_every=1, keep_checkpoints=1,
                       loss=LossConfig(is_cap=section.is_cap, kl_coef=section.kl_coef),
                       env=EnvConfig(name="episodes", episodes_file=str(episodes_path), seed=seed))


def train_candidate(episodes_path: Path, base_model: str, out_dir: Path, section: Any, *, temperature: float,
                    seed: int = 0, lora: bool = False) -> dict[str, Any]:
    """Run (or resume) `section.steps` steps from `base_model` (a LoRA adapter on it if `lora`:
    the checkpoint is then peft's adapter directory, which the server loads on its base);
    -> summary with the checkpoint path."""
    cfg = train_config(base_model, episodes_path, section, temperature, seed, lora)
    summ = train(cfg, out_dir, resume=True, progress=False)
    history = [{"step": r["step"], "reward": r.get("reward"), **{k: r[k] for k in _KEEP if k in r}}
               for r in read_metrics(out_dir) if r.get("kind") == "train"]
    samples = sum(1 for line in Path(episodes_path).read_text().splitlines() if line.strip())
    return {"checkpoint": summ["checkpoint"], "steps": summ["steps"], "samples": samples, "base": base_model,
            "adapter": lora, "history": history}


def is_adapter(path: str | Path) -> bool:
    return (Path(path) / "adapter_config.json").is_file()


def export_merged(adapter_dir: str | Path, base_model: str, out: str | Path) -> Path:
    """`base_model` with the adapter merged in, saved as a plain model directory at `out` (what
    the eval harness loads); written under a temporary name, then renamed; kept if present.
    The one LoRA export, `etude.train.lora.merge_adapter_dir`."""
    return merge_adapter_dir(adapter_dir, base_model, out)


_KEEP = ("loss", "is_ratio_mean", "is_ratio_min", "is_ratio_max", "is_truncated_frac", "clip_frac", "kl",
         "grad_norm", "train_tokens", "train_s")
