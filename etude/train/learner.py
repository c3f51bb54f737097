"""The learner: per-token log-probs on packed sequences, the policy loss, gradient accumulation,
clipping, and the optimizer step. Full fine-tune or LoRA (peft).

Packing: samples (prompt + completion) are concatenated into rows of at most
`micro_batch_tokens` tokens (first-fit decreasing), with position ids restarting per sample
and a block-diagonal causal mask, so no compute goes into padding and no sample sees another.
One optimizer step consumes a whole batch; micro-batches only split the work (the loss weights
are fixed over the full batch, so the gradient does not depend on the split).

Not guaranteed: a single sample longer than `micro_batch_tokens` gets a row of its own (it is
never cut); attention over a packed row is computed densely with a mask (no varlen kernels on
CPU), so a row costs O(row²) attention regardless of how it is split into samples.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from etude.errors import EtudeError
from etude.scale.lowp import apply_training_precision, check_precision
from etude.scale.lowp import autocast_for as _autocast
from etude.scale.moe import is_moe, replay_packed
from etude.train.config import TrainConfig
from etude.train.distributed import (
    clip_grad_norm,
    full_state_dict,
    gather_objects,
    max_over_ranks,
    shard_model,
    single_mesh,
    split_groups,
)
from etude.train.lora import enable_checkpointing, load_trainable
from etude.train.losses import LossConfig, sample_loss
from etude.train.optim import adamw, lr_at, optimizer_step
from etude.train.packing import first_fit_decreasing


@dataclass
class Sample:
    prompt_ids: list[int]  # [P]
    completion_ids: list[int]  # [T]
    behav_logprobs: list[float]  # [T], logged at sampling time
    advantage: float
    weight: float = 1.0  # aggregation weight of each token (see losses.token_weights)
    routes: Any = None  # MoE only: etude.scale.moe.Routes recorded at sampling, replayed in training
    pad: bool = False  # a zero-weight filler (distributed: every rank runs as many rows); not in the stats

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def _chains(samples: Sequence[Sample]) -> list[list[int]]:
    """Runs of consecutive samples where each one's prompt starts with the previous one's prompt
    and completion: the turns of one multi-turn episode, in order (turn k+1's prompt is turn k's
    conversation plus the reply and the tools' output). A lone sample is a run of one."""
    runs: list[list[int]] = []
    for i, s in enumerate(samples):
        if runs:
            prev = samples[runs[-1][-1]]
            n = len(prev.prompt_ids)
            if (len(s.prompt_ids) >= prev.length and s.prompt_ids[:n] == prev.prompt_ids
                    and s.prompt_ids[n:prev.length] == prev.completion_ids):
                runs[-1].append(i)
                continue
        runs.append([i])
    return runs


def _units(samples: Sequence[Sample], share_prefix: bool) -> list[list[int]]:
    """The layout units of a batch. With sharing: a multi-turn episode (a chain, `_chains`) is one
    unit laid out as its last turn's sequence; other samples with the same prompt (a GRPO group's
    single-turn answers) form one unit sharing that prompt. Without: one unit per sample."""
    if not share_prefix:
        return [[i] for i in range(len(samples))]
    units: list[list[int]] = []
    groups: dict[tuple[int, ...], list[int]] = {}
    for run in _chains(samples):
        if len(run) > 1:
            units.append(run)
        else:
            groups.setdefault(tuple(samples[run[0]].prompt_ids), []).append(run[0])
    return units + list(groups.values())


def _is_chain(samples: Sequence[Sample], unit: list[int]) -> bool:
    return len(unit) > 1 and len(samples[unit[1]].prompt_ids) >= samples[unit[0]].length


def pack(samples: Sequence[Sample], budget: int, *, share_prefix: bool = False) -> list[list[int]]:
    """Indices of samples grouped into rows of ≤ `budget` tokens (first-fit decreasing).

    share_prefix: the units of `_units` — a multi-turn episode costs its last turn's length (every
    earlier turn is a prefix of it); samples with the same prompt cost the prompt once plus every
    completion, and a group over budget is split into chunks that each repeat the prompt. A unit
    that alone exceeds the budget gets a row of its own."""
    units: list[tuple[int, list[int]]] = []  # (cost, sample indices)
    for members in _units(samples, share_prefix):
        if not share_prefix:
            units.append((samples[members[0]].length, members))
        elif _is_chain(samples, members):
            units.append((samples[members[-1]].length, members))
        else:
            prompt = samples[members[0]].prompt_ids
            chunk, cost = [], len(prompt)
            for i in members:
                c = len(samples[i].completion_ids)
                if chunk and cost + c > budget:
                    units.append((cost, chunk))
                    chunk, cost = [], len(prompt)
                chunk.append(i)
                cost += c
            units.append((cost, chunk))
    return first_fit_decreasing(units, budget)


def _layout(samples: Sequence[Sample], share_prefix: bool) -> tuple[list[int], list[int], list[int], list[int],
                                                                     list[int], list[int]]:
    """One packed row: token ids, position ids, group and branch ids per token (branch -1 for a
    shared prompt), the positions whose logits predict completion tokens, and those targets.

    Without sharing every sample is its own group (prompt + completion, block-diagonal). With
    sharing, samples of one prompt become a tree: the prompt once, then each completion as a
    branch that sees the prompt and its own earlier tokens only, with positions continuing from
    the prompt, so every completion token is predicted from exactly the context it was sampled in.
    The turns of a multi-turn episode (a chain) are one causal sequence, the last turn's prompt
    and completion: each earlier turn's completion sits inside it at its own offset and sees
    exactly the conversation it was sampled after (one forward instead of one per turn).
    """
    ids, pos, grp, br, keep = [], [], [], [], []
    targets: list[int] = []
    where: dict[int, list[int]] = {}
    for g, members in enumerate(_units(samples, share_prefix)):
        p0 = len(ids)
        if share_prefix and _is_chain(samples, members):
            last = samples[members[-1]]
            seq = last.prompt_ids + last.completion_ids
            ids += seq
            pos += list(range(len(seq)))
            grp += [g] * len(seq)
            br += [-1] * len(seq)
            for i in members:
                P, T = len(samples[i].prompt_ids), len(samples[i].completion_ids)
                where[i] = list(range(p0 + P - 1, p0 + P + T - 1))
            continue
        prompt = samples[members[0]].prompt_ids  # unshared: every group is one sample
        ids += prompt
        pos += list(range(len(prompt)))
        grp += [g] * len(prompt)
        br += [-1] * len(prompt)
        for i in members:
            s = samples[i]
            c0, P = len(ids), len(s.prompt_ids)
            ids += s.completion_ids
            pos += list(range(P, P + len(s.completion_ids)))
            grp += [g] * len(s.completion_ids)
            br += [i] * len(s.completion_ids)
            where[i] = [p0 + P - 1] + list(range(c0, c0 + len(s.completion_ids) - 1))
    for i, s in enumerate(samples):  # predictions in sample order, so the split below lines up
        keep += where[i]
        targets += s.completion_ids
    return ids, pos, grp, br, keep, targets


def packed_logprobs(model: Any, samples: Sequence[Sample], temperature: float,
                    moe_stats: dict[str, list[float]] | None = None, *, share_prefix: bool = False) -> list[torch.Tensor]:
    """Log-probs of each sample's completion tokens at `temperature`, from one packed forward.
    share_prefix: samples with identical prompts share one copy of it (see `_layout`); same
    log-probs up to float rounding, fewer tokens. For an MoE model the sampling-time routes are
    replayed (etude.scale.moe), which needs the unshared layout, and the router's load-balancing
    loss is appended to `moe_stats`."""
    dev = next(model.parameters()).device
    share_prefix = share_prefix and not is_moe(model)
    ids, pos, grp, br, keep, targets = _layout(samples, share_prefix)
    L = len(ids)
    grp_t, br_t = torch.tensor(grp, device=dev), torch.tensor(br, device=dev)
    mask = None
    # NOTE: one group without branches (a lone sample, one episode's chain) is plain causal: no
    # mask lets attention use the fused kernel
    if len(set(grp)) > 1 or len({b for b in br if b >= 0}) > 1:
        mask = (torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev)) & (grp_t[:, None] == grp_t[None, :])
                & ((br_t[None, :] == -1) | (br_t[:, None] == br_t[None, :])))[None, None]
    # NOTE: logits_to_keep with index tensor: the vocabulary projection (most of a small model's
    # cost) runs only on the positions whose next token is a completion token.
    with _routing(model, samples, moe_stats):
        logits = model(input_ids=torch.tensor([ids], device=dev), position_ids=torch.tensor([pos], device=dev),
                       attention_mask=mask, logits_to_keep=torch.tensor(keep, device=dev), use_cache=False).logits[0]
    logits = logits.float() if temperature == 1.0 else logits.float() / max(temperature, 1e-6)
    logp = torch.log_softmax(logits, -1)
    chosen = logp.gather(-1, torch.tensor(targets, device=dev)[:, None]).squeeze(-1)
    return list(torch.split(chosen, [len(s.completion_ids) for s in samples]))


def _routing(model: Any, samples: Sequence[Sample], stats: Any) -> contextlib.AbstractContextManager:
    if not is_moe(model):
        return contextlib.nullcontext()
    return replay_packed(model, [s.routes for s in samples], [s.length for s in samples], stats)


def build_model(cfg: TrainConfig) -> tuple[Any, Any]:
    """The model to train (LoRA-wrapped if configured) and its tokenizer."""
    return load_trainable(cfg.model, cfg.lora)


def autocast_for(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """See etude.scale.lowp.autocast_for (auto: bf16 on CUDA with bf16, else fp32)."""
    return _autocast(precision, device)


def learner_device(cfg: TrainConfig, dist: Any = None) -> torch.device:
    if dist is not None:
        return dist.device
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise EtudeError("device cuda: this machine has no CUDA device (use device = \"cpu\" or \"auto\")")
        return torch.device("cuda")
    return torch.device("cpu")


class Learner:
    """Owns the model being trained, its optimizer and (optionally) a frozen reference.

    dist (etude.train.distributed.Dist): shard the model with FSDP2 over the ranks; `step`
    then trains on this rank's share of the samples and every statistic is over all ranks.
    `rollout_model` is the unsharded model to sample with: the trained model itself in one
    process, a copy on rank 0 under FSDP2 (None on other ranks) that `publish_state` refreshes."""

    def __init__(self, cfg: TrainConfig, model: Any = None, tokenizer: Any = None, dist: Any = None):
        self.cfg, self.dist = cfg, dist
        dev = learner_device(cfg, dist)
        check_precision(cfg.precision, dev)
        if dist is not None and cfg.lora.enabled:
            raise EtudeError("LoRA with --nproc > 1 is not supported: train the adapter in one process")
        if model is None:
            model, tokenizer = build_model(cfg)
        if next(model.parameters()).device != dev:
            model.to(dev)
        apply_training_precision(model, cfg.precision)
        if cfg.gradient_checkpointing:
            enable_checkpointing(model)  # in train mode only: sampling from the model is unchanged
        self.rollout_model = model
        self.ref = None
        if cfg.loss.kl_coef > 0 and not cfg.lora.enabled:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)  # LoRA uses disable_adapter()
        if dist is not None:
            self.rollout_model = copy.deepcopy(model).eval() if dist.is_main else None
            if self.ref is not None:
                shard_model(self.ref, dist, cfg.parallel.dp_replicate, cfg.parallel.ep)
            model = shard_model(model, dist, cfg.parallel.dp_replicate, cfg.parallel.ep)
        self.model, self.tokenizer = model, tokenizer
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self.params = [p for _, p in named]
        # one parameter at a time when they sit on several device meshes (expert parallelism)
        self.opt = adamw(self.params, cfg.lr, cfg.weight_decay,
                         per_param=dist is not None and not _single_mesh(self.params))
        self.updates = 0
        self.share = cfg.share_prefix and not is_moe(model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def lr_at(self, update: int) -> float:
        return lr_at(update, self.cfg.lr, self.cfg.warmup_steps)

    def _ref_logprobs(self, rows: list[list[Sample]]) -> list[list[torch.Tensor]] | None:
        if self.cfg.loss.kl_coef <= 0:
            return None
        with torch.no_grad():
            if self.ref is not None:
                return [packed_logprobs(self.ref, r, self.cfg.temperature, share_prefix=self.share) for r in rows]
            with self.model.disable_adapter():
                return [packed_logprobs(self.model, r, self.cfg.temperature, share_prefix=self.share) for r in rows]

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step per PPO epoch over the whole batch; returns step statistics."""
        t0 = time.perf_counter()
        samples = [s for s in samples if s.completion_ids]
        tokens = sum(s.length for s in samples)
        if self.dist is not None:
            samples = self._my_share(samples)
        rows = [[samples[i] for i in row] for row in pack(samples, self.cfg.micro_batch_tokens,
                                                           share_prefix=self.share)]
        if self.dist is not None:  # FSDP's collectives need the same number of forwards on every rank
            n = max_over_ranks(len(rows), self.dist)
            rows += [[_filler(samples)] for _ in range(n - len(rows))]
        self.model.train()
        ref = self._ref_logprobs(rows)
        prox = None
        if self.cfg.ppo_epochs > 1:
            with torch.no_grad():
                prox = [packed_logprobs(self.model, r, self.cfg.temperature, share_prefix=self.share) for r in rows]
        stats: dict[str, float] = {}
        for _ in range(self.cfg.ppo_epochs):
            stats = self._epoch(rows, prox, ref)
        self.model.eval()
        dt = time.perf_counter() - t0
        rows_total = float(len(rows))
        if self.dist is not None:  # micro-batches of real samples, over all ranks
            rows_total = float(sum(gather_objects(sum(not r[0].pad for r in rows), self.dist)))
        # tokens the forwards actually ran (shared prompts and episode chains counted once)
        laid = sum(len(_layout(r, self.share)[0]) for r in rows if not r[0].pad)
        stats.update(train_s=dt, train_tokens=float(tokens), train_tokens_per_s=tokens / max(dt, 1e-9),
                     micro_batches=rows_total, forward_tokens=float(laid))
        return stats

    def _my_share(self, samples: list[Sample]) -> list[Sample]:
        keys = [tuple(s.prompt_ids) if self.share else i for i, s in enumerate(samples)]
        mine = split_groups([s.length for s in samples], keys, self.dist.world)[self.dist.rank]
        return [samples[i] for i in mine]

    def _epoch(self, rows: list[list[Sample]], prox: Any, ref: Any) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        stats = self.backward(rows, prox, ref)
        clip = (partial(clip_grad_norm, self.params, self.cfg.max_grad_norm, self.model, self.dist)
                if self.dist is not None else None)
        lr = self.lr_at(self.updates)
        grad_norm = optimizer_step(self.opt, self.params, lr, self.cfg.max_grad_norm, clip)
        self.updates += 1
        return {**stats, "grad_norm": grad_norm, "lr": lr}

    def backward(self, rows: list[list[Sample]], prox: Any = None, ref: Any = None) -> dict[str, float]:
        """Accumulate the batch loss's gradient into `.grad`, one packed row at a time."""
        lc: LossConfig = self.cfg.loss
        acc: dict[str, list[torch.Tensor]] = {"is": [], "trunc": [], "clip": [], "kl": []}
        rejected, total_loss = 0, 0.0
        moe_stats: dict[str, list[float]] = {}
        for r_i, row in enumerate(rows):
            with autocast_for(self.cfg.precision, self.device):
                logps = packed_logprobs(self.model, row, self.cfg.temperature, moe_stats, share_prefix=self.share)
            loss = torch.zeros((), device=self.device)
            for s_i, (s, lp) in enumerate(zip(row, logps, strict=True)):
                behav = torch.tensor(s.behav_logprobs, device=lp.device, dtype=lp.dtype)
                pl = lp if prox is None else prox[r_i][s_i]
                rl = None if ref is None else ref[r_i][s_i]
                tl = sample_loss(lp, pl, behav, s.advantage, s.weight, lc, rl)
                loss = loss + tl.loss
                if s.pad:
                    continue
                rejected += int(tl.rejected)
                for k, v in (("is", tl.is_ratio), ("trunc", tl.truncated), ("clip", tl.clipped), ("kl", tl.kl)):
                    acc[k].append(v.float().cpu())
            if self.dist is not None:
                # each rank's loss is its share of the batch's sum; FSDP averages gradients over
                # the ranks, so scale by the world size to get the sum (the one-process gradient)
                (loss * self.dist.world).backward()
            elif loss.requires_grad:
                loss.backward()
            total_loss += float(loss.detach())
        n = sum(not s.pad for r in rows for s in r)
        if self.dist is not None:
            parts = gather_objects((acc, rejected, n, total_loss, moe_stats), self.dist)
            acc = {k: [v for p in parts for v in p[0][k]] for k in acc}
            rejected, n, total_loss = (sum(p[i] for p in parts) for i in (1, 2, 3))
            moe_stats = {k: [v for p in parts for v in p[4].get(k, [])] for k in moe_stats}
        out = _summary(acc, rejected, n, total_loss)
        out.update({k: sum(v) / len(v) for k, v in moe_stats.items() if v})  # MoE: aux loss, route drift
        return out

    # --- weights for rollout workers / checkpoints -------------------------------------------

    def publish_state(self) -> dict[str, torch.Tensor]:
        """What a rollout worker needs to match the learner: the adapter (LoRA) or all weights.
        Under FSDP2 every rank must call it: the shards are gathered, rank 0 gets the full weights
        (and loads them into its `rollout_model`), the other ranks get {}."""
        if self.dist is not None:
            full = full_state_dict(self.model, self.dist)
            if self.rollout_model is not None:
                apply_state(self.rollout_model, full, lora=False)
            return full
        if self.cfg.lora.enabled:
            import peft

            return {k: v.detach().cpu().clone() for k, v in peft.get_peft_model_state_dict(self.model).items()}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}


def apply_state(model: Any, state: dict[str, torch.Tensor], lora: bool) -> None:
    """Load what `Learner.publish_state` produced into a worker's copy of the model."""
    if lora:
        import peft

        peft.set_peft_model_state_dict(model, state)
    else:
        model.load_state_dict(state, strict=False)


def _single_mesh(params: Sequence[torch.Tensor]) -> bool:
    return single_mesh(params)


def _filler(samples: Sequence[Sample]) -> Sample:
    """A one-token zero-weight sample: a forward and backward that change no gradient."""
    tok = samples[0].prompt_ids[0] if samples else 0
    return Sample([tok], [tok], [0.0], 0.0, weight=0.0, pad=True)


def _summary(acc: dict[str, list[torch.Tensor]], rejected: int, n: int, loss: float) -> dict[str, float]:
    cat = {k: torch.cat(v) if v else torch.zeros(0) for k, v in acc.items()}
    isr = cat["is"]
    return {
        "loss": loss,
        "is_ratio_mean": float(isr.mean()) if len(isr) else 1.0,
        "is_ratio_min": float(isr.min()) if len(isr) else 1.0,
        "is_ratio_max": float(isr.max()) if len(isr) else 1.0,
        "is_truncated_frac": float(cat["trunc"].mean()) if len(isr) else 0.0,
        "clip_frac": float(cat["clip"].mean()) if len(isr) else 0.0,
        "kl": float(cat["kl"].mean()) if len(isr) else 0.0,
        "rejected_frac": rejected / max(1, n),
    }
