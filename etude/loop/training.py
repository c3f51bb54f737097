"""Train a candidate from the served weights on distilled production samples.

The trainer is etude's one trainer, `etude.train.loop.train`, on the `episodes` environment
(`etude.envs.families.EpisodesEnv`): the distilled samples, converted once by
`ScoredSample.to_episode()` and written as `Episode.to_dict()` lines, are replayed as the
rollouts, with the behaviour log-probs logged at serving time (truncated importance sampling,
PPO clip, AdamW). One response per prompt, so the advantage is the group-free running-mean
baseline (`advantage = "baseline"`, `group_size = 1`); each batch is a seeded sample of the
episodes (`etude.train.rollout.batch_problems`).

Resumable as every training run is: a checkpoint after every step, and a rerun continues from
the latest one; the final checkpoint is a Hugging Face model directory the server loads as it
is. Not guaranteed: bit-identical results after a resume (dropout RNG is restored, not
per-kernel determinism).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etude.loop.distill import ScoredSample
from etude.train.config import EnvConfig, LoraConfig, TrainConfig
from etude.train.loop import train
from etude.train.lora import merge_adapter_dir
from etude.train.losses import LossConfig
from etude.train.metrics import read_metrics


def episodes_jsonl(samples: Iterable[ScoredSample]) -> str:
    """The learner's episodes file: one `ScoredSample.to_episode().to_dict()` per line."""
    return "".join(json.dumps(s.to_episode().to_dict()) + "\n" for s in samples)


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
