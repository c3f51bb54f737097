"""Numerics of the MXFP8 and row-wise FP8 quantise/dequantise paths against fp32."""

import pytest
import torch

from etude.scale.mx import (
    BLOCK,
    E8M0_BIAS,
    convert_linears,
    export_state_dict,
    fp8_rowwise_dequantize,
    fp8_rowwise_quantize,
    import_state_dict,
    mx_dequantize,
    mx_quantize,
)


def _mx_bound(x: torch.Tensor) -> torch.Tensor:
    """Per-element error bound: half an E4M3 ulp (2^-4 relative) in the normal range, half the
    subnormal step (2^(e-10)) below it, where e is the block exponent."""
    q = mx_quantize(x)
    e = (q.scale_e8m0.float() - E8M0_BIAS).repeat_interleave(BLOCK, dim=-1)[..., : x.shape[-1]]
    return torch.maximum(x.abs() * 2.0**-4, torch.exp2(e - 10))


@pytest.mark.parametrize("kind", ["normal", "outliers", "tiny", "mixed_scale"])
def test_mx_roundtrip_within_bounds(kind):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=g)
    if kind == "outliers":
        idx = torch.randint(0, x.numel(), (200,), generator=g)
        x.view(-1)[idx] *= 1000.0  # one huge value per block squeezes the others into subnormals
    elif kind == "tiny":
        x *= 1e-30
    elif kind == "mixed_scale":
        x *= torch.logspace(-8, 8, 256).unsqueeze(0)
    dq = mx_dequantize(mx_quantize(x))
    err = (dq - x).abs()
    assert torch.all(err <= _mx_bound(x) * (1 + 1e-6)), float((err / _mx_bound(x)).max())
    assert torch.isfinite(dq).all()


def test_mx_scales_are_powers_of_two_and_never_saturate():
    x = torch.randn(8, 96) * 37.0
    q = mx_quantize(x)
    assert q.scale_e8m0.dtype == torch.uint8 and q.scale_e8m0.shape == (8, 3)
    assert q.data.dtype == torch.float8_e4m3fn
    # the block maximum is represented, not clipped at 448
    dq = mx_dequantize(q)
    blocks_max = x.abs().reshape(8, 3, 32).amax(-1)
    dq_max = dq.abs().reshape(8, 3, 32).amax(-1)
    assert torch.allclose(dq_max, blocks_max, rtol=2**-4)


def test_mx_exact_on_representable_values_and_padding():
    x = torch.tensor([[1.0, -2.0, 0.5, 448.0, 0.0] + [0.25] * 30])  # 35 elements: one padded block
    dq = mx_dequantize(mx_quantize(x))
    assert dq.shape == x.shape
    assert torch.equal(dq, x)


def test_mx_error_is_much_smaller_than_naive_fp8_on_outlier_heavy_tensors():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(128, 512, generator=g)
    x[:, ::97] *= 500.0
    mx_err = (mx_dequantize(mx_quantize(x)) - x).norm() / x.norm()
    naive = (x / x.abs().max() * 448).to(torch.float8_e4m3fn).float() * (x.abs().max() / 448)
    naive_err = (naive - x).norm() / x.norm()
    assert mx_err < 0.05
    assert mx_err <= naive_err


def test_fp8_rowwise_roundtrip():
    x = torch.randn(32, 128) * torch.logspace(-3, 3, 32).unsqueeze(1)
    data, scale = fp8_rowwise_quantize(x)
    dq = fp8_rowwise_dequantize(data, scale)
    rel = (dq - x).abs() / x.abs().amax(-1, keepdim=True)
    assert rel.max() < 2**-4 + 1e-6  # relative to the row max: subnormals included


def test_export_in_trained_precision_roundtrips(tmp_path):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40))
    assert convert_linears(model, "mxfp8", skip=()) == 2
    x = torch.randn(4, 64)
    y = model(x)
    sd = export_state_dict(model, "mxfp8")
    assert sd["0.weight"].dtype == torch.float8_e4m3fn
    save_file(sd, tmp_path / "m.safetensors")
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 40))
    fresh.load_state_dict(import_state_dict(load_file(tmp_path / "m.safetensors")))
    convert_linears(fresh, "mxfp8", skip=())
    # the served model computes what the trained (emulated) model computed: weights already on the grid
    assert torch.allclose(fresh(x), y, atol=1e-5)
