"""Precision of a run, for training and serving: fp32, bf16, and FP8 / MXFP8 through torchao.

`PRECISIONS` are the values `TrainConfig.precision` and `ServeConfig.precision` accept:

| value  | what runs                                                          | needs |
|--------|--------------------------------------------------------------------|-------|
| fp32   | fp32 weights and matmuls                                           | any device |
| bf16   | training: fp32 master weights, bf16 autocast; serving: bf16 weights | any device (CPU bf16 is often slower) |
| fp8    | torchao FP8 row-wise linears (`convert_to_float8_training` / `Float8DynamicActivationFloat8WeightConfig`), bf16 elsewhere | CUDA compute capability ≥ 8.9 (Ada, Hopper) + torchao |
| mxfp8  | torchao MXFP8 linears (`MXFP8TrainingOpConfig` / `MXDynamicActivationMXWeightConfig`), bf16 elsewhere | CUDA compute capability ≥ 10.0 (Blackwell) + torchao |

`check_precision` refuses fp8 / mxfp8 with one line (an `EtudeError`, exit 2) where the hardware
has no such tensor cores or torchao is missing: there is no silent fallback to an emulation.
The emulation in `etude.scale.mx` (fake-quantised linears) exists for tests and numerics
benchmarks only and is never selected by a precision setting.

Not tested here (no GPU on the machine this was written on): the fp8 and mxfp8 branches of
`apply_training_precision` / `apply_serving_precision`; they follow torchao 0.18's documented
API (`pip install -e ".[precision]"`). `lm_head` and linears whose sizes are not multiples of 16
stay in high precision (the FP8 GEMMs need aligned shapes; the vocabulary projection is the
most precision-sensitive).
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

from etude.errors import EtudeError

PRECISIONS = ("fp32", "bf16", "fp8", "mxfp8")
"""Precisions of a run (training also accepts "auto": bf16 autocast on a CUDA GPU with bf16, else fp32)."""

# minimum CUDA compute capability of the tensor cores each low-precision format needs
MIN_CAPABILITY = {"fp8": (8, 9), "mxfp8": (10, 0)}
_HW = {"fp8": "FP8 tensor cores (NVIDIA compute capability ≥ 8.9: Ada, Hopper or newer)",
       "mxfp8": "MXFP8 tensor cores (NVIDIA compute capability ≥ 10.0: Blackwell or newer)"}


def is_low_precision(precision: str) -> bool:
    return precision in MIN_CAPABILITY


def check_precision(precision: str, device: Any = None, *, what: str = "precision") -> None:
    """Raise a one-line `EtudeError` unless `precision` can run on `device` (default: the first
    CUDA device if there is one, else the CPU). fp32 / bf16 / auto always pass."""
    import torch

    if precision not in (*PRECISIONS, "auto"):
        raise EtudeError(f"{what} must be one of {', '.join(PRECISIONS)} (or auto), not {precision!r}")
    if not is_low_precision(precision):
        return
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    need = MIN_CAPABILITY[precision]
    if dev.type != "cuda" or not torch.cuda.is_available() or torch.version.cuda is None:
        raise EtudeError(f"{what} {precision} needs {_HW[precision]}; this run is on {dev.type.upper()} "
                         f"without them — use bf16 or fp32 (the CPU emulation in etude.scale.mx is for tests only)")
    cap = torch.cuda.get_device_capability(dev)
    if cap < need:
        name = torch.cuda.get_device_name(dev)
        raise EtudeError(f"{what} {precision} needs {_HW[precision]}; {name} has compute capability "
                         f"{cap[0]}.{cap[1]} — use bf16 or fp32")
    if importlib.util.find_spec("torchao") is None:
        raise EtudeError(f"{what} {precision} needs torchao: pip install -e \".[precision]\" (torchao==0.18.0)")


def _filter(module: Any, fqn: str) -> bool:
    """Linears that get low-precision GEMMs: not lm_head, sizes multiples of 16."""
    import torch

    if not isinstance(module, torch.nn.Linear) or fqn.split(".")[-1] == "lm_head":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_training_precision(model: Any, precision: str) -> Any:
    """Swap the model's linears for torchao's FP8 / MXFP8 training linears (fp8, mxfp8); a no-op
    for fp32 / bf16 / auto. Call `check_precision` first, and before FSDP2 sharding."""
    if precision == "fp8":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("rowwise"),
                                   module_filter_fn=_filter)
    elif precision == "mxfp8":
        from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
        from torchao.quantization import quantize_

        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL), filter_fn=_filter)
    return model


def apply_serving_precision(model: Any, precision: str) -> Any:
    """Inference weights: bf16 casts; fp8 / mxfp8 move the model to CUDA in bf16 and quantise its
    linears with torchao (dynamic activation + weight quantisation). fp32: unchanged."""
    import torch

    if precision == "bf16":
        return model.to(torch.bfloat16)
    if not is_low_precision(precision):
        return model
    from torchao.quantization import quantize_

    model = model.to(device="cuda", dtype=torch.bfloat16)
    if precision == "fp8":
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow

        quantize_(model, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=_filter)
    else:
        from torchao.prototype.mx_formats import MXDynamicActivationMXWeightConfig

        quantize_(model, MXDynamicActivationMXWeightConfig(), filter_fn=_filter)
    return model


def autocast_for(precision: str, device: Any) -> contextlib.AbstractContextManager:
    """The autocast context of a training forward. fp32: none. auto: bf16 on a CUDA device with
    bf16, else none (CPU bf16 matmuls are slower than fp32 on most hosts). bf16, fp8, mxfp8:
    bf16 (torchao's low-precision linears take bf16 inputs; everything else runs in bf16)."""
    import torch

    device = torch.device(device)
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
