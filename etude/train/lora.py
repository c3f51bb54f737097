"""LoRA wrapping and export, one place for the RL learner and the SFT trainer.

`load_trainable` loads a model to train (LoRA-wrapped when configured); `wrap_lora` puts a fresh peft adapter on a model, or continues one (`LoraConfig.init`: an adapter
directory, e.g. an SFT stage's, trained further by RL). `save_adapter` writes the adapter alone
(peft's adapter_config.json + adapter_model.safetensors: small, loaded on its base by `etude serve`,
`etude eval` and vLLM); `merge_and_save` writes base + adapter as a plain model directory.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.policy.models import load_model
from etude.train.config import LoraConfig


def wrap_lora(model: Any, cfg: LoraConfig) -> Any:
    """`model` with a trainable LoRA adapter: `cfg.init`'s weights when set, else a fresh one."""
    import peft

    if cfg.init:
        if not (Path(cfg.init) / "adapter_config.json").is_file():
            raise EtudeError(f"lora.init = {cfg.init!r} is not a LoRA adapter directory (no adapter_config.json)")
        return peft.PeftModel.from_pretrained(model, cfg.init, is_trainable=True)
    lcfg = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    return peft.get_peft_model(model, lcfg)


def load_trainable(model: str, cfg: LoraConfig, *, fp32: bool = False, device: Any = None) -> tuple[Any, Any]:
    """`model` (a name or directory) and its tokenizer, ready to train: in fp32 and on `device`
    first when asked (so a fresh adapter is made in fp32 beside fp32 weights), then LoRA-wrapped
    when `cfg.enabled`. The RL learner and the SFT trainer both build their model here."""
    m, tok = load_model(model)
    if fp32:
        m.float()
    if device is not None:
        m.to(device)
    return (wrap_lora(m, cfg) if cfg.enabled else m), tok


def enable_checkpointing(model: Any) -> None:
    """Activation (gradient) checkpointing of every decoder layer of a model about to be trained,
    non-reentrant (a LoRA model's frozen embeddings need not hand out inputs that require grad).
    The model's config is left alone: its exported config.json keeps `use_cache`, so whoever
    loads the trained model generates with a KV cache; training forward passes pass
    use_cache=False themselves. transformers 5.24 renamed the method
    (`activation_checkpointing_enable`); .venv-vllm pins 5.19, which has the old one."""
    new = getattr(model, "activation_checkpointing_enable", None)
    if new is not None:
        new(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _atomic_save(out: Path, write: Any) -> Path:
    tmp = out.with_name(f".{out.name}-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def save_adapter(model: Any, tokenizer: Any, out: str | Path, base: str | None = None) -> Path:
    """The adapter of peft `model` alone at `out` (written under a temporary name, then renamed);
    `base` is recorded as the adapter's base model when given."""
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if base is not None:
            import json

            f = tmp / "adapter_config.json"
            cfg = json.loads(f.read_text())
            cfg["base_model_name_or_path"] = str(base)
            f.write_text(json.dumps(cfg, indent=2))
    return _atomic_save(Path(out), write)


def merge_and_save(model: Any, tokenizer: Any, out: str | Path) -> Path:
    """A plain model directory at `out`: `model` itself, or with its LoRA adapter merged in (a
    copy is merged; `model` keeps training)."""
    def write(tmp: Path) -> None:
        m = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
        m.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return _atomic_save(Path(out), write)


def merge_adapter_dir(adapter_dir: str | Path, base_model: str, out: str | Path) -> Path:
    """`base_model` with the adapter at `adapter_dir` merged in, saved at `out`; kept if present."""
    from peft import PeftModel


    out = Path(out)
    if (out / "config.json").is_file():
        return out
    model, tok = load_model(base_model)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    return merge_and_save(merged, tok, out)
