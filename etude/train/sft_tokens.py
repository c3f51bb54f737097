"""SFT's token side: trajectories rendered into token sequences by the one renderer that serving
and RL use (`etude.policy.local.encode_conversation`), with the loss on assistant tokens only;
sources mixed by weight; sequences packed into rows (first-fit decreasing, block-diagonal mask,
restarting positions) and the summed cross-entropy of one row."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from etude.errors import EtudeError
from etude.policy.local import completion_ids, encode_conversation
from etude.train.packing import first_fit_decreasing
from etude.types import Message


@dataclass
class Sequence_:
    ids: list[int]
    labels: list[int]  # -100 where no loss
    source: str = "expert"

    @property
    def loss_tokens(self) -> int:
        return sum(1 for x in self.labels if x != -100)


def conversation_sequences(tokenizer: Any, messages: Sequence[Message], source: str = "expert",
                           untrained: Collection[int] = ()) -> list[Sequence_]:
    """Token sequences of a conversation with the loss on each assistant turn, except the turns
    numbered (0-based, assistant turns only) in `untrained` (an expert's deliberate wrong fix).
    Each turn's prompt is `encode_conversation(messages[:k])` — what the harness sends at that
    turn — and its target `completion_ids(messages[k])`; a turn whose prompt starts with the
    running sequence extends it, any other starts a new sequence (so the result is exact either
    way)."""
    out: list[Sequence_] = []
    cur: Sequence_ | None = None
    turn = -1
    for k, m in enumerate(messages):
        if m.role != "assistant":
            continue
        turn += 1
        prompt = encode_conversation(tokenizer, messages[:k])
        comp = completion_ids(tokenizer, m)
        target = [-100] * len(comp) if turn in untrained else comp
        if cur is not None and prompt[: len(cur.ids)] == cur.ids:
            extra = prompt[len(cur.ids):]
            cur.ids += extra + comp
            cur.labels += [-100] * len(extra) + target
        else:
            cur = Sequence_(list(prompt) + comp, [-100] * len(prompt) + target, source)
            out.append(cur)
    return out


def sample_sequences(samples: Sequence[tuple[list[int], list[int]]], source: str = "production") -> list[Sequence_]:
    """Single-turn sequences of (prompt ids, completion ids), the loss on the completion."""
    return [Sequence_(p + c, [-100] * len(p) + c, source) for p, c in samples]


def mix(pools: dict[str, list[Sequence_]], weights: dict[str, float], epochs: float, seed: int) -> list[Sequence_]:
    """One shuffled training order: each source contributes in proportion to its weight, relative
    to the expert pool's size (or the largest pool when there is no expert), times `epochs`."""
    rng = random.Random(seed)
    live = {s: p for s, p in pools.items() if p and weights.get(s, 0) > 0}
    if not live:
        raise EtudeError("no usable SFT trajectories: every enabled source came back empty")
    base = len(live.get("expert") or max(live.values(), key=len))
    total_w = sum(weights[s] for s in live)
    order: list[Sequence_] = []
    for s, pool in live.items():
        want = int(round(epochs * base * len(live) * weights[s] / total_w))
        order += [pool[i % len(pool)] for i in range(want)]
    rng.shuffle(order)
    return order


def pack_rows(seqs: Sequence[Sequence_], budget: int) -> list[list[int]]:
    """Indices grouped into rows of ≤ `budget` tokens (first-fit decreasing)."""
    return first_fit_decreasing([(len(s.ids), [i]) for i, s in enumerate(seqs)], budget)


def row_loss(model: Any, seqs: Sequence[Sequence_]) -> tuple[Any, int]:
    """Summed cross-entropy over the label tokens of one packed row, and how many there are."""
    dev = next(model.parameters()).device
    ids, pos, grp, labels = [], [], [], []
    for g, s in enumerate(seqs):
        ids += s.ids
        pos += list(range(len(s.ids)))
        grp += [g] * len(s.ids)
        labels += s.labels[1:] + [-100]  # the label at position t is the token at t + 1
    keep = [i for i, y in enumerate(labels) if y != -100]
    if not keep:
        return torch.zeros((), device=dev), 0
    kw: dict[str, Any] = {}
    if len(seqs) > 1:
        L = len(ids)
        g = torch.tensor(grp, device=dev)
        mask = torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev)) & (g[:, None] == g[None, :])
        kw["attention_mask"] = mask[None, None]
    logits = model(input_ids=torch.tensor([ids], device=dev), position_ids=torch.tensor([pos], device=dev),
                   logits_to_keep=torch.tensor(keep, device=dev), use_cache=False, **kw).logits[0]
    target = torch.tensor([labels[i] for i in keep], device=dev)
    loss = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")
    return loss, len(keep)
