"""`etude train --nproc N`: the learner sharded with FSDP2 over N ranks.

Launch. `etude train --config F --nproc N` re-runs itself under `torch.distributed.run`
(torchrun) with N local ranks; `torchrun --nproc-per-node N -m etude.cli train --config F` (any
torchrun options, several nodes included) is the same thing. A process that sees WORLD_SIZE > 1
joins the process group: gloo on CPU, NCCL (one rank per GPU, cuda:LOCAL_RANK) when CUDA is
there (`[parallel] backend`). N above what the machine allows (CPU cores for gloo, CUDA devices
for NCCL) is one line and exit 2.

What is split, and what is not:
- Rollouts stay on rank 0. Rank 0 holds an unsharded copy of the policy (like a Ray rollout
  worker), generates and scores the batch, and broadcasts it; after every optimiser step the
  full weights are gathered from the shards and loaded into that copy. Evaluation and metrics
  are rank 0's too. (The rollout copy costs rank 0 one extra model in memory.)
- The learner is sharded: `etude.scale.parallel.apply_fsdp2` (FSDP2 `fully_shard` per decoder
  layer and at the root; HSDP with `[parallel] dp_replicate > 1`; expert parallelism for MoE
  models with `[parallel] ep > 1`). Every rank builds the same samples and loss weights from the
  broadcast batch, then trains on its share: whole GRPO groups (so a group's prompt is still laid
  out once), balanced by token count. Ranks with fewer packed rows run zero-weight filler rows
  so every rank makes the same number of forward/backward calls (FSDP's collectives need it).
  The loss weights are fixed over the whole batch, so the summed gradient equals the one-process
  gradient (tested: `tests/train/test_distributed.py`).
- Checkpoints: the full state dict is gathered to rank 0 (weights and AdamW moments, expert
  slices re-assembled) and written exactly as a one-process run writes it (a Hugging Face model
  directory in safetensors + `optimizer.safetensors`), so a checkpoint from N ranks resumes on
  any number of ranks, or is served, as is. `state.json` and every metrics record carry
  `world_size`.

Not done: LoRA under `--nproc > 1` (refused with one line); rollouts split across ranks; bf16
all-gathers (FSDP2 MixedPrecisionPolicy; bf16 runs as autocast over fp32 shards).
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from etude.errors import EtudeError
from etude.scale.moe import is_moe, tiny_moe
from etude.scale.parallel import ShardedExperts, apply_fsdp2, build_mesh
from etude.train.config import TrainConfig
from etude.train.losses import token_weights

TIMEOUT = datetime.timedelta(hours=2)  # ranks > 0 wait in a broadcast while rank 0 samples and evaluates


@dataclass
class Dist:
    """This rank's place in the run."""

    rank: int
    world: int
    local_rank: int
    backend: str
    device: torch.device
    layout: Any = None  # etude.scale.parallel.Layout, set when the model is sharded

    @property
    def is_main(self) -> bool:
        return self.rank == 0


# --- launch ------------------------------------------------------------------------------


def env_world_size() -> int:
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 1


def env_rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return backend


def machine_limit(backend: str) -> tuple[int, str]:
    """The most local ranks this machine allows, and what that number counts."""
    if resolve_backend(backend) == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return n, f"{n} CUDA device(s) (nccl: one rank per GPU)"
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n, f"{n} CPU core(s) (gloo: one rank per core)"


def check_nproc(nproc: int, backend: str) -> None:
    if nproc < 1:
        raise EtudeError(f"--nproc must be ≥ 1, not {nproc}")
    if resolve_backend(backend) == "nccl" and not torch.cuda.is_available():
        raise EtudeError("parallel.backend nccl needs CUDA devices and this machine has none: use gloo (or auto)")
    limit, what = machine_limit(backend)
    if nproc > limit:
        raise EtudeError(f"--nproc {nproc} is more than this machine allows: {what}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, argv: Sequence[str], backend: str = "auto") -> int:
    """Run `etude <argv>` on `nproc` local ranks under torch.distributed.run; its exit code."""
    check_nproc(nproc, backend)
    env = dict(os.environ)
    limit, _ = machine_limit("gloo")
    env.setdefault("OMP_NUM_THREADS", str(max(1, limit // nproc)))  # ranks must not fight over cores
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--nnodes", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(_free_port()), "-m", "etude.cli", *argv]
    return subprocess.call(cmd, env=env)


def init(backend: str = "auto", device: str = "auto") -> Dist | None:
    """Join the process group torchrun describes (None when WORLD_SIZE ≤ 1: one process)."""
    world = env_world_size()
    if world <= 1:
        return None
    for var in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            raise EtudeError(f"WORLD_SIZE={world} but ${var} is not set: launch with `etude train --nproc N` or torchrun")
    backend = resolve_backend(backend)
    local = int(os.environ["LOCAL_RANK"])
    if backend == "nccl":
        if device == "cpu":
            raise EtudeError("device cpu with parallel.backend nccl: use gloo for CPU ranks")
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cuda", local) if device == "cuda" else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=TIMEOUT, device_id=dev if backend == "nccl" else None)
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local, backend=backend, device=dev)


def close(d: Dist | None) -> None:
    """End of a run: wait for every rank (rank 0 may still be writing), leave the group."""
    if d is not None and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def abort(d: Dist | None) -> None:
    """On an error: leave the group without waiting for the others (torchrun stops them)."""
    if d is not None and dist.is_initialized():
        dist.destroy_process_group()


# --- sharding ----------------------------------------------------------------------------


def shard_model(model: torch.nn.Module, d: Dist, dp_replicate: int, ep: int) -> torch.nn.Module:
    """FSDP2 (+ HSDP, + EP for MoE) over the world; the layout is kept on `d`."""
    if d.world % dp_replicate:
        raise EtudeError(f"parallel.dp_replicate = {dp_replicate} does not divide the world size {d.world}")
    if ep > 1 and not is_moe(model):
        raise EtudeError(f"parallel.ep = {ep} needs an MoE model; {type(model).__name__} has no experts")
    if dp_replicate > 1 and _tied(model):
        # measured (gloo, torch 2.13): HSDP over a model whose lm_head shares the embedding matrix
        # gets that matrix's gradient wrong (x1.33 on the tiny model); plain FSDP2 gets it right
        raise EtudeError("parallel.dp_replicate > 1 is not supported for models with tied input/output "
                         "embeddings (their gradient comes out wrong under HSDP): use dp_replicate = 1")
    layout = build_mesh(d.world, dp_replicate, d.world // dp_replicate, ep, device=d.device.type)
    d.layout = layout
    return apply_fsdp2(model, layout, hsdp=dp_replicate > 1)


def single_mesh(params: Sequence[torch.Tensor]) -> bool:
    """Whether every parameter lives on one device mesh (not so under expert parallelism, where
    fused/foreach optimizer kernels, which batch tensors across parameters, cannot run)."""
    from torch.distributed.tensor import DTensor

    return len({id(p.device_mesh) if isinstance(p, DTensor) else None for p in params}) <= 1


def _tied(model: torch.nn.Module) -> bool:
    try:
        return model.get_output_embeddings().weight is model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return False


def _ep_names(model: torch.nn.Module) -> set[str]:
    return {f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, ShardedExperts)
            for p in ("gate_up_proj", "down_proj")}


def _full(t: torch.Tensor, ep_slice: bool, d: Dist) -> torch.Tensor:
    """The whole tensor behind a (possibly DTensor, possibly expert-sliced) shard; a collective."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.full_tensor()
    if ep_slice and d.layout is not None and d.layout.ep > 1:
        parts = [torch.empty_like(t) for _ in range(d.layout.ep)]
        dist.all_gather(parts, t.contiguous(), group=d.layout.ep_group)
        t = torch.cat(parts)
    return t.detach()


def _shard_like(full: torch.Tensor, like: torch.Tensor, ep_slice: bool, d: Dist) -> torch.Tensor:
    """This rank's part of `full`, laid out like `like` (a DTensor parameter or optimizer state)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if ep_slice and d.layout is not None and d.layout.ep > 1:
        n = full.shape[0] // d.layout.ep
        full = full[d.layout.ep_rank * n:(d.layout.ep_rank + 1) * n]
    full = full.to(device=like.device, dtype=like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


def full_state_dict(model: torch.nn.Module, d: Dist) -> dict[str, torch.Tensor]:
    """Every weight of the sharded model in full, on rank 0's CPU ({} on other ranks). All ranks
    must call it. Tied weights stay one tensor."""
    ep = _ep_names(model)
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}  # every rank skips the same aliases, or the collectives would mismatch
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            if d.is_main:
                out[name] = out[seen[id(t)]]
            continue
        seen[id(t)] = name
        full = _full(t, name in ep, d)
        if d.is_main:
            out[name] = full.cpu().clone()
    return out


@torch.no_grad()
def load_full_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], d: Dist) -> tuple[list[str], list[str]]:
    """Load a full (unsharded) state dict into the sharded model; (missing, unexpected) keys.
    Every rank passes the same `state` (each reads the checkpoint file)."""
    from torch.distributed.tensor import DTensor

    ep = _ep_names(model)
    own = model.state_dict(keep_vars=True)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    for name, t in own.items():
        if name not in state:
            continue
        part = _shard_like(state[name], t, name in ep, d)
        (t.to_local() if isinstance(t, DTensor) else t).copy_(part.to_local() if isinstance(part, DTensor) else part)
    return missing, unexpected


def full_optimizer_tensors(opt: torch.optim.Optimizer, names: Sequence[str], model: torch.nn.Module,
                           d: Dist) -> dict[str, torch.Tensor]:
    """The optimizer state in the one-process checkpoint's form ("<param index>.<key>", full
    tensors) on rank 0 ({} elsewhere). All ranks must call it."""
    ep = _ep_names(model)
    sd = opt.state_dict()
    out: dict[str, torch.Tensor] = {}
    for idx in sorted(sd["state"]):
        for key, v in sorted(sd["state"][idx].items()):
            t = v if torch.is_tensor(v) else torch.tensor(v)
            full = _full(t, names[idx] in ep and t.dim() > 0, d)
            if d.is_main:
                out[f"{idx}.{key}"] = full.cpu().contiguous()
    return out


def shard_optimizer_state(tensors: dict[str, torch.Tensor], params: Sequence[torch.Tensor], names: Sequence[str],
                          model: torch.nn.Module, d: Dist) -> dict[int, dict[str, torch.Tensor]]:
    """Full optimizer tensors (a checkpoint's) → this rank's state, laid out like each parameter."""
    ep = _ep_names(model)
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        idx, name = key.split(".", 1)
        i = int(idx)
        p = params[i]
        state.setdefault(i, {})[name] = _shard_like(t, p, names[i] in ep, d) if t.dim() > 0 else t
    return state


# --- the step ----------------------------------------------------------------------------


def split_groups(lengths: Sequence[int], keys: Sequence[Any], world: int) -> list[list[int]]:
    """Sample indices per rank: samples with the same key (a GRPO group's prompt) stay together;
    groups go, largest first, to the rank with the fewest tokens so far (deterministic)."""
    groups: dict[Any, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    units = sorted(groups.values(), key=lambda g: (-sum(lengths[i] for i in g), g[0]))
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for g in units:
        r = min(range(world), key=lambda j: (load[j], j))
        shares[r].extend(g)
        load[r] += sum(lengths[i] for i in g)
    return [sorted(s) for s in shares]


def max_over_ranks(n: int, d: Dist) -> int:
    t = torch.tensor([n], dtype=torch.long, device=d.device if d.backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def gather_objects(obj: Any, d: Dist) -> list[Any]:
    out: list[Any] = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, d: Dist) -> Any:
    box = [obj if d.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float, model: torch.nn.Module, d: Dist) -> float:
    """Clip by the global norm over all shards (parameters on different meshes — experts under EP —
    are normed per mesh; an expert slice's norm is summed over its EP group). Returns the norm."""
    from torch.distributed.tensor import DTensor

    ep_ids = {id(p) for n, p in model.named_parameters() if n in _ep_names(model)}
    groups: dict[Any, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is None:
            continue
        mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
        groups.setdefault((mesh, id(p) in ep_ids), []).append(p.grad)
    sq = torch.zeros((), dtype=torch.float64, device=d.device)
    for (_, is_ep), grads in groups.items():
        n = torch.nn.utils.get_total_norm(grads, 2.0)
        n = (n.full_tensor() if isinstance(n, DTensor) else n).double().to(d.device) ** 2
        if is_ep and d.layout is not None and d.layout.ep > 1:
            dist.all_reduce(n, group=d.layout.ep_group)
        sq = sq + n
    total = sq.sqrt().float()
    for grads in groups.values():  # one mesh at a time: DTensor ops refuse mixed meshes
        torch.nn.utils.clip_grads_with_norm_(grads, max_norm, total.to(grads[0].device))
    return float(total)


# --- the equivalence check (tests, docs) --------------------------------------------------


def check_main(argv: Sequence[str] | None = None) -> None:
    """`torchrun --nproc-per-node N -m etude.train.distributed --out res.json`: one learner
    step of the tiny model on N ranks vs one process on the same samples (rank 0 computes the
    reference); writes loss, grad norm and the largest gradient / updated-weight difference."""
    import argparse
    import json
    import random

    # NOTE: stays here: learner imports this module at its top (sharding, clipping, gathers), so a
    # top-level import of learner would be a module cycle; only this self-check needs the learner.
    from etude.train.learner import Learner, Sample

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--micro-batch-tokens", type=int, default=48)
    ap.add_argument("--ppo-epochs", type=int, default=1)
    ap.add_argument("--kl-coef", type=float, default=0.0)
    ap.add_argument("--moe", default=None, help="a tiny random MoE of this architecture instead of the tiny Llama")
    ap.add_argument("--dp-replicate", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    a = ap.parse_args(argv)
    d = init("gloo")
    if d is None:
        raise EtudeError("run it under torchrun with WORLD_SIZE > 1")
    rng = random.Random(0)
    hi = 256 if a.moe else 2000  # token ids inside the vocabulary
    samples = []
    for _ in range(a.samples // 3):  # groups of 3 sharing a prompt, as GRPO makes them
        prompt = [rng.randrange(3, hi) for _ in range(rng.randint(3, 9))]
        for _ in range(3):
            c = [rng.randrange(3, hi) for _ in range(rng.randint(2, 7))]
            # behaviour log-probs near the random model's own (~ -log vocab), so IS weights are ~1
            behav = [(-5.5 if a.moe else -10.8) + rng.uniform(-0.3, 0.3) for _ in c]
            samples.append(Sample(prompt, c, behav, advantage=rng.uniform(-1, 1)))
    for s, w in zip(samples, token_weights([len(s.completion_ids) for s in samples], "token_mean"), strict=True):
        s.weight = w
    cfg = TrainConfig.from_dict({"model": "tiny", "lr": 1e-3, "precision": "fp32", "device": "cpu",
                                 "micro_batch_tokens": a.micro_batch_tokens, "ppo_epochs": a.ppo_epochs,
                                 "loss": {"kl_coef": a.kl_coef},
                                 "parallel": {"dp_replicate": a.dp_replicate, "ep": a.ep}})

    def model() -> Any:
        return tiny_moe(a.moe, experts=4, seed=0) if a.moe else None

    torch.manual_seed(0)
    learner = Learner(cfg, model=model(), dist=d)
    stats = learner.step([Sample(**vars(s)) for s in samples])
    full = full_state_dict(learner.model, d)
    ep = _ep_names(learner.model)
    grads = {n: _full(p.grad, n in ep, d).cpu() for n, p in learner.model.named_parameters() if p.grad is not None}
    res: dict[str, Any] = {}
    if d.is_main:
        torch.manual_seed(0)
        ref = Learner(cfg, model=model())
        ref_stats = ref.step([Sample(**vars(s)) for s in samples])
        ref_grads = {n: p.grad for n, p in ref.model.named_parameters() if p.grad is not None}
        ref_sd = ref.model.state_dict()
        res = {"world_size": d.world, "moe": a.moe, "dp_replicate": a.dp_replicate, "ep": a.ep, "loss": stats["loss"], "ref_loss": ref_stats["loss"],
               "grad_norm": stats["grad_norm"], "ref_grad_norm": ref_stats["grad_norm"],
               "micro_batches": stats["micro_batches"], "ref_micro_batches": ref_stats["micro_batches"],
               "is_ratio_mean": stats["is_ratio_mean"], "ref_is_ratio_mean": ref_stats["is_ratio_mean"],
               "params_compared": len(ref_grads),
               "max_grad_diff": max(float((grads[n] - g).abs().max()) for n, g in ref_grads.items()),
               "worst_param": max(ref_grads, key=lambda n: float((grads[n] - ref_grads[n]).abs().max())),
               "max_grad": max(float(g.abs().max()) for g in ref_grads.values()),
               "max_weight_diff": max(float((full[n] - t).abs().max()) for n, t in ref_sd.items() if n in full)}
        with open(a.out, "w") as fh:
            json.dump(res, fh)
        print(json.dumps(res))
    close(d)


if __name__ == "__main__":
    try:
        check_main()
    except EtudeError as e:
        raise SystemExit(f"etude: error: {e}") from None
