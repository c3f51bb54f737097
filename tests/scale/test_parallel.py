"""FSDP2 hybrid sharding + expert parallelism on CPU with gloo: launched by torchrun (the
documented path) on 2 and 4 processes, every layout's loss and gradients must match one process
on the concatenated batch. Plus the single-rank pieces and the bad-input errors."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from etude.errors import EtudeError
from etude.scale.parallel import ParallelConfig, build_mesh, init_from_env, parse_layouts

TOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(nproc: int, layouts: str, tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "res.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port",
           str(_free_port()), "-m", "etude.scale.parallel", "--layouts", layouts, "--out", str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def _check(results: list[dict], expected: int) -> None:
    assert len(results) == expected
    for r in results:
        where = (r["config"]["dp_replicate"], r["config"]["dp_shard"], r["config"]["ep"], r["hsdp"])
        assert abs(r["loss"] - r["ref_loss"]) < TOL, where
        assert r["params_compared"] > 20 and r["expert_params"] >= 4, where
        assert r["max_grad_diff"] < TOL, (where, r["worst_param"], r["max_grad_diff"])
        # the bound means something: every expert gradient is far larger than the tolerance
        assert r["expert_grad_scale"] > 100 * TOL, where


@pytest.mark.slow
def test_two_processes_fsdp_replicate_and_expert_parallel_match_one_process(tmp_path):
    # qwen2_moe: a shared expert beside the routed ones, no top-k renormalisation
    _check(_torchrun(2, "1x2x1,2x1x1,1x2x2", tmp_path, "--arch", "qwen2_moe"), 3)


@pytest.mark.slow
def test_four_processes_hsdp_with_expert_parallel_match_one_process(tmp_path):
    _check(_torchrun(4, "1x4x1f,2x2x1,2x2x2,1x4x4", tmp_path, "--arch", "olmoe", "--experts", "8"), 4)


def test_sharded_experts_with_one_rank_equal_the_hf_experts(tmp_path):
    import torch.distributed as dist

    from etude.scale.moe import moe_blocks, tiny_moe
    from etude.scale.parallel import ShardedExperts

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        block = moe_blocks(tiny_moe("olmoe"))[0]
        x = torch.randn(7, 32)
        _, w, idx = block.gate(x)
        mine = ShardedExperts(block.experts, ep=1, ep_rank=0, group=None)
        torch.testing.assert_close(mine(x, idx, w), block.experts(x, idx, w), atol=1e-6, rtol=1e-5)
    finally:
        dist.destroy_process_group()


def test_bad_layouts_and_launch_give_clear_errors(monkeypatch):
    with pytest.raises(EtudeError, match="world"):
        build_mesh(4, 2, 3)
    with pytest.raises(EtudeError, match="divide"):
        build_mesh(4, 1, 4, ep=3)
    with pytest.raises(EtudeError, match="RxSxE"):
        parse_layouts("2x2")
    assert parse_layouts("2x2x2,1x4x1f") == [(2, 2, 2, True), (1, 4, 1, False)]
    assert ParallelConfig(dp_replicate=2, dp_shard=2).world == 4
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(EtudeError, match="torchrun"):
        init_from_env()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ETUDE_TEST_RAY") != "1", reason="~3 min on 2 cores: set ETUDE_TEST_RAY=1")
def test_ray_train_workers_run_the_same_config(tmp_path):
    import ray

    from etude.scale.parallel import launch_ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        r = launch_ray(ParallelConfig(dp_shard=2, ep=2), storage_path=str(tmp_path / "ray"))
    finally:
        ray.shutdown()
    assert abs(r["loss"] - r["ref_loss"]) < TOL and r["max_grad_diff"] < TOL
