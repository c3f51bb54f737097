"""The optimiser mechanics that the RL learner and the SFT trainer share: AdamW over the trainable
parameters, the learning-rate schedule, and one optimiser step (clip, set the rate, step)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


def adamw(params: Sequence[torch.Tensor], lr: float, weight_decay: float, *, per_param: bool = False) -> Any:
    """AdamW, fused (one kernel over all parameters) on CPU and CUDA, the for-each loop elsewhere;
    `per_param`: one parameter at a time (parameters on several device meshes)."""
    fused = bool(params) and params[0].device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=False if per_param else (fused or None),
                             foreach=False if per_param else None)


def lr_at(step: int, lr: float, warmup_steps: int, total: int | None = None) -> float:
    """The learning rate of step `step` (from 0): linear warm-up to `lr` over `warmup_steps`, then
    constant (`total` None: RL, whose length is open) or cosine decay to a tenth of `lr` at step
    `total` (SFT)."""
    if total is None:
        return lr if warmup_steps <= 0 else lr * min(1.0, (step + 1) / warmup_steps)
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    frac = (step - warmup_steps) / max(1, total - warmup_steps)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def optimizer_step(opt: Any, params: Sequence[torch.Tensor], lr: float, max_grad_norm: float,
                   clip: Callable[[], float] | None = None) -> float:
    """Clip the accumulated gradients to `max_grad_norm` (`clip`: a sharded model's own clipping),
    take one step at `lr`; returns the gradient norm before clipping. The gradients stay (a check
    may compare them): clear them before the next batch's backward."""
    norm = clip() if clip is not None else float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    for g in opt.param_groups:
        g["lr"] = lr
    opt.step()
    return norm
