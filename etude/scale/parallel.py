"""Device-mesh layouts for FSDP2 with hybrid sharding (HSDP) and expert parallelism (EP).

Layout (torchtitan's convention): `world = dp_replicate × dp_shard`; every rank reads its own
data. Dense parameters are sharded with `fully_shard` over `dp_shard` and replicated across
`dp_replicate` groups (HSDP: reduce-scatter within a group, all-reduce across groups). Expert
parallelism borrows from `dp_shard`: `ep` divides `dp_shard`, each EP group of `ep` ranks splits
the experts (rank `j` holds experts `[j·E/ep, (j+1)·E/ep)`), and tokens travel to their
experts and back by `all_to_all_single` (autograd-aware, ours). Expert weights are then
FSDP-sharded over what is left, `dp_replicate × dp_shard/ep`.

Gradient scale: FSDP averages a gradient over the ranks that hold a parameter. An expert's
gradient already sums the contributions of its whole EP group (they arrived by all-to-all), and
is then averaged over `world/ep` ranks, so it comes out `ep` times the data-parallel mean; I
scale it by `1/ep` in the forward (`_scale_grad`), which makes every gradient the mean over all
ranks' data, as a single process on the concatenated batch computes it.

Launch: `torchrun --nproc-per-node N -m etude.scale.parallel --dp-replicate R --dp-shard S --ep E`
(one training step of a tiny MoE checked against a single-process run), or `launch_ray(cfg)`
for Ray Train workers with the same `ParallelConfig`.

Guarantees (tested on CPU with gloo, 2 and 4 processes): loss and every gradient equal the
single-process run on the concatenated batch within 1e-5. Not guaranteed / not done here: NCCL
or GPU runs (untested on this machine), uneven batches across ranks (the mean then differs),
pipeline or tensor parallelism, and capacity limits / token dropping (every token reaches its
experts).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from etude.errors import EtudeError
from etude.scale.moe import moe_blocks, tiny_moe


@dataclass(frozen=True)
class ParallelConfig:
    dp_replicate: int = 1
    """HSDP replica groups (gradients all-reduced across them)."""
    dp_shard: int = 1
    """Ranks each replica's parameters are sharded over (FSDP2); dp_replicate × dp_shard = world."""
    ep: int = 1
    """Expert-parallel degree: experts split across this many ranks; must divide dp_shard."""
    arch: str = "olmoe"
    """Tiny MoE architecture for the check step (etude.scale.moe.tiny_moe)."""
    experts: int = 4
    """Experts per MoE layer (divisible by ep)."""
    batch_per_rank: int = 2
    """Sequences per rank in the check step."""
    seq: int = 16
    """Tokens per sequence in the check step."""
    seed: int = 0
    """Seed of the model and the data."""

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard


@dataclass
class Layout:
    """The meshes one rank needs."""

    dense: Any  # DeviceMesh (dp_replicate, dp_shard): dense parameters
    flat: Any  # DeviceMesh (world,): plain FSDP when hsdp=False
    experts: Any  # DeviceMesh (dp_replicate, dp_shard/ep): expert parameters
    ep_group: Any  # ProcessGroup of this rank's EP group (None when ep == 1)
    ep: int
    ep_rank: int


def build_mesh(world: int, dp_replicate: int, dp_shard: int, ep: int = 1, device: str = "cpu") -> Layout:
    """Meshes for `world` ranks (the process group must be initialised)."""
    from torch.distributed.device_mesh import init_device_mesh

    if dp_replicate * dp_shard != world:
        raise EtudeError(f"dp_replicate × dp_shard = {dp_replicate * dp_shard} but world = {world}")
    if ep < 1 or dp_shard % ep:
        raise EtudeError(f"ep = {ep} must divide dp_shard = {dp_shard}")
    dense = init_device_mesh(device, (dp_replicate, dp_shard), mesh_dim_names=("dp_replicate", "dp_shard"))
    flat = init_device_mesh(device, (world,), mesh_dim_names=("dp",))
    # rank = r·dp_shard + m·ep + e, the same numbering as `dense`, so EP groups sit inside shard groups
    m3 = init_device_mesh(device, (dp_replicate, dp_shard // ep, ep),
                          mesh_dim_names=("dp_replicate", "dp_shard_mod_ep", "ep"))
    experts = m3["dp_replicate", "dp_shard_mod_ep"]
    group = m3["ep"].get_group() if ep > 1 else None
    return Layout(dense, flat, experts, group, ep, m3["ep"].get_local_rank())


# --- expert parallelism ------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    """all_to_all_single whose backward sends gradients back along the reversed splits."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: Any) -> torch.Tensor:
        ctx.splits, ctx.group = (in_splits, out_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        in_splits, out_splits = ctx.splits
        gi = g.new_empty((sum(in_splits), *g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), in_splits, out_splits, group=ctx.group)
        return gi, None, None, None


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        return g * ctx.scale, None


def _scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x if scale == 1.0 else _ScaleGrad.apply(x, scale)


class ShardedExperts(torch.nn.Module):
    """This rank's slice of a transformers experts module (`gate_up_proj [E, 2I, H]`,
    `down_proj [E, H, I]`), called like it: `(hidden [N, H], top_k_index [N, k], top_k_weights [N, k])`."""

    def __init__(self, full: torch.nn.Module, ep: int, ep_rank: int, group: Any):
        super().__init__()
        n = full.gate_up_proj.shape[0]
        if n % ep:
            raise EtudeError(f"{n} experts cannot be split across ep = {ep} ranks")
        self.num_experts, self.local, self.ep, self.ep_rank, self.group = n, n // ep, ep, ep_rank, group
        sl = slice(ep_rank * self.local, (ep_rank + 1) * self.local)
        self.gate_up_proj = torch.nn.Parameter(full.gate_up_proj.detach()[sl].clone())
        self.down_proj = torch.nn.Parameter(full.down_proj.detach()[sl].clone())
        self.act_fn = full.act_fn

    def forward(self, hidden: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        n, k = top_k_index.shape
        flat = top_k_index.reshape(-1)
        token = torch.arange(n, device=hidden.device).repeat_interleave(k)
        order = torch.argsort(flat // self.local, stable=True)  # group (token, slot) pairs by owner rank
        send = torch.bincount(flat // self.local, minlength=self.ep)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)
        s_split, r_split = send.tolist(), recv.tolist()
        x = _AllToAll.apply(hidden[token[order]], r_split, s_split, self.group)
        with torch.no_grad():
            ids = torch.empty(sum(r_split), dtype=flat.dtype, device=flat.device)
            dist.all_to_all_single(ids, flat[order].contiguous(), r_split, s_split, group=self.group)
        y = self._local_experts(x, ids - self.ep_rank * self.local)
        back = _AllToAll.apply(y, s_split, r_split, self.group)
        w = top_k_weights.reshape(-1)[order].to(back.dtype)[:, None]
        return torch.zeros_like(hidden).index_add(0, token[order], (back * w).to(hidden.dtype))

    def _local_experts(self, x: torch.Tensor, local_ids: torch.Tensor) -> torch.Tensor:
        gate_up = _scale_grad(self.gate_up_proj, 1.0 / self.ep)
        down = _scale_grad(self.down_proj, 1.0 / self.ep)
        y = x.new_zeros((x.shape[0], down.shape[1]))
        for e in range(self.local):
            rows = (local_ids == e).nonzero().squeeze(-1)
            if rows.numel() == 0:
                continue
            g, u = torch.nn.functional.linear(x[rows], gate_up[e]).chunk(2, dim=-1)
            y = y.index_add(0, rows, torch.nn.functional.linear(self.act_fn(g) * u, down[e]))
        return y


def apply_expert_parallel(model: torch.nn.Module, layout: Layout) -> list[ShardedExperts]:
    """Replace every MoE block's experts by this rank's `ShardedExperts` slice."""
    out = []
    for block in moe_blocks(model):
        if not hasattr(block.experts, "gate_up_proj"):
            raise EtudeError(f"{type(block.experts).__name__}: expert parallelism needs fused gate_up_proj weights")
        block.experts = ShardedExperts(block.experts, layout.ep, layout.ep_rank, layout.ep_group)
        out.append(block.experts)
    return out


def apply_fsdp2(model: torch.nn.Module, layout: Layout, hsdp: bool = True) -> torch.nn.Module:
    """Expert parallelism (if `layout.ep > 1`), then `fully_shard` per decoder layer and at the root.
    `hsdp=False` shards dense weights over all ranks (plain FSDP) instead of within groups."""
    from torch.distributed.fsdp import fully_shard

    mesh = layout.dense if hsdp else layout.flat
    if layout.ep > 1:
        for ex in apply_expert_parallel(model, layout):
            fully_shard(ex, mesh=layout.experts)
    elif layout.dense.size() > 1:
        for block in moe_blocks(model):
            fully_shard(block.experts, mesh=mesh)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise EtudeError(f"{type(model).__name__}: no .model.layers to shard (not a decoder-only HF model?)")
    return layers


# --- the check step (torchrun / Ray / tests) ---------------------------------------------


def _batch(cfg: ParallelConfig, world: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randint(3, 256, (world * cfg.batch_per_rank, cfg.seq), generator=g)


def reference_step(cfg: ParallelConfig) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one step in a single process on the concatenated batch."""
    model = tiny_moe(cfg.arch, experts=cfg.experts, seed=cfg.seed).train()
    ids = _batch(cfg, cfg.world)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _full_grad(name: str, p: torch.nn.Parameter, layout: Layout) -> torch.Tensor:
    g = p.grad
    g = g.full_tensor() if hasattr(g, "full_tensor") else g
    if layout.ep > 1 and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
        parts = [torch.empty_like(g) for _ in range(layout.ep)]
        dist.all_gather(parts, g.contiguous(), group=layout.ep_group)
        g = torch.cat(parts)
    return g


def distributed_step(cfg: ParallelConfig, hsdp: bool = True) -> dict[str, Any]:
    """One forward/backward of the tiny MoE under the layout; compared with `reference_step`.
    Every rank returns the same figures."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world != cfg.world:
        raise EtudeError(f"the config needs {cfg.world} ranks but {world} were launched")
    layout = build_mesh(world, cfg.dp_replicate, cfg.dp_shard, cfg.ep)
    model = apply_fsdp2(tiny_moe(cfg.arch, experts=cfg.experts, seed=cfg.seed).train(), layout, hsdp=hsdp)
    ids = _batch(cfg, world)[rank * cfg.batch_per_rank:(rank + 1) * cfg.batch_per_rank]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    ref_loss, ref_grads = reference_step(cfg)
    diffs = {n: float((_full_grad(n, p, layout) - ref_grads[n]).abs().max()) for n, p in model.named_parameters()}
    worst = max(diffs, key=diffs.get)
    experts = [n for n in diffs if ".experts." in n]
    return {"config": asdict(cfg), "hsdp": hsdp, "loss": float(mean_loss) / world, "ref_loss": ref_loss,
            "max_grad_diff": diffs[worst], "worst_param": worst, "params_compared": len(diffs),
            "expert_params": len(experts), "expert_max_grad_diff": max(diffs[n] for n in experts),
            "expert_grad_scale": min(float(ref_grads[n].abs().max()) for n in experts),
            "grad_scale": max(float(g.abs().max()) for g in ref_grads.values())}


def init_from_env(backend: str = "gloo") -> None:
    """Join the process group torchrun (or Ray Train) describes in the environment."""
    if dist.is_initialized():
        return
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise EtudeError(f"${var} is not set: launch with torchrun (see docs/scale.md)")
    dist.init_process_group(backend)


def _ray_worker(config: dict[str, Any]) -> None:
    import tempfile

    import ray.train

    res = distributed_step(ParallelConfig(**config))
    # NOTE: Ray Train 2.60 keeps reported metrics only with a checkpoint, so rank 0 ships its
    # result as a one-file checkpoint (it lands in the run's storage_path, shared on a cluster).
    if dist.get_rank() != 0:
        ray.train.report(res)
        return
    with tempfile.TemporaryDirectory() as d:
        Path(d, "result.json").write_text(json.dumps(res))
        ray.train.report(res, checkpoint=ray.train.Checkpoint.from_directory(d))


def launch_ray(cfg: ParallelConfig, backend: str = "gloo", storage_path: str | None = None) -> dict[str, Any]:
    """The same check step on `cfg.world` Ray Train workers (Ray starts the process group)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(_ray_worker, train_loop_config=asdict(cfg), torch_config=TorchConfig(backend=backend),
                           scaling_config=ScalingConfig(num_workers=cfg.world, use_gpu=False),
                           run_config=RunConfig(storage_path=storage_path))
    result = trainer.fit()
    if result.checkpoint is None:
        raise EtudeError("the Ray Train run reported no result")
    with result.checkpoint.as_directory() as d:
        return json.loads(Path(d, "result.json").read_text())


def parse_layouts(spec: str) -> list[tuple[int, int, int, bool]]:
    """"RxSxE[,RxSxE...]" (a trailing "f" = plain FSDP, hsdp=False) → (R, S, E, hsdp) tuples."""
    out = []
    for item in spec.split(","):
        hsdp = not item.endswith("f")
        try:
            r, s, e = (int(v) for v in item.rstrip("f").split("x"))
        except ValueError:
            raise EtudeError(f"bad layout {item!r}: expected RxSxE, e.g. 2x2x2") from None
        out.append((r, s, e, hsdp))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="One HSDP/EP step of a tiny MoE, checked against one process.")
    for f in ("dp_replicate", "dp_shard", "ep", "experts", "batch_per_rank", "seq", "seed"):
        ap.add_argument("--" + f.replace("_", "-"), type=int, default=getattr(ParallelConfig, f))
    ap.add_argument("--arch", default=ParallelConfig.arch)
    ap.add_argument("--no-hsdp", action="store_true", help="plain FSDP over all ranks for dense weights")
    ap.add_argument("--layouts", default=None, help="several layouts in one launch: RxSxE[f],... (overrides the three)")
    ap.add_argument("--out", default=None, help="rank 0 writes the JSON results (a list) here")
    a = vars(ap.parse_args(argv))
    out, hsdp, spec = a.pop("out"), not a.pop("no_hsdp"), a.pop("layouts")
    base = ParallelConfig(**a)
    layouts = parse_layouts(spec) if spec else [(base.dp_replicate, base.dp_shard, base.ep, hsdp)]
    init_from_env()
    try:
        results = []
        for r, s, e, h in layouts:
            cfg = ParallelConfig(**{**asdict(base), "dp_replicate": r, "dp_shard": s, "ep": e})
            results.append(distributed_step(cfg, hsdp=h))
        if dist.get_rank() == 0:
            print(json.dumps(results))
            if out:
                with open(out, "w") as fh:
                    json.dump(results, fh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except EtudeError as e:
        raise SystemExit(f"etude: error: {e}") from None
