"""An MoE model behind LocalPolicy and the learner: generations carry routes, the packed training
forward replays them (log-probs match the behaviour ones) and the step reports the aux loss."""

from __future__ import annotations

import pytest
import torch

from etude.scale.moe import RoutedGeneration, tiny_moe
from etude.types import Message


@pytest.fixture(scope="module")
def policy():
    from etude.policy.local import LocalPolicy
    from etude.policy.models import smollm2_tokenizer

    tok = smollm2_tokenizer()
    model = tiny_moe("qwen3_moe", vocab=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
    return LocalPolicy(model, tok, id="tiny-moe")


def _samples(gens):
    from etude.train.learner import Sample

    return [Sample(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), 1.0, routes=g.routes) for g in gens]


@pytest.mark.slow
def test_local_policy_records_routes_and_learner_replays_them(policy):
    from etude.train.learner import packed_logprobs

    convs = [[Message("user", "Add 2 and 3.")], [Message("system", "Be brief."), Message("user", "Hi")]]
    gens = policy.generate_batch(convs, n=2, max_tokens=10, temperature=1.0, seed=3)
    assert all(isinstance(g, RoutedGeneration) and g.routes is not None for g in gens)
    for g in gens:  # prompt + completion minus the last token, for both MoE layers, top-2
        assert g.routes.shape == (2, len(g.prompt_token_ids) + len(g.token_ids) - 1, 2)
    samples = _samples(gens)
    stats: dict[str, list[float]] = {}
    with torch.no_grad():
        lps = packed_logprobs(policy.model, samples, 1.0, stats)  # one packed row, prompts left unpadded
    for lp, g in zip(lps, gens, strict=True):
        torch.testing.assert_close(lp, torch.tensor(g.logprobs), atol=5e-5, rtol=0)
    assert stats["moe_route_changed_frac"] == [0.0] and stats["moe_aux_loss"][0] > 0


@pytest.mark.slow
def test_learner_step_on_moe_reports_aux_loss_and_route_drift(policy):
    from etude.train.config import TrainConfig
    from etude.train.learner import Learner

    gens = policy.generate_batch([[Message("user", "Count to three.")]], n=4, max_tokens=8, temperature=1.0, seed=1)
    samples = _samples(gens)
    for s, a in zip(samples, (1.0, -1.0, 0.5, -0.5), strict=True):
        s.advantage = a
    learner = Learner(TrainConfig(model="tiny", lr=1e-2, ppo_epochs=2, precision="fp32"), model=policy.model,
                      tokenizer=policy.tokenizer)
    gate = next(m.gate.weight for m in policy.model.modules() if hasattr(m, "experts") and hasattr(m, "gate"))
    before = gate.detach().clone()
    stats = learner.step(samples)
    assert stats["moe_aux_loss"] > 0 and 0.0 <= stats["moe_route_changed_frac"] <= 1.0
    assert not torch.equal(before, gate.detach())  # the router learns through the replayed gates


@pytest.mark.slow
def test_train_loop_on_an_moe_model_directory_replays_routes(tmp_path, policy):
    """The whole trainer path (env rollout → TurnSample → Sample → learner) on an MoE checkpoint."""
    from etude.train import TrainConfig, train
    from etude.train.config import EnvConfig
    from etude.train.metrics import read_metrics

    model_dir = tmp_path / "tiny-moe"
    policy.model.save_pretrained(model_dir)
    policy.tokenizer.save_pretrained(model_dir)
    cfg = TrainConfig(model=str(model_dir), steps=2, prompts_per_step=2, group_size=2, max_new_tokens=6, lr=1e-3,
                      checkpoint_every=2, eval_problems=1, env=EnvConfig(name="arith", num_train=8, num_test=1))
    train(cfg, tmp_path / "run", progress=False)
    recs = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert len(recs) == 2
    for r in recs:
        assert r["moe_aux_loss"] > 0
        # step 1 trains on routes sampled by the same weights: replay changes nothing there
        assert 0.0 <= r["moe_route_changed_frac"] <= 1.0
    assert recs[0]["moe_route_changed_frac"] == 0.0
