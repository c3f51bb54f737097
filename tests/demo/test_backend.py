"""`etude demo --backend`: which engine the evaluations and RL rollouts use."""

import importlib.util

import pytest

from etude.demo.run import QUICK, Demo, DemoConfig, resolve_backend
from etude.errors import EtudeError

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_auto_takes_vllm_only_where_it_is_installed():
    assert resolve_backend("auto") == ("vllm" if HAS_VLLM else "hf")
    assert resolve_backend("hf") == "hf"


def test_bad_or_missing_engine_is_one_error_before_anything_is_written(tmp_path):
    with pytest.raises(EtudeError, match="auto, hf or vllm"):
        Demo(DemoConfig(backend="gpu", out=str(tmp_path / "a")))
    assert not (tmp_path / "a").exists()
    if not HAS_VLLM:
        with pytest.raises(EtudeError, match="make setup-vllm"):
            Demo(DemoConfig(backend="vllm", out=str(tmp_path / "b")))
        assert not (tmp_path / "b").exists()


def test_workers_follow_the_engine_unless_given(tmp_path):
    assert Demo(DemoConfig(backend="hf", out=str(tmp_path / "h"))).workers == 8
    assert Demo(DemoConfig(backend="hf", workers=3, out=str(tmp_path / "w"))).workers == 3
    assert QUICK.backend == "hf"  # the tiny random model: the machinery, on the default engine
