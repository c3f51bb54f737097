"""Training for specialisation by time: a LoRA adapter on a repository's text at a cut-off.

`train_on_text` packs the documents' tokens (each document then an end-of-text token) into blocks
of `block` tokens, shuffles the blocks with a seed and takes AdamW steps on them with a fresh LoRA
adapter (bf16 autocast on CPU, fp32 adapter weights) until the wall-clock budget is spent or the
epochs are done, saving the adapter at each fraction of the budget in `checkpoints` (the budget
curve costs no second run). A seeded `val_fraction` of the blocks (5%) is kept out of training;
the checkpoint with the lowest loss on them is the one a run ships (`chosen`): early stopping on
the cut-off's own text, so no line written after the cut-off chooses anything. The measures are
etude.evals.codelm's.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.evals.codelm import tokens
from etude.tasks.timesplit import Document
from etude.train.config import LoraConfig
from etude.train.lora import load_trainable, save_adapter

Progress = Callable[[int, int], None]


MIN_TOKENS = 64


def pack_blocks(tok: Any, docs: Sequence[Document], block: int) -> list[list[int]]:
    """The documents' tokens (each then an end-of-text token) in blocks of `block`; a text shorter
    than one block is one block of its own length; fewer than MIN_TOKENS is an EtudeError."""
    eos = tok.eos_token_id
    stream: list[int] = []
    for d in docs:
        stream.extend(tokens(tok, d.text))
        stream.append(eos)
    if len(stream) < MIN_TOKENS:
        raise EtudeError(f"the cut-off's text is {len(stream)} tokens: too little to train on (at least {MIN_TOKENS})")
    if len(stream) < block:
        return [stream]
    return [stream[i:i + block] for i in range(0, len(stream) - block + 1, block)]


def train_on_text(base: str, docs: Sequence[Document], out: Path, *, minutes: float, checkpoints: Sequence[float] = (1.0,),
                  block: int = 512, batch: int = 4, lr: float = 5e-4, epochs: float = 2.0, r: int = 16, alpha: int = 32,
                  seed: int = 0, val_fraction: float = 0.05, progress: Progress | None = None) -> dict[str, Any]:
    """The module doc's training. Writes out/<fraction>/ (peft adapter directories) and returns
    {blocks, val_blocks, tokens, steps, seconds, chosen, checkpoints: [{fraction, dir, steps,
    seconds, train_loss, val_loss}]}. Validation needs at least 20 blocks (else none is kept out and
    the last checkpoint is chosen)."""
    import torch

    torch.manual_seed(seed)
    model, tok = load_trainable(base, LoraConfig(enabled=True, r=r, alpha=alpha), fp32=True)
    blocks = pack_blocks(tok, docs, block)
    random.Random(seed).shuffle(blocks)
    n_val = max(2, round(val_fraction * len(blocks))) if val_fraction > 0 and len(blocks) >= 20 else 0
    val, blocks = blocks[:n_val], blocks[n_val:]

    def val_loss() -> float | None:
        if not val:
            return None
        model.eval()
        total = 0.0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for k in range(0, len(val), batch):
                ids = torch.tensor(val[k:k + batch])
                total += model(input_ids=ids, labels=ids, use_cache=False).loss.item() * len(ids)
        model.train()
        return total / len(val)

    total_steps = max(1, math.ceil(epochs * len(blocks) / batch))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    warm = min(10, total_steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
    model.train()
    marks = sorted(set(checkpoints))
    saved: list[dict[str, Any]] = []
    losses: list[float] = []
    t0 = time.monotonic()
    budget = minutes * 60
    step = 0
    paused = 0.0  # seconds spent on validation, not counted against the training budget
    while step < total_steps:
        i = (step * batch) % len(blocks)
        ids = torch.tensor([blocks[(i + j) % len(blocks)] for j in range(batch)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        elapsed = time.monotonic() - t0 - paused
        if progress:
            progress(min(step, total_steps), total_steps)
        done = step >= total_steps or elapsed >= budget
        while marks and (elapsed >= marks[0] * budget or done):
            f = marks.pop(0)
            d = save_adapter(model, tok, out / f"{f:g}", base=base)
            tail = losses[-max(1, len(losses) // 5):]
            v0 = time.monotonic()
            vl = val_loss()
            paused += time.monotonic() - v0
            saved.append({"fraction": f, "dir": str(d), "steps": step, "seconds": round(elapsed, 1),
                          "train_loss": sum(tail) / len(tail), "val_loss": vl})
        if done:
            break
    scored = [c for c in saved if c["val_loss"] is not None]
    chosen = min(scored, key=lambda c: c["val_loss"])["fraction"] if scored else saved[-1]["fraction"]
    return {"blocks": len(blocks), "val_blocks": len(val), "tokens": len(blocks) * block, "block": block,
            "batch": batch, "lr": lr, "steps": step, "planned_steps": total_steps,
            "seconds": round(time.monotonic() - t0, 1), "chosen": chosen, "checkpoints": saved}


