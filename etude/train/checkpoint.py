"""Checkpoints: weights, optimizer state and `state.json`, written atomically.

Layout of `OUT/checkpoints/step-000010/`:
- full fine-tune: `config.json` + `model.safetensors` + tokenizer files (a Hugging Face model
  directory: `LocalPolicy.from_pretrained(path)` serves it); LoRA: peft's `adapter_config.json`
  + `adapter_model.safetensors` (needs the base model named in state.json).
- `optimizer.safetensors`: every tensor of the optimizer state, keyed `"<param index>.<name>"`.
- `rng.safetensors`: torch's CPU generator state.
- `state.json`: step, policy version, data cursor, the ids of every batch consumed so far,
  baseline means, optimizer param groups and the resolved config.

A checkpoint is written into a temporary directory and renamed into place, then `latest` is
replaced atomically; a crash at any moment leaves the previous checkpoint intact and pointed to.
Not guaranteed: durability against power loss (no fsync of the directory entries).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from etude.errors import EtudeError
from etude.train.distributed import load_full_state_dict, shard_optimizer_state


def ckpt_root(out: Path) -> Path:
    return out / "checkpoints"


def latest_checkpoint(out: Path) -> Path | None:
    ptr = ckpt_root(out) / "latest"
    if not ptr.is_file():
        return None
    path = ckpt_root(out) / ptr.read_text().strip()
    return path if (path / "state.json").is_file() else None


def _optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    sd = opt.state_dict()
    tensors = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            t = v if torch.is_tensor(v) else torch.tensor(v)
            tensors[f"{idx}.{k}"] = t.detach().cpu().contiguous()
    return tensors, sd["param_groups"]


def _restore_optimizer(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict]) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = t
    opt.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(out: Path, learner: Any, state: dict[str, Any], keep: int = 2, *, model: Any = None,
                    optimizer_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write checkpoint `step-{state['step']:06d}` atomically and point `latest` at it.
    Under FSDP2 rank 0 passes the unsharded `model` holding the gathered weights and the gathered
    `optimizer_tensors` (etude.train.distributed), so the files are those of a one-process run."""
    root = ckpt_root(out)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{int(state['step']):06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    (model if model is not None else learner.model).save_pretrained(tmp, safe_serialization=True)
    if learner.tokenizer is not None:
        learner.tokenizer.save_pretrained(tmp)
    tensors, groups = _optimizer_tensors(learner.opt)
    if optimizer_tensors is not None:
        tensors = optimizer_tensors
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    full = {**state, "optimizer_param_groups": groups, "updates": learner.updates}
    (tmp / "state.json").write_text(json.dumps(full, indent=1))
    final = root / name
    if final.exists():  # a re-run of the same step after a resume: replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _point_latest(root, name)
    _prune(root, keep)
    return final


def _point_latest(root: Path, name: str) -> None:
    tmp = root / ".latest.tmp"
    tmp.write_text(name)
    os.replace(tmp, root / "latest")


def _prune(root: Path, keep: int) -> None:
    done = sorted(p for p in root.glob("step-*") if p.is_dir())
    for p in done[: max(0, len(done) - max(1, keep))]:
        shutil.rmtree(p, ignore_errors=True)
    for p in root.glob(".step-*"):  # temp dirs of a crashed writer
        shutil.rmtree(p, ignore_errors=True)


def load_checkpoint(path: Path, learner: Any) -> dict[str, Any]:
    """Restore weights, optimizer and RNG into `learner`; return the saved state."""
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EtudeError(f"unreadable checkpoint {path}: {e}") from e
    _load_weights(path, learner)
    opt_file = path / "optimizer.safetensors"
    if opt_file.is_file():
        tensors = load_file(str(opt_file))
        if getattr(learner, "dist", None) is not None:  # full tensors → this rank's shards
            state_by_param = shard_optimizer_state(tensors, learner.params, learner.param_names, learner.model,
                                                   learner.dist)
            learner.opt.load_state_dict({"state": state_by_param, "param_groups": state["optimizer_param_groups"]})
        else:
            _restore_optimizer(learner.opt, tensors, state["optimizer_param_groups"])
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch"])
    learner.updates = int(state.get("updates", state["step"]))
    return state


def _load_weights(path: Path, learner: Any) -> None:
    adapter = path / "adapter_model.safetensors"
    if adapter.is_file():
        import peft

        peft.set_peft_model_state_dict(learner.model, load_file(str(adapter)))
        return
    files = sorted(path.glob("model*.safetensors"))
    if not files:
        raise EtudeError(f"checkpoint {path} holds no weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if getattr(learner, "dist", None) is not None:  # a full state dict into this rank's shards
        missing, unexpected = load_full_state_dict(learner.model, state, learner.dist)
    else:
        missing, unexpected = learner.model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise EtudeError(f"checkpoint {path} does not fit the model (missing {missing[:2]}, unexpected {unexpected[:2]})")
