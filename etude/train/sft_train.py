"""The SFT trainer: the model the RL learner would build (etude.train.lora.load_trainable), its
precision context (etude.scale.lowp.autocast_for), schedule and optimiser step (etude.train.optim),
checkpoints in etude.train.checkpoint's layout, and the export of etude.train.lora."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from etude.errors import EtudeError
from etude.scale.lowp import autocast_for
from etude.train import optim
from etude.train.checkpoint import ckpt_root, latest_checkpoint, load_checkpoint, save_checkpoint
from etude.train.lora import enable_checkpointing, load_trainable, merge_and_save, save_adapter
from etude.train.sft_config import SFTConfig
from etude.train.sft_tokens import Sequence_, pack_rows, row_loss


def lr_at(cfg: SFTConfig, step: int, total: int) -> float:
    """The learning rate of step `step` (from 0) of `total`: linear warm-up over
    `cfg.warmup_steps`, then cosine decay from `cfg.lr` to a tenth of it."""
    return optim.lr_at(step, cfg.lr, cfg.warmup_steps, total)


class SFTTrainer:
    """The SFT trainer: `cfg.model` (fp32 weights, on the GPU when there is one; a LoRA adapter
    when `cfg.lora.enabled`) and AdamW over its trainable parameters. `step(batch, lr)` takes one
    optimiser step on a batch of `Sequence_` (rows packed to `cfg.row_tokens` when set, under bf16
    autocast when `cfg.precision` says so); `save`/`restore` checkpoint in etude.train.checkpoint's
    layout; `export` writes the final model. `run_sft` drives it; bench/gpu_sft.py too."""

    def __init__(self, cfg: SFTConfig, out: Path):
        self.cfg, self.out = cfg, out
        torch.manual_seed(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # a GPU when there is one (the trained weights stay fp32, the adapter made beside them)
        device = "cuda" if torch.cuda.is_available() else None
        try:
            self.model, self.tokenizer = load_trainable(cfg.model, cfg.lora, fp32=True, device=device)
        except EtudeError:
            raise
        except Exception as e:  # noqa: BLE001 - a path that is not a model is the operator's error
            raise EtudeError(f"cannot load model {cfg.model!r}: {type(e).__name__}: {e}") from None
        if cfg.gradient_checkpointing:
            enable_checkpointing(self.model)  # the forward passes of training ask for no KV cache
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = optim.adamw(self.params, cfg.lr, cfg.weight_decay)
        self.updates, self.dist = 0, None  # what etude.train.checkpoint reads of a learner

    def autocast(self) -> Any:
        return autocast_for(self.cfg.precision, next(self.model.parameters()).device)

    def step(self, batch: Sequence[Sequence_], lr: float) -> dict[str, float]:
        n_tok = sum(s.loss_tokens for s in batch)
        total = 0.0
        rows = pack_rows(batch, self.cfg.row_tokens) if self.cfg.row_tokens else [[i] for i in range(len(batch))]
        for row in rows:
            with self.autocast():
                loss, n = row_loss(self.model, [batch[i] for i in row])
            if n:
                (loss / max(1, n_tok)).backward()
                total += float(loss.detach())
        norm = optim.optimizer_step(self.opt, self.params, lr, self.cfg.max_grad_norm)
        self.opt.zero_grad(set_to_none=True)  # NOTE: gradients held to the next step would be copied by export
        return {"loss": total / max(1, n_tok), "grad_norm": norm, "tokens": float(sum(len(s.ids) for s in batch)),
                "loss_tokens": float(n_tok), "lr": lr}

    # -- checkpoints: the layout of etude.train.checkpoint (safetensors weights, optimizer and RNG,
    # state.json, written atomically, `latest` a file naming the step)

    def save(self, step: int, state: dict[str, Any]) -> Path:
        self.updates = step
        return save_checkpoint(self.out, self, {**state, "step": step}, keep=self.cfg.keep_checkpoints)

    def restore(self) -> dict[str, Any] | None:
        latest = ckpt_root(self.out) / "latest"
        if latest.is_symlink():  # written before the shared layout (optimizer.pt); not read any more
            raise EtudeError(f"{self.out} holds an SFT checkpoint of an older etude (pickled optimizer); "
                             "rerun with a new --out, or delete its checkpoints/ to start over")
        path = latest_checkpoint(self.out)
        return load_checkpoint(path, self) if path is not None else None

    def export(self) -> Path:
        """OUT/final: a plain model directory (LoRA merged) that every command loads; a LoRA run
        also writes the adapter alone to OUT/adapter (its base recorded in adapter_config.json)."""
        if self.cfg.lora.enabled:
            save_adapter(self.model, self.tokenizer, self.out / "adapter", base=self.cfg.model)
        return merge_and_save(self.model, self.tokenizer, self.out / "final")
