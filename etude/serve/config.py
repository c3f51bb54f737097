"""`ServeConfig`: every knob of `etude serve`, loadable from a TOML file's `[serve]` table.

Unknown keys are an error, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etude.configfile import build, load


@dataclass
class ServeConfig:
    model: str = "tiny"
    """checkpoint to serve: "tiny", "smollm2" or a model directory; registered (shared) if new,
    and made production when no production checkpoint exists yet."""
    name: str | None = None
    """registry name for `model` (default: "tiny"/"smollm2", or the directory's basename)."""
    version: int = 0
    """policy version recorded for `model` when it is registered here."""
    db: str | None = None
    """store URL (default $ETUDE_DB, then sqlite:///<ETUDE_HOME>/etude.db)."""
    host: str = "127.0.0.1"
    port: int = 8000
    max_request_bytes: int = 1_000_000
    """bodies above this get 413 before they are parsed."""
    max_messages: int = 512
    """conversations longer than this get 400."""
    max_tokens_limit: int = 2048
    """the largest `max_tokens` a client may ask for (400 above it)."""
    default_max_tokens: int = 256
    """`max_tokens` when the request gives none."""
    default_temperature: float = 0.7
    default_top_p: float = 1.0
    max_batch: int = 16
    """backend "hf": requests generated together in one batch, at most. The vllm backend has no
    such cap: each request goes to the engine as it arrives and vLLM batches continuously (up to
    its own max_num_seqs), see etude.policy.batcher.EngineQueue."""
    batch_wait_ms: float = 5.0
    """the batcher keeps collecting while requests arrive less than this apart..."""
    batch_max_wait_ms: float = 50.0
    """...but for no longer than this after the first one."""
    max_queue: int = 256
    """requests waiting for one checkpoint's batcher (vllm backend: in flight on its engine), at
    most; more get 429 (retry later)."""
    max_loaded: int = 3
    """checkpoints kept in memory at once (least recently used is unloaded)."""
    classify_followups: bool = True
    """label the next user message of a session with etude.feedback.signals' rules and store a
    `followup` feedback event on the previous interaction."""
    followup_model: str | None = None
    """also label follow-ups the rules call neutral with the embedding model of
    etude.feedback.followup_model ("minilm", or any etude.search embedder spec); None: rules only."""
    torch_threads: int | None = None
    """torch intra-op threads for generation (None: torch's default, one per core). On a shared
    machine 1 is often several times faster: measured 0.8 s vs 10.8 s for a batch of 4 with the
    tiny model on 2 busy cores (torch's threads spin against the other processes)."""
    preload: bool = True
    """load the production checkpoint at start-up, so /health answers only once it can serve."""
    precision: str = "fp32"
    """weights and matmuls of the hf backend: "fp32", "bf16" (bf16 weights), "fp8" (torchao FP8
    row-wise, CUDA compute capability ≥ 8.9) or "mxfp8" (torchao MXFP8, ≥ 10.0); fp8/mxfp8 are
    refused with one line (exit 2) where the hardware or torchao is missing (etude.scale.lowp).
    The vllm backend takes `vllm_dtype` instead."""
    backend: str = "hf"
    """engine for local checkpoints: "hf" (transformers, LocalPolicy) or "vllm" (one vLLM engine
    per base model; LoRA adapter checkpoints, e.g. an org's, are served by their base's engine
    under their own name). "vllm" needs the vLLM environment (`make setup-vllm`, .venv-vllm)."""
    vllm_dtype: str = "auto"
    """backend = "vllm": the engines' dtype ("auto" = the checkpoint's, "bfloat16", "float32")."""
    vllm_max_lora_rank: int = 16
    """backend = "vllm": the largest LoRA rank an adapter checkpoint may have."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServeConfig:
        return build(cls, d, "serve")

    @classmethod
    def from_toml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> ServeConfig:
        """From a TOML file: its `[serve]` table if present, else the top level."""
        return load(cls, path, "serve config", table="serve", overrides=overrides)

    def checkpoint_name(self) -> str:
        if self.name:
            return self.name
        p = Path(self.model)
        return p.name if p.exists() else self.model
