"""Low-precision formats: MXFP8 (OCP microscaling) and FP8 with row-wise scales, emulated in PyTorch.

MXFP8, as the OCP Microscaling spec v1.0 defines it: blocks of 32 consecutive elements along
the last dimension share one scale, a power of two stored as E8M0 (a biased 8-bit exponent,
bias 127); each element is FP8 E4M3 (max normal 448). We pick the block exponent as
ceil(log2(amax / 448)) so the largest element never saturates (the spec's floor rule can clip
values in (448, 512)·2^e by up to 12.5%); this is the rounding-up choice torchao calls RCEIL.

What this module guarantees: quantise → dequantise is exact for values representable in the
block's grid, and otherwise within half an E4M3 ulp (relative error ≤ 2^-4) for elements in the
normal range of their block; elements below 2^(e-6) (about 2^-15 of the block's largest) fall
into E4M3 subnormals and get an absolute error ≤ 2^(e-10) (half the subnormal step 2^(e-9)).
What it does not do: it is an emulation (dequantise then matmul in fp32/bf16) for CPUs and for
checking numerics; the fast kernels on Hopper/Blackwell come from torchao (`etude.scale.lowp`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
E4M3_MAX = 448.0
E8M0_BIAS = 127
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class MXTensor:
    """A tensor in MXFP8: E4M3 elements plus one E8M0 scale per 32-element block."""

    data: torch.Tensor  # float8_e4m3fn, [..., K_padded]
    scale_e8m0: torch.Tensor  # uint8, [..., K_padded // 32]
    shape: tuple[int, ...]  # original shape (last dim before padding)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return mx_dequantize(self, dtype)


def _blocks(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    k = x.shape[-1]
    pad = (-k) % BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, BLOCK), pad


def mx_quantize(x: torch.Tensor) -> MXTensor:
    """Quantise along the last dimension into MXFP8."""
    xb, _ = _blocks(x.float())
    amax = xb.abs().amax(dim=-1, keepdim=True)
    # exponent e with amax / 2^e <= 448; all-zero blocks get the smallest scale.
    e = torch.ceil(torch.log2(torch.where(amax > 0, amax, torch.ones_like(amax)) / E4M3_MAX))
    e = torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = (xb / torch.exp2(e)).clamp(-E4M3_MAX, E4M3_MAX)
    data = scaled.to(FP8).reshape(*x.shape[:-1], -1)
    scale = (e.squeeze(-1) + E8M0_BIAS).to(torch.uint8)
    return MXTensor(data=data, scale_e8m0=scale, shape=tuple(x.shape))


def mx_dequantize(t: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    e = t.scale_e8m0.float() - E8M0_BIAS
    xb = t.data.float().reshape(*t.data.shape[:-1], -1, BLOCK) * torch.exp2(e).unsqueeze(-1)
    x = xb.reshape(*t.data.shape[:-1], -1)[..., : t.shape[-1]]
    return x.to(dtype)


def fp8_rowwise_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 with one fp32 scale per row (amax / 448), as used for Hopper FP8 training."""
    amax = x.float().abs().amax(dim=-1, keepdim=True).clamp(min=1e-12)
    scale = amax / E4M3_MAX
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(FP8), scale


def fp8_rowwise_dequantize(data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (data.float() * scale).to(dtype)


def fake_quantize(x: torch.Tensor, recipe: str) -> torch.Tensor:
    """Quantise-dequantise with a straight-through gradient (for emulated low-precision training)."""
    if recipe == "mxfp8":
        q = mx_dequantize(mx_quantize(x.detach()), x.dtype)
    elif recipe == "fp8_rowwise":
        q = fp8_rowwise_dequantize(*fp8_rowwise_quantize(x.detach()), dtype=x.dtype)
    elif recipe in ("bf16", "fp32"):
        return x
    else:
        raise ValueError(f"unknown precision recipe {recipe!r} (bf16, fp32, fp8_rowwise, mxfp8)")
    return x + (q - x).detach()


class EmulatedLowPrecisionLinear(torch.nn.Linear):
    """nn.Linear whose weight and input are fake-quantised along K (the reduction dimension),
    the way an MXFP8 / FP8 GEMM sees them; the gradient flows straight through."""

    recipe: str = "mxfp8"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = fake_quantize(self.weight, self.recipe)
        return torch.nn.functional.linear(fake_quantize(x, self.recipe), w, self.bias)


def convert_linears(model: torch.nn.Module, recipe: str, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Swap every nn.Linear (except names containing `skip`) for the emulated low-precision one."""
    if recipe in ("bf16", "fp32"):
        return 0
    n = 0
    for name, mod in model.named_modules():
        if type(mod) is torch.nn.Linear and not any(s in name for s in skip):
            mod.__class__ = EmulatedLowPrecisionLinear
            mod.recipe = recipe
            n += 1
    return n


def export_state_dict(model: torch.nn.Module, recipe: str) -> dict[str, torch.Tensor]:
    """State dict in the trained precision: each low-precision linear weight as E4M3 data plus
    its scales (`<name>.weight_scale_e8m0` for MXFP8, `<name>.weight_scale` for row-wise FP8),
    everything else unchanged. Loadable by `import_state_dict` with no separate quantisation step."""
    out: dict[str, torch.Tensor] = {}
    lowp = {n for n, m in model.named_modules() if isinstance(m, EmulatedLowPrecisionLinear)}
    for name, t in model.state_dict().items():
        mod = name.rsplit(".", 1)[0]
        if mod in lowp and name.endswith(".weight"):
            if recipe == "mxfp8":
                q = mx_quantize(t)
                out[name] = q.data.contiguous()
                out[f"{mod}.weight_scale_e8m0"] = q.scale_e8m0.contiguous()
                out[f"{mod}.weight_shape"] = torch.tensor(q.shape, dtype=torch.int64)
            else:
                data, scale = fp8_rowwise_quantize(t)
                out[name], out[f"{mod}.weight_scale"] = data.contiguous(), scale.contiguous()
        else:
            out[name] = t.contiguous()
    return out


def import_state_dict(sd: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Inverse of `export_state_dict`: dequantised weights ready for `load_state_dict`."""
    out = {}
    for name, t in sd.items():
        if name.endswith((".weight_scale_e8m0", ".weight_scale", ".weight_shape")):
            continue
        mod = name.rsplit(".", 1)[0]
        if f"{mod}.weight_scale_e8m0" in sd and name.endswith(".weight"):
            shape = tuple(int(v) for v in sd[f"{mod}.weight_shape"].tolist())
            out[name] = mx_dequantize(MXTensor(t, sd[f"{mod}.weight_scale_e8m0"], shape), dtype)
        elif f"{mod}.weight_scale" in sd and name.endswith(".weight"):
            out[name] = fp8_rowwise_dequantize(t, sd[f"{mod}.weight_scale"], dtype)
        else:
            out[name] = t
    return out
