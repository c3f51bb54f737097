"""`etude train` with `rollout_backend = "vllm"` on SmolLM2: rollouts and evaluations sampled by a
real vLLM engine, its behaviour log-probs used by the learner's importance correction, the
learner's weights loaded into the same engine after every optimiser step (no restart); the
checkpoint it writes starts an engine of its own."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.vllm


def test_train_with_vllm_rollouts(tmp_path):
    from etude.train import train
    from etude.train.config import EnvConfig, TrainConfig

    cfg = TrainConfig(model="smollm2", steps=2, prompts_per_step=4, group_size=4, max_new_tokens=16,
                      temperature=1.0, lr=1e-5, checkpoint_every=2, eval_problems=2,
                      rollout_backend="vllm", vllm_dtype="float32",
                      env=EnvConfig(name="arith", num_train=16, num_test=4))
    res = train(cfg, tmp_path / "run", progress=False)
    assert res["steps"] == 2 and res["checkpoint"]
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "train"]
    assert [r["policy_version"] for r in steps] == [0, 1]  # step 2 sampled with the synced weights
    assert all(r["weight_sync_s"] > 0 for r in steps)  # weights went to the engine after each step
    # vLLM's behaviour log-probs (fp32 engine) agree with the learner's: IS weights near 1, none
    # cut (steps whose groups all had equal rewards train on nothing and report no IS statistics)
    trained = [r for r in steps if "is_ratio_mean" in r]
    assert trained, steps
    for r in trained:
        assert 0.95 < r["is_ratio_mean"] < 1.05 and r["is_truncated_frac"] == 0.0, r
    assert len([r for r in recs if r["kind"] == "eval"]) == 2
    # the checkpoint (weights beside optimizer and rng tensors) starts an engine of its own, as
    # `etude eval --backend vllm --model CKPT` does, and answers like the engine it was synced into
    from etude.policy.vllm_backend import VLLMPolicy
    from etude.types import Message

    pol = VLLMPolicy(res["checkpoint"], dtype="float32")
    try:
        g = pol.generate([Message("user", "What is 12 + 30?")], max_tokens=8, temperature=0.0)
        assert g.token_ids and g.text
    finally:
        pol.close()
