"""`TrainConfig`: every knob of `etude train`, documented where it is declared, loaded from TOML.

A TOML file mirrors the nesting: top-level keys, then `[env]`, `[loss]`, `[lora]`, `[ray]`,
`[parallel]` tables. Unknown keys are an error (a typo must not silently train with a default).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.configfile import build, load
from etude.errors import EtudeError
from etude.harness.config import HarnessConfig
from etude.rewards import RewardConfig
from etude.train.losses import ADVANTAGES, AGGREGATIONS, LossConfig


@dataclass(frozen=True)
class EnvConfig:
    name: str = "arith"
    """Task family: "arith" (single-turn additions), "pyfunc" (write a function, tested in the
    sandbox), "tasks" (multi-turn repository tasks through the harness, from `tasks_file`), or
    "episodes" (stored episodes replayed, from `episodes_file`: no sampling)."""
    num_train: int = 256
    """Problems generated for training (single-turn families)."""
    num_test: int = 64
    """Held-out problems for evaluation (disjoint from training)."""
    seed: int = 0
    """Seed of problem generation."""
    max_operand: int = 99
    """arith: operands are drawn from [10, max_operand]."""
    tasks_file: str | None = None
    """tasks: JSONL of tasks (etude.tasks.load_tasks); None uses the built-in suite if present."""
    max_steps: int = 6
    """tasks: harness turn limit per episode."""
    eval_tasks_file: str | None = None
    """tasks: where held-out evaluation tasks come from (a JSONL or builtin:curriculum:validation);
    None: the last `num_test` tasks of `tasks_file`."""
    workers: int = 1
    """tasks: episodes run at once; a local model answers their turns in one batch."""
    harness: dict[str, Any] = field(default_factory=dict)
    """tasks: HarnessConfig fields of every episode (max_observation_chars, tools, tool_prompt, ...);
    max_steps, max_tokens_per_turn and temperature come from this config."""
    rewards: dict[str, Any] = field(default_factory=dict)
    """tasks: the episodes' `etude.rewards.RewardConfig` (`[env.rewards]`: weights, budgets, flag
    policy; a key left out keeps its default), e.g. `weights.patch_similarity = 0.5`. arith, pyfunc,
    fix: the weights of the env's own terms (e.g. `weights.on_bug_line = 0.5` for fix); a weight
    naming no term of the env is an error."""
    episodes_file: str | None = None
    """episodes: JSONL of `etude.types.Episode.to_dict()` (sampled earlier, with their behaviour
    log-probs) replayed as the rollouts; the loop trains its candidate on distilled production
    samples this way."""


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = False
    """Train a LoRA adapter (peft) instead of all weights."""
    r: int = 16
    """Adapter rank."""
    alpha: int = 32
    """Scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the adapter input."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Linear layers that get an adapter."""
    init: str | None = None
    """A peft adapter directory to start from (its weights go on training; its own rank, alpha and
    targets are used, the fields above are ignored). None: a fresh adapter."""


@dataclass(frozen=True)
class RayConfig:
    address: str | None = None
    """Ray cluster address; None starts a local Ray (`ray.init()`)."""
    num_workers: int = 2
    """Rollout actors."""
    num_cpus: int | None = None
    """CPUs given to a local Ray (None: Ray's default, all of them)."""
    worker_threads: int = 1
    """torch threads per rollout actor (keep workers × threads ≤ cores)."""


@dataclass(frozen=True)
class ParallelConfig:
    """How the learner is laid out over the ranks of `etude train --nproc N` (or torchrun).
    The world size itself comes from the launch; these only split it."""

    dp_replicate: int = 1
    """HSDP replica groups: parameters are sharded within a group of world / dp_replicate ranks
    and gradients all-reduced across groups (1 = plain FSDP2 over all ranks)."""
    ep: int = 1
    """Expert-parallel degree for MoE models: each expert lives on one of `ep` ranks and tokens
    travel to it by all-to-all; must divide world / dp_replicate (1 = no expert parallelism)."""
    backend: str = "auto"
    """"auto" (nccl when CUDA is available, else gloo), "gloo" or "nccl"."""

    def __post_init__(self) -> None:
        if self.dp_replicate < 1 or self.ep < 1:
            raise EtudeError("parallel.dp_replicate and parallel.ep must be ≥ 1")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise EtudeError(f"parallel.backend must be auto, gloo or nccl, not {self.backend!r}")


@dataclass(frozen=True)
class TrainConfig:
    model: str = "smollm2"
    """"smollm2", "tiny" or a model directory (etude.policy.models.load_model)."""
    steps: int = 20
    """Optimizer steps (= rollout batches consumed)."""
    prompts_per_step: int = 8
    """Distinct problems per batch."""
    group_size: int = 4
    """Samples per problem (the GRPO group); 1 needs advantage = "baseline"."""
    max_new_tokens: int = 32
    """Completion length limit per turn."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores tokens at the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass; < 1 makes behaviour and trainer distributions differ (IS corrects)."""
    lr: float = 1e-5
    """AdamW learning rate (constant after `warmup_steps`)."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    micro_batch_tokens: int = 2048
    """Packed tokens per micro-batch (gradient accumulation splits the batch into these)."""
    share_prefix: bool = True
    """Samples of one prompt (a GRPO group) share one copy of it in the packed training forward
    (a tree mask: each completion sees the prompt and itself). Same log-probs up to float
    rounding; False lays out every sample in full. (Sampling always prefills a group's prompt
    once: LocalPolicy does that for any n > 1.)"""
    ppo_epochs: int = 1
    """Passes over each batch; > 1 makes the PPO clip matter."""
    advantage: str = "grpo"
    """"grpo" (scaled by group std), "dr_grpo" (centred only), "baseline" (running mean per family)."""
    aggregation: str = "token_mean"
    """"token_mean", "seq_mean" (original GRPO) or "constant" (Dr. GRPO, length-unbiased)."""
    precision: str = "auto"
    """"auto" (bf16 autocast on a CUDA GPU that supports it, else fp32), "fp32", "bf16" (fp32
    weights, bf16 autocast), "fp8" (torchao FP8 row-wise linears; CUDA compute capability ≥ 8.9)
    or "mxfp8" (torchao MXFP8 linears; ≥ 10.0). fp8/mxfp8 are refused with one line where the
    hardware or torchao is missing (etude.scale.lowp)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass (SFTConfig's option, the
    same gradients): the learner's memory for a micro-batch is per layer instead of per
    operation, at the cost of a second forward pass."""
    device: str = "auto"
    """Where the learner runs: "auto" (CUDA if available, else CPU), "cpu" or "cuda". Under
    `--nproc` with nccl each rank takes cuda:LOCAL_RANK."""
    seed: int = 0
    """Seed of batch selection, sampling and initialisation."""
    max_staleness: int = 0
    """How many policy versions behind the learner a consumed batch may be (0 = synchronous)."""
    use_ray: bool = False
    """Rollouts on Ray actors (async) instead of in-process; same code path otherwise."""
    rollout_backend: str = "hf"
    """Engine that samples rollouts and held-out evaluations: "hf" (transformers, sharing the
    learner's model object) or "vllm" (etude.policy.vllm_backend.VLLMPolicy in this process's
    environment — .venv-vllm, built by `make setup-vllm`; behaviour log-probs come from vLLM and
    the learner's weights are loaded into the running engine after every optimiser step). "vllm"
    needs use_ray = false."""
    vllm_dtype: str = "auto"
    """rollout_backend = "vllm": the engine's dtype ("auto" = the checkpoint's, "bfloat16",
    "float32"). bf16 is faster on CPUs with AVX-512 bf16 but widens the behaviour/learner gap."""
    checkpoint_every: int = 5
    """Steps between checkpoints (and one at the end)."""
    keep_checkpoints: int = 2
    """Most recent checkpoints kept on disk."""
    eval_every: int = 0
    """Steps between held-out evaluations (0: only before and after training)."""
    eval_samples: int = 1
    """Samples per held-out problem at evaluation (temperature `eval_temperature`)."""
    eval_temperature: float = 0.0
    """0 = greedy evaluation."""
    eval_problems: int | None = None
    """Held-out problems evaluated (None: all of env.num_test)."""
    step_delay_s: float = 0.0
    """Sleep after each step (tests use it to kill a run mid-way deterministically)."""
    time_limit_s: float | None = None
    """Stop after the step that ends past this many wall seconds of this invocation (then
    evaluate and checkpoint as at the last step); None: run all `steps`."""
    allow_test_split: bool = False
    """Let `env.tasks_file` / `env.eval_tasks_file` hold sealed test-split packages
    (etude.tasks.seal; CLI --allow-test-split). The run is then marked contaminated in
    OUT/contamination.json and in its summary."""
    env: EnvConfig = field(default_factory=EnvConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGES:
            raise EtudeError(f"advantage must be one of {', '.join(ADVANTAGES)}, not {self.advantage!r}")
        if self.aggregation not in AGGREGATIONS:
            raise EtudeError(f"aggregation must be one of {', '.join(AGGREGATIONS)}, not {self.aggregation!r}")
        if self.group_size < 2 and self.advantage != "baseline":
            raise EtudeError("group_size 1 has no group to compare with: use advantage = \"baseline\"")
        if min(self.steps, self.prompts_per_step, self.group_size, self.max_new_tokens, self.micro_batch_tokens) < 1:
            raise EtudeError("steps, prompts_per_step, group_size, max_new_tokens, micro_batch_tokens must be ≥ 1")
        if self.max_staleness < 0:
            raise EtudeError("max_staleness must be ≥ 0")
        if self.rollout_backend not in ("hf", "vllm"):
            raise EtudeError(f"rollout_backend must be hf or vllm, not {self.rollout_backend!r}")
        if self.rollout_backend == "vllm" and self.use_ray:
            raise EtudeError("rollout_backend = \"vllm\" samples in-process: set use_ray = false")
        if self.env.rewards:  # a typo fails before any model is loaded
            RewardConfig.from_dict(self.env.rewards, "env.rewards")
        if self.env.harness:  # a wrong key or type fails here, naming the file, not when the env starts
            HarnessConfig.from_table(self.env.harness, "env.harness")
        if self.precision not in ("auto", "fp32", "bf16", "fp8", "mxfp8"):
            raise EtudeError(f"precision must be auto, fp32, bf16, fp8 or mxfp8, not {self.precision!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise EtudeError(f"device must be auto, cpu or cuda, not {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """From a dict shaped like the TOML file (sub-tables for env, loss, lora, ray, parallel)."""
        return build(cls, d, "")


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a TOML config; `overrides` are dotted keys ("loss.kl_coef") applied on top."""
    return load(TrainConfig, path, "train config", overrides=overrides)


def with_rollout_backend(overrides: dict[str, Any], backend: str) -> dict[str, Any]:
    """`overrides` with `rollout_backend = backend`. A vLLM engine samples in this process, not
    on Ray rollout actors, so "vllm" also sets `use_ray = false` unless `overrides` say otherwise."""
    out = {**overrides, "rollout_backend": backend}
    if backend == "vllm":
        out.setdefault("use_ray", False)
    return out
