"""The model side of specialisation by time: a LoRA adapter trained on a repository's text at a
cut-off (causal language modelling), and the measures on lines written after it.

`train_on_text` packs the documents' tokens (each document then an end-of-text token) into blocks
of `block` tokens, shuffles the blocks with a seed and takes AdamW steps on them with a fresh LoRA
adapter (bf16 autocast on CPU, fp32 adapter weights) until the wall-clock budget is spent or the
epochs are done, saving the adapter at each fraction of the budget in `checkpoints` (the budget
curve costs no second run).

`score_items` measures one model on held-out lines with one teacher-forced forward pass per line
(context truncated on the left to `ctx_tokens`, the line and its newline tokenised on their own and
appended). Per line:
- `nll` (nats per token of the line and its newline) and `token_acc` (share of its tokens that
  are the argmax given the true prefix);
- `line_em`: every token is the argmax, i.e. greedy decoding writes exactly this line and ends it
  (a greedy decoder's output equals the reference tokens exactly when each reference token is the
  argmax after the reference prefix; a different tokenisation of the same text counts as a miss);
- `rest_em`: the second half of the line's tokens, given the first half;
- `ident_em`: the line's first identifier that is not a Python keyword, given what precedes it;
- `repo_em` (adherence, where the line uses a name the repository defined at the cut-off): every
  such name is predicted, i.e. the model calls the repository's own function or class where the
  maintainers did. None for a line without one.
"""

from __future__ import annotations

import keyword
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from etude.pipeline.timesplit import IDENT_RE, Document, Item

Progress = Callable[[int, int], None]


def _tokens(tok: Any, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def pack_blocks(tok: Any, docs: Sequence[Document], block: int) -> list[list[int]]:
    eos = tok.eos_token_id
    stream: list[int] = []
    for d in docs:
        stream.extend(_tokens(tok, d.text))
        stream.append(eos)
    return [stream[i:i + block] for i in range(0, len(stream) - block + 1, block)]


def train_on_text(base: str, docs: Sequence[Document], out: Path, *, minutes: float, checkpoints: Sequence[float] = (1.0,),
                  block: int = 512, batch: int = 4, lr: float = 5e-4, epochs: float = 2.0, r: int = 16, alpha: int = 32,
                  seed: int = 0, progress: Progress | None = None) -> dict[str, Any]:
    """The module doc's training. Writes out/<fraction>/ (peft adapter directories) and returns
    {blocks, tokens, steps, seconds, checkpoints: [{fraction, dir, steps, seconds, train_loss}]}."""
    import torch

    from etude.train.config import LoraConfig
    from etude.train.lora import load_trainable, save_adapter

    torch.manual_seed(seed)
    model, tok = load_trainable(base, LoraConfig(enabled=True, r=r, alpha=alpha), fp32=True)
    blocks = pack_blocks(tok, docs, block)
    if not blocks:
        raise ValueError(f"the training text holds fewer than {block} tokens")
    random.Random(seed).shuffle(blocks)
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
        elapsed = time.monotonic() - t0
        if progress:
            progress(min(step, total_steps), total_steps)
        done = step >= total_steps or elapsed >= budget
        while marks and (elapsed >= marks[0] * budget or done):
            f = marks.pop(0)
            d = save_adapter(model, tok, out / f"{f:g}", base=base)
            tail = losses[-max(1, len(losses) // 5):]
            saved.append({"fraction": f, "dir": str(d), "steps": step, "seconds": round(elapsed, 1),
                          "train_loss": sum(tail) / len(tail)})
        if done:
            break
    return {"blocks": len(blocks), "tokens": len(blocks) * block, "block": block, "batch": batch, "lr": lr,
            "steps": step, "planned_steps": total_steps, "seconds": round(time.monotonic() - t0, 1),
            "checkpoints": saved}


def load_scorer(base: str, adapter: str | None = None) -> tuple[Any, Any]:
    """The base model (bf16, eval mode), with `adapter` (a peft directory) on it when given."""
    import torch

    from etude.policy.models import load_model

    model, tok = load_model(base, dtype=torch.bfloat16)
    if adapter:
        import peft

        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    return model, tok


def _ident_spans(line: str, names: frozenset[str] | None = None) -> list[tuple[int, int, str]]:
    out = []
    for m in IDENT_RE.finditer(line):
        w = m.group(0)
        if keyword.iskeyword(w) or len(w) < 2:
            continue
        if names is None or w in names:
            out.append((m.start(), m.end(), w))
    return out


def _covering(offsets: Sequence[tuple[int, int]], start: int, end: int) -> list[int]:
    return [k for k, (a, b) in enumerate(offsets) if a < end and b > start]


def prepare(tok: Any, item: Item, ctx_tokens: int, names: frozenset[str]) -> dict[str, Any]:
    ctx = _tokens(tok, item.context)[-ctx_tokens:] if item.context else []
    if not ctx:
        ctx = [tok.eos_token_id]  # a line at the top of a file is predicted after a document boundary
    enc = tok(item.line + "\n", add_special_tokens=False, return_offsets_mapping=True)
    tgt, offs = enc["input_ids"], [tuple(o) for o in enc["offset_mapping"]]
    first = _ident_spans(item.line)[:1]
    ident = _covering(offs, first[0][0], first[0][1]) if first else []
    repo = sorted({k for a, b, _ in _ident_spans(item.line, names) for k in _covering(offs, a, b)})
    return {"ids": ctx + tgt, "n_ctx": len(ctx), "n_tgt": len(tgt), "ident": ident, "repo": repo,
            "repo_names": [w for _, _, w in _ident_spans(item.line, names)]}


def score_items(model: Any, tok: Any, items: Sequence[Item], *, names: frozenset[str] = frozenset(),
                ctx_tokens: int = 256, batch: int = 8, progress: Progress | None = None) -> list[dict[str, Any]]:
    """One row per item (the module doc's measures), in the items' order."""
    import torch

    prepared = [prepare(tok, it, ctx_tokens, names) for it in items]
    order = sorted(range(len(items)), key=lambda i: len(prepared[i]["ids"]))  # similar lengths batch well
    rows: list[dict[str, Any] | None] = [None] * len(items)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    done = 0
    with torch.no_grad():
        for s in range(0, len(order), batch):
            idx = order[s:s + batch]
            width = max(len(prepared[i]["ids"]) for i in idx)
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros((len(idx), width), dtype=torch.long)
            for r, i in enumerate(idx):
                seq = prepared[i]["ids"]
                ids[r, :len(seq)] = torch.tensor(seq)
                mask[r, :len(seq)] = 1
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for r, i in enumerate(idx):
                p = prepared[i]
                a, n = p["n_ctx"], p["n_tgt"]
                tgt = ids[r, a:a + n]
                lp = logp[r, a - 1:a - 1 + n]
                nll = -lp.gather(1, tgt[:, None])[:, 0]
                right = (lp.argmax(-1) == tgt).tolist()
                half = n // 2
                rows[i] = {
                    "nll": float(nll.mean()), "nll_sum": float(nll.sum()), "ntok": n,
                    "token_acc": sum(right) / n, "line_em": int(all(right)), "rest_em": int(all(right[half:])),
                    "ident_em": int(all(right[k] for k in p["ident"])) if p["ident"] else None,
                    "repo_em": int(all(right[k] for k in p["repo"])) if p["repo"] else None,
                    "repo_names": p["repo_names"],
                }
            done += len(idx)
            if progress:
                progress(done, len(items))
    return [r for r in rows if r is not None]
