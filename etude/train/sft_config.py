"""`etude sft`'s config: the sources and their weights, the schedule, packing, precision, LoRA
(a `[lora]` table) and the harness of the episodes (a `[harness]` table). Loaded from TOML through
the config library (etude.configfile): unknown keys and wrong types are errors naming the key."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import build, load_with
from etude.errors import EtudeError
from etude.harness.config import HarnessConfig
from etude.train.config import LoraConfig

SOURCES = ("expert", "self", "production")


@dataclass(frozen=True)
class SourcesConfig:
    expert: float = 1.0
    """Weight of scripted-expert trajectories (0 turns the source off)."""
    self: float = 0.0
    """Weight of the policy's own resolved episodes (rejection sampling)."""
    production: float = 0.0
    """Weight of distilled production interactions with positive reward."""
    self_k: int = 4
    """Episodes per task for the `self` source."""
    self_model: str | None = None
    """Model that samples the `self` episodes (default: the config's `model`)."""
    production_file: str | None = None
    """JSONL of scored samples from `etude distill` (the `production` source)."""
    drill: float = 0.0
    """Weight of fix drills (`drill_trajectories`): grep, read, the gold edit, no tests run."""
    drill_tasks: str | None = None
    """Where drills come from: a tasks JSONL or "builtin:<split>" (default: the config's `tasks`),
    built with curriculum seed `drill_seed`; tasks also in `tasks` are left out (the expert does them)."""
    drill_seed: int = 7
    """Curriculum seed of built-in drill tasks: another seed mutates other sites of the same packages."""


@dataclass(frozen=True)
class SFTConfig:
    model: str = "smollm2"
    """Model to fine-tune: "smollm2", "tiny" or a model directory."""
    tasks: str = "builtin:train"
    """Where expert and self episodes come from: "builtin:<split>" (the curriculum split) or a JSONL."""
    level: int = 1
    """Curriculum level of built-in tasks."""
    max_tasks: int | None = None
    """Use at most this many tasks (None: all)."""
    epochs: float = 1.0
    """Passes over the mixed data (fractions allowed)."""
    lr: float = 5e-5
    """Peak learning rate (linear warm-up over `warmup_steps`, then cosine to 10%)."""
    warmup_steps: int = 5
    weight_decay: float = 0.0
    batch_sequences: int = 8
    """Sequences per optimizer step."""
    row_tokens: int = 0
    """Packing budget of one forward row (a longer sequence gets a row of its own); 0 = one
    sequence per row. NOTE: on CPU keep 0: a packed row needs a dense block-diagonal mask, which
    sends attention down PyTorch's math path (O(L²) memory, ~10x slower here), while a lone
    sequence runs the fused causal kernel. A multi-turn episode is still one sequence."""
    max_sequence_tokens: int = 6144
    """Sequences longer than this are dropped (counted in the data summary)."""
    max_grad_norm: float = 1.0
    precision: str = "bf16"
    """"bf16" (autocast; fp32 master weights) or "fp32"."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input through the forward pass and recompute the rest during
    the backward pass (transformers' gradient checkpointing, non-reentrant): the same gradients,
    at the cost of a second forward pass, with activation memory per layer instead of per
    operation. One 4,096-token SmolLM2 sequence peaked at 5.6 GiB without it and 3.0 GiB with it
    on this machine; configs/agent_sft.toml turns it on (the demo's SFT process held 10.5 GiB
    without it)."""
    seed: int = 0
    checkpoint_every: int = 20
    """Save weights + optimizer + cursor every this many steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept on disk (the oldest go first); a budget curve keeps them all."""
    time_limit_s: float | None = None
    """Stop training after the step that ends past this many wall seconds of this invocation
    (gathering included), then save and export as at the last step (the learning rate is then
    cut off mid-schedule). None: every step."""
    expert_workers: int = 2
    """Episodes run at once while gathering expert trajectories."""
    threads: int | None = None
    """torch threads (None: torch's default)."""
    harness: dict[str, Any] = field(default_factory=dict)
    """HarnessConfig fields for the episodes (max_steps, max_observation_chars, tools, ...)."""
    allow_test_split: bool = False
    """Let `tasks` / `sources.drill_tasks` hold sealed test-split packages (etude.tasks.seal; CLI
    --allow-test-split); the run is then marked contaminated in OUT/summary.json."""
    sources: SourcesConfig = SourcesConfig()
    lora: LoraConfig = LoraConfig()

    def __post_init__(self) -> None:
        if self.precision not in ("bf16", "fp32"):
            raise EtudeError(f"sft precision must be bf16 or fp32, not {self.precision!r}")
        if self.epochs <= 0 or self.batch_sequences < 1 or self.lr <= 0:
            raise EtudeError("epochs, batch_sequences and lr must be positive")
        if self.level not in (1, 2, 3):
            raise EtudeError(f"level must be 1, 2 or 3, not {self.level}")
        HarnessConfig.from_table(self.harness)  # a bad harness key is an error now, not after data gathering

    def harness_config(self) -> HarnessConfig:
        return HarnessConfig.from_table(self.harness)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_sft_config(path: str | Path, overrides: dict[str, Any] | None = None) -> SFTConfig:
    return load_with(sft_config_from_dict, path, "sft config", overrides=overrides, must_exist=True)


def sft_config_from_dict(data: dict[str, Any]) -> SFTConfig:
    d = dict(data)
    if "sources" in d:
        d["sources"] = build(SourcesConfig, d["sources"], "sources")
    if "lora" in d:
        d["lora"] = build(LoraConfig, d["lora"], "lora")
    if "harness" in d and not isinstance(d["harness"], dict):
        raise EtudeError("[harness] must be a table")
    harness = d.pop("harness", {})
    cfg = build(SFTConfig, d, "config")
    return dataclasses.replace(cfg, harness=dict(harness))
