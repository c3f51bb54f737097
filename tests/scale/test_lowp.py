"""Precision settings (etude.scale.lowp): fp32/bf16 run anywhere; fp8/mxfp8 need FP8/MXFP8
tensor cores and torchao, and are refused with one line (exit 2) where those are missing — on
this CPU machine, always. The emulation in etude.scale.mx is never what a setting selects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etude.errors import EtudeError
from etude.scale import lowp
from etude.scale.lowp import check_precision
from etude.train import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def _one_line_exit_2(cmd: list[str], **kw) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    err = r.stderr.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    return err


@pytest.mark.parametrize("p", ["fp8", "mxfp8"])
def test_low_precision_without_tensor_cores_is_refused(p):
    with pytest.raises(EtudeError, match=f"precision {p} needs .*tensor cores.*CPU.*use bf16 or fp32"):
        check_precision(p, "cpu")
    for ok in ("fp32", "bf16", "auto"):
        check_precision(ok, "cpu")
    with pytest.raises(EtudeError, match="one of fp32, bf16, fp8, mxfp8"):
        check_precision("fp16", "cpu")


def test_too_old_a_gpu_and_missing_torchao_are_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA A100")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (8, 0))
    with pytest.raises(EtudeError, match="A100 has compute capability 8.0"):
        check_precision("fp8", "cuda")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    with pytest.raises(EtudeError, match=r"compute capability 9.0 — use bf16"):
        check_precision("mxfp8", "cuda")  # Hopper has FP8 but not MXFP8 tensor cores
    monkeypatch.setattr(lowp.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(EtudeError, match=r"needs torchao: pip install -e \".\[precision\]\""):
        check_precision("fp8", "cuda")


def test_train_config_accepts_the_four_precisions():
    for p in ("auto", "fp32", "bf16", "fp8", "mxfp8"):
        assert TrainConfig(precision=p).precision == p
    with pytest.raises(EtudeError, match="precision must be"):
        TrainConfig(precision="fp16")


def test_etude_train_fp8_on_cpu_is_one_line_exit_2(tmp_path):
    base = [sys.executable, "-m", "etude.cli", "train", "--config", str(ROOT / "configs" / "tiny.toml")]
    err = _one_line_exit_2([*base, "--out", str(tmp_path / "a"), "--set", "precision=fp8"])
    assert "fp8 needs FP8 tensor cores" in err
    err = _one_line_exit_2([*base, "--out", str(tmp_path / "b"), "--set", "precision=mxfp8", "--nproc", "2"])
    assert "mxfp8 needs MXFP8 tensor cores" in err  # refused before any rank starts
    assert not (tmp_path / "a" / "checkpoints").exists()


def test_etude_serve_fp8_on_cpu_is_one_line_exit_2(tmp_path):
    env = {**__import__("os").environ, "ETUDE_HOME": str(tmp_path)}
    err = _one_line_exit_2([sys.executable, "-m", "etude.cli", "serve", "--model", "tiny", "--precision", "fp8",
                            "--port", "0"], env=env)
    assert "serve precision fp8 needs FP8 tensor cores" in err


def test_serving_in_bf16_loads_bf16_weights_and_generates():
    from etude.serve.pool import load_local
    from etude.serve.registry import Checkpoint

    pol = load_local(Checkpoint(name="tiny", path="tiny", version=3, state="production"), precision="bf16")
    assert next(pol.model.parameters()).dtype == torch.bfloat16 and pol.version == 3
    gen = pol.generate_ids([[1, 2, 3]], max_tokens=3)[0]
    assert gen.token_ids and all(lp <= 0.0 for lp in gen.logprobs)
