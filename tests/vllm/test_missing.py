"""Without vLLM in the environment, `--backend vllm` is one line naming what is missing and how
to get it, exit 2, for serve, eval and train (these run in the normal suite)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from etude.policy.vllm_backend import vllm_missing

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(vllm_missing() is None, reason="vLLM is installed here")


@pytest.mark.parametrize("args", [
    ["serve", "--backend", "vllm", "--model", "tiny"],
    ["eval", "--backend", "vllm", "--model", "tiny", "--suite", "builtin:eval", "--out", "{tmp}/ev"],
    ["train", "--config", str(ROOT / "configs/tiny.toml"), "--backend", "vllm", "--out", "{tmp}/tr"],
])
def test_backend_vllm_without_vllm_is_one_line_exit_2(args, tmp_path):
    env = {**os.environ, "ETUDE_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "etude.cli", *[a.format(tmp=tmp_path) for a in args]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "vllm is not installed" in lines[0] and "make setup-vllm" in lines[0]
    assert not (tmp_path / "tr" / "checkpoints").exists()


def test_unknown_backend_is_refused():
    from etude.errors import EtudeError
    from etude.policy import check_backend
    from etude.train.config import TrainConfig

    with pytest.raises(EtudeError, match="backend"):
        check_backend("tensorrt")
    with pytest.raises(EtudeError, match="rollout_backend"):
        TrainConfig(rollout_backend="tensorrt")
    with pytest.raises(EtudeError, match="use_ray"):
        TrainConfig(rollout_backend="vllm", use_ray=True)


@pytest.mark.parametrize("how", ["flag", "table"])
def test_loop_on_vllm_without_vllm_is_one_line_and_writes_nothing(tmp_path, how):
    """`etude loop --backend vllm` (or `[server] backend = "vllm"`) where vLLM is missing: one
    line naming `make setup-vllm`, exit 2, before a cycle directory or the store exists."""
    cfg = tmp_path / "loop.toml"
    cfg.write_text(f'[loop]\nroot = "{tmp_path / "runs"}"\nmodel = "smollm2"\n'
                   + ('[server]\nbackend = "vllm"\n' if how == "table" else ""))
    cmd = [sys.executable, "-m", "etude.cli", "loop", "--config", str(cfg), "--quiet"]
    cmd += ["--backend", "vllm"] if how == "flag" else []
    env = {**os.environ, "ETUDE_HOME": str(tmp_path / "home")}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "the loop's server backend vllm" in lines[0] and "make setup-vllm" in lines[0]
    assert not (tmp_path / "runs").exists()
