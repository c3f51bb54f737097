"""Mixture-of-experts policies: find the routers, record routes at sampling, replay them in training.

Hugging Face MoE causal LMs in transformers 5 (OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, ...) share
one shape: a sparse block with `.gate` (a top-k router whose forward returns
`(router_logits, top_k_weights, top_k_index)` for hidden states flattened to `[tokens, hidden]`)
and `.experts` (called with those indices and weights). I hook the router, not the model code:

- `record_routing(model)`: a context manager that keeps each router's `top_k_index` for every
  forward inside it, including the one-token KV-cache decode steps of `generate`, reshaped to
  `[batch, seq, k]` and concatenated along the sequence, so position `t` of the record is the
  route taken when token `t` of the (padded) sequence went through the layer.
- `replay_routing(model, routes)`: a context manager that forces those experts in every
  forward inside it. Gates are recomputed from the *current* router logits at the forced
  experts (softmax, then gather, then the router's own top-k renormalisation), so gradients
  still reach the router. Rows marked `-1` route freely (the last token of a sample was never
  fed through the model at sampling time, so it has no recorded route).
- `load_balance_loss(...)`: the Switch-style auxiliary loss E · Σ_e f_e · P_e over every layer,
  computed from the routes actually used (replayed or not); `RoutingSession.aux_loss()`.

`Routes` is the JSON-safe form of one sample's routes (base64 int16, shape
`[layers, tokens, k]`), carried by `RoutedGeneration` from the policy to the learner.

Guarantees: with replay and unchanged weights, every router picks exactly the recorded experts,
so training log-probs equal sampling log-probs up to float rounding of cached vs full attention
(~1e-6 in fp32); the replayed gates are differentiable in the router weights.
Not guaranteed: jitter noise (Mixtral's `router_jitter_noise` in train mode) is not recorded;
routers of other shapes (e.g. DeepSeek-style grouped routing with bias terms) are not found by
`moe_blocks` and such a model is treated as dense.
"""

from __future__ import annotations

import base64
import contextlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from etude.errors import EtudeError
from etude.types import Generation

_BLOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def moe_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The sparse MoE blocks of `model` in forward order (cached per model object)."""
    if model in _BLOCKS:
        return _BLOCKS[model]
    found = []
    for mod in model.modules():
        gate = getattr(mod, "gate", None)
        if (isinstance(gate, torch.nn.Module) and hasattr(mod, "experts") and hasattr(gate, "top_k")
                and isinstance(getattr(gate, "weight", None), torch.nn.Parameter)):
            found.append(mod)
    _BLOCKS[model] = found
    return found


def is_moe(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and bool(moe_blocks(model))


# --- the JSON-safe carrier ---------------------------------------------------------------


@dataclass(frozen=True)
class Routes:
    """Expert indices of one sample: `[layers, tokens, k]` int16, base64 so it survives JSON."""

    shape: tuple[int, int, int]
    data: str

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> Routes:
        arr = t.to(torch.int16).cpu().numpy().astype("<i2", copy=False)
        return cls(shape=tuple(int(s) for s in arr.shape), data=base64.b64encode(arr.tobytes()).decode())

    def tensor(self) -> torch.Tensor:
        arr = np.frombuffer(base64.b64decode(self.data), dtype="<i2").reshape(self.shape)
        return torch.from_numpy(arr.astype(np.int64))

    @property
    def num_tokens(self) -> int:
        return self.shape[1]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Routes:
        return cls(shape=tuple(d["shape"]), data=str(d["data"]))


@dataclass(frozen=True)
class RoutedGeneration(Generation):
    """A Generation from an MoE policy: `routes` covers prompt + completion tokens but the last
    (`[layers, P + T - 1, k]`), in sequence order, no padding."""

    routes: Routes | None = None


# --- hooks -------------------------------------------------------------------------------


class RoutingRecord:
    """Routes seen inside `record_routing`: per layer, a list of `[batch, seq, k]` chunks."""

    def __init__(self, n_layers: int):
        self.chunks: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]

    def tensor(self) -> torch.Tensor:
        """`[layers, batch, total_seq, k]` (int64)."""
        if not self.chunks or not self.chunks[0]:
            raise EtudeError("no routes were recorded (did a forward pass run inside record_routing?)")
        return torch.stack([torch.cat(c, dim=1) for c in self.chunks]).long()

    def sample(self, row: int, start: int, stop: int) -> Routes:
        """Routes of batch row `row`, sequence positions [start, stop)."""
        return Routes.from_tensor(self.tensor()[:, row, start:stop])


@contextlib.contextmanager
def record_routing(model: torch.nn.Module) -> Iterator[RoutingRecord]:
    blocks = moe_blocks(model)
    rec = RoutingRecord(len(blocks))
    handles = []
    for i, block in enumerate(blocks):
        shape: dict[str, tuple[int, int]] = {}

        def pre(_m: Any, args: tuple, kwargs: dict, shape: dict = shape) -> None:
            h = args[0] if args else kwargs["hidden_states"]
            shape["bs"] = tuple(h.shape[:2]) if h.dim() == 3 else (1, h.shape[0])

        def post(_m: Any, _a: Any, out: tuple, i: int = i, shape: dict = shape) -> None:
            b, s = shape["bs"]
            rec.chunks[i].append(out[2].detach().reshape(b, s, -1).to(torch.int16).cpu())

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.gate.register_forward_hook(post))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


class RoutingSession:
    """What `replay_routing` saw: per layer the router logits and the experts actually used."""

    def __init__(self, blocks: Sequence[torch.nn.Module]):
        self.blocks = list(blocks)
        self.logits: list[torch.Tensor] = []
        self.used: list[torch.Tensor] = []
        self.forced_rows = 0
        self.changed_rows = 0  # forced rows whose free top-k would have picked other experts

    def aux_loss(self) -> torch.Tensor:
        if not self.logits:
            raise EtudeError("no MoE forward pass ran inside replay_routing")
        num_experts = self.logits[0].shape[-1]
        return load_balance_loss(self.logits, self.used, num_experts)


def load_balance_loss(logits: Sequence[torch.Tensor], used: Sequence[torch.Tensor], num_experts: int) -> torch.Tensor:
    """E · Σ_e f_e · P_e over all layers' rows together (transformers' formula without a mask):
    f_e = assignments to e / rows, P_e = mean router probability of e. Uniform routing gives k."""
    probs = torch.cat([torch.softmax(lg.float(), dim=-1) for lg in logits])
    idx = torch.cat(list(used))
    counts = torch.zeros(num_experts, device=probs.device).index_add_(
        0, idx.reshape(-1).to(probs.device), torch.ones(idx.numel(), device=probs.device))
    return num_experts * torch.sum(counts / probs.shape[0] * probs.mean(dim=0))


def _forced_output(router: Any, out: tuple, forced: torch.Tensor, sess: RoutingSession) -> tuple:
    logits, scores, free_idx = out
    forced = forced.to(free_idx.device)
    if forced.shape != free_idx.shape:
        raise EtudeError(f"replayed routes have shape {tuple(forced.shape)} but the router produced "
                         f"{tuple(free_idx.shape)} (routes must cover exactly the tokens of this forward)")
    keep = (forced < 0).any(dim=-1, keepdim=True)  # rows without a recorded route: route freely
    idx = torch.where(keep, free_idx, forced)
    probs = torch.softmax(logits.float(), dim=-1)
    vals = probs.gather(-1, idx)
    # NOTE: Mixtral's router always renormalises and has no `norm_topk_prob`; the others say.
    if getattr(router, "norm_topk_prob", True):
        vals = vals / vals.sum(dim=-1, keepdim=True)
    vals = torch.where(keep, scores.to(vals.dtype), vals).to(scores.dtype)
    sess.forced_rows += int((~keep).sum())
    differs = (torch.sort(idx, -1).values != torch.sort(free_idx, -1).values).any(-1)
    sess.changed_rows += int((differs & ~keep[:, 0]).sum())
    return logits, vals, idx


@contextlib.contextmanager
def replay_routing(model: torch.nn.Module, routes: torch.Tensor | None) -> Iterator[RoutingSession]:
    """Force `routes` (`[layers, tokens, k]` matching each forward's flattened tokens, -1 = free;
    or None to only observe) in every MoE forward inside the block."""
    blocks = moe_blocks(model)
    if routes is not None and routes.shape[0] != len(blocks):
        raise EtudeError(f"routes cover {routes.shape[0]} MoE layers but the model has {len(blocks)}")
    sess = RoutingSession(blocks)
    handles = []
    for i, block in enumerate(blocks):
        def post(router: Any, _a: Any, out: tuple, i: int = i) -> tuple:
            if routes is not None:
                out = _forced_output(router, out, routes[i].reshape(-1, out[2].shape[-1]), sess)
            sess.logits.append(out[0])
            sess.used.append(out[2])
            return out

        handles.append(block.gate.register_forward_hook(post))
    try:
        yield sess
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def replay_packed(model: torch.nn.Module, routes: Sequence[Routes | None], lengths: Sequence[int],
                  stats: dict[str, list[float]] | None = None) -> Iterator[RoutingSession]:
    """Replay for one packed row of samples (what the learner calls); without any routes it only
    observes. Appends `moe_aux_loss` and `moe_route_changed_frac` (the share of replayed rows
    whose free routing would have picked other experts: the train/serve routing drift) to `stats`."""
    packed = None
    if any(r is not None for r in routes):
        packed = pack_routes(routes, lengths, len(moe_blocks(model)), top_k_of(model))
    with replay_routing(model, packed) as sess:
        yield sess
    if stats is not None and sess.logits:
        stats.setdefault("moe_aux_loss", []).append(float(sess.aux_loss().detach()))
        if sess.forced_rows:
            stats.setdefault("moe_route_changed_frac", []).append(sess.changed_rows / sess.forced_rows)


def pack_routes(routes: Sequence[Routes | None], lengths: Sequence[int], n_layers: int, top_k: int) -> torch.Tensor:
    """Concatenate per-sample routes along tokens for a packed row (`[layers, Σ lengths, k]`);
    positions a sample has no route for (None, or past its recorded length) are -1 (free)."""
    parts = []
    for r, n in zip(routes, lengths, strict=True):
        part = torch.full((n_layers, n, top_k), -1, dtype=torch.long)
        if r is not None:
            t = r.tensor()
            if t.shape[0] != n_layers or t.shape[2] != top_k:
                raise EtudeError(f"routes of shape {tuple(t.shape)} do not fit a model with {n_layers} MoE layers, top-{top_k}")
            m = min(n, t.shape[1])
            part[:, :m] = t[:, :m]
        parts.append(part)
    return torch.cat(parts, dim=1)


def routes_for_rows(rec: RoutingRecord, width: int, prompt_lens: Sequence[int],
                    completion_lens: Sequence[int]) -> list[Routes]:
    """Per row of a left-padded `generate` batch (prompt width `width`): the routes of its real
    tokens, prompt then completion, minus the last completion token (never fed through)."""
    full = rec.tensor()
    out = []
    for r, (p, t) in enumerate(zip(prompt_lens, completion_lens, strict=True)):
        out.append(Routes.from_tensor(full[:, r, width - p: width + max(t - 1, 0)]))
    return out


def top_k_of(model: torch.nn.Module) -> int:
    return int(moe_blocks(model)[0].gate.top_k)


# --- tiny models for tests and benchmarks ------------------------------------------------


def tiny_moe(arch: str = "olmoe", *, vocab: int = 256, hidden: int = 32, layers: int = 2, experts: int = 4,
             top_k: int = 2, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """A small random MoE causal LM of a Hugging Face architecture: olmoe | qwen2_moe | qwen3_moe | mixtral."""
    import transformers as tf

    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  num_experts_per_tok=top_k, tie_word_embeddings=False,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if arch == "olmoe":
        cfg = tf.OlmoeConfig(intermediate_size=hidden * 2, num_experts=experts, **common)
        cls = tf.OlmoeForCausalLM
    elif arch == "qwen2_moe":
        cfg = tf.Qwen2MoeConfig(intermediate_size=hidden * 2, moe_intermediate_size=hidden * 2, num_experts=experts,
                                shared_expert_intermediate_size=hidden * 2, **common)
        cls = tf.Qwen2MoeForCausalLM
    elif arch == "qwen3_moe":
        cfg = tf.Qwen3MoeConfig(intermediate_size=hidden * 2, moe_intermediate_size=hidden * 2, num_experts=experts,
                                norm_topk_prob=True, head_dim=hidden // 4, **common)
        cls = tf.Qwen3MoeForCausalLM
    elif arch == "mixtral":
        cfg = tf.MixtralConfig(intermediate_size=hidden * 2, num_local_experts=experts, **common)
        cls = tf.MixtralForCausalLM
    else:
        raise EtudeError(f"unknown MoE architecture {arch!r} (olmoe, qwen2_moe, qwen3_moe, mixtral)")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(cfg)
        # I give routers a real spread: transformers initialises some of them to zeros, which
        # would make every route a tie broken by index order.
        for block in moe_blocks(model):
            torch.nn.init.normal_(block.gate.weight, std=0.5)
    return model.eval()
