"""Policy-gradient losses: group-relative advantages, a group-free baseline, PPO clipping,
truncated importance sampling against behaviour log-probs, sequence rejection, KL to a reference.

All per-token quantities are 1-D tensors over one sample's completion tokens
(`[num_completion_tokens]`). Aggregation weights (`token_weights`) are computed once over the
whole optimizer batch, so splitting the batch into micro-batches for gradient accumulation
gives the same gradient as one big batch (tested). What this does not do: value-function
baselines (the running mean per task family is the group-free baseline), or entropy bonuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

ADVANTAGES = ("grpo", "dr_grpo", "baseline")
AGGREGATIONS = ("token_mean", "seq_mean", "constant")


def group_advantages(rewards: Sequence[float], groups: Sequence[int], *, scale: bool = True,
                     eps: float = 1e-6) -> list[float]:
    """Advantage of each sample relative to the others of its group (same prompt).

    scale=True is GRPO, (r - mean) / (std + eps); scale=False is the length-unbiased Dr. GRPO
    variant, r - mean (use it with `aggregation = "constant"`). A group of one gets 0.
    """
    r = torch.tensor(rewards, dtype=torch.float64)
    g = torch.tensor(groups)
    adv = torch.zeros_like(r)
    for gid in torch.unique(g):
        idx = g == gid
        if idx.sum() < 2:
            continue
        x = r[idx]
        centred = x - x.mean()
        adv[idx] = centred / (x.std(unbiased=False) + eps) if scale else centred
    return adv.tolist()


@dataclass
class RunningBaseline:
    """Group-free baseline for production data (one response per prompt): an exponential running
    mean of reward per task family. The advantage uses the mean *before* this reward is added."""

    decay: float = 0.9
    means: dict[str, float] = field(default_factory=dict)

    def advantages(self, rewards: Sequence[float], families: Sequence[str]) -> list[float]:
        out = []
        for r, fam in zip(rewards, families, strict=True):
            base = self.means.get(fam)
            out.append(0.0 if base is None else r - base)
            self.means[fam] = r if base is None else self.decay * base + (1 - self.decay) * r
        return out


def token_weights(lengths: Sequence[int], aggregation: str, *, constant_len: int = 1024) -> list[float]:
    """The weight of each token of each sample in the batch loss (one float per sample,
    applied to all its tokens). Computed over the full optimizer batch.

    token_mean: every token counts the same (1 / total tokens);
    seq_mean:   every sample counts the same (1 / (num_samples · its length)), original GRPO;
    constant:   1 / (num_samples · constant_len), Dr. GRPO: no length bias at all.
    """
    n = max(1, len(lengths))
    if aggregation == "token_mean":
        total = max(1, sum(lengths))
        return [1.0 / total] * len(lengths)
    if aggregation == "seq_mean":
        return [1.0 / (n * max(1, ln)) for ln in lengths]
    if aggregation == "constant":
        return [1.0 / (n * constant_len)] * len(lengths)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {aggregation!r}")


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    """PPO ratio clip below: ratio ≥ 1 - clip_low counts."""
    clip_high: float = 0.28
    """PPO ratio clip above (asymmetric, as in DAPO's clip-higher)."""
    is_cap: float = 2.0
    """Truncated importance sampling: the weight π_trainer / π_behaviour is capped at this."""
    reject_ratio: float | None = None
    """Sequence-level rejection: drop a sample whose geometric-mean ratio π_trainer / π_behaviour
    lies outside [1/reject_ratio, reject_ratio]. None: never drop."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference policy; 0 skips the reference entirely."""


@dataclass
class TokenLoss:
    """One sample's loss (already weighted) and the statistics the metrics report."""

    loss: torch.Tensor  # scalar, carries the gradient
    is_ratio: torch.Tensor  # [T] π_prox / π_behaviour before truncation
    truncated: torch.Tensor  # [T] bool, weight hit the cap
    clipped: torch.Tensor  # [T] bool, PPO clip active
    kl: torch.Tensor  # [T] k3 estimate (zeros when no reference)
    rejected: bool


def sample_loss(logp: torch.Tensor, prox_logp: torch.Tensor, behav_logp: torch.Tensor, advantage: float,
                weight: float, cfg: LossConfig, ref_logp: torch.Tensor | None = None) -> TokenLoss:
    """Decoupled PPO-clip loss of one sample with truncated importance sampling.

    logp: current trainer log-probs (with grad); prox_logp: the trainer's log-probs at the start
    of this update (detached; equal to logp's value when there is one update per batch);
    behav_logp: log-probs logged at sampling time (possibly stale, possibly top-p renormalised).
    """
    prox = prox_logp.detach()
    log_is = prox - behav_logp
    is_ratio = torch.exp(log_is)
    is_w = torch.clamp(is_ratio, max=cfg.is_cap)
    rejected = False
    if cfg.reject_ratio is not None and len(log_is):
        g = float(torch.exp(log_is.mean()))
        rejected = not (1.0 / cfg.reject_ratio <= g <= cfg.reject_ratio)
    ratio = torch.exp(logp - prox)
    surr = torch.minimum(ratio * advantage, torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * advantage)
    per_tok = -is_w * surr
    kl = torch.zeros_like(logp)
    if ref_logp is not None and cfg.kl_coef > 0:
        d = ref_logp.detach() - logp
        kl = torch.exp(d) - d - 1
        per_tok = per_tok + cfg.kl_coef * kl
    loss = per_tok.sum() * (0.0 if rejected else weight)
    clipped = (ratio.detach() * advantage) != surr.detach()
    return TokenLoss(loss, is_ratio.detach(), is_ratio.detach() > cfg.is_cap, clipped, kl.detach(), rejected)
