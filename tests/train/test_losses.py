"""Invariants of the losses and the learner (tiny random model, real packed forward passes)."""

from __future__ import annotations

import random

import pytest
import torch

from etude.policy.local import LocalPolicy
from etude.train.config import TrainConfig
from etude.train.learner import Learner, Sample, pack, packed_logprobs
from etude.train.losses import LossConfig, RunningBaseline, group_advantages, sample_loss, token_weights


@pytest.fixture(scope="module")
def tiny_learner() -> Learner:
    torch.manual_seed(0)
    return Learner(TrainConfig(model="tiny", temperature=1.0, lr=1e-3, max_grad_norm=1e9))


def _samples(n: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = [rng.randrange(100, 2000) for _ in range(rng.randint(3, 9))]
        c = [rng.randrange(100, 2000) for _ in range(rng.randint(2, 6))]
        out.append(Sample(p, c, [-2.0] * len(c), advantage=rng.uniform(-1, 1)))
    w = token_weights([len(s.completion_ids) for s in out], "token_mean")
    for s, wi in zip(out, w, strict=True):
        s.weight = wi
    return out


def _grads(learner: Learner, rows: list[list[Sample]]) -> list[torch.Tensor]:
    learner.opt.zero_grad(set_to_none=True)
    learner.backward(rows)
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in learner.params]


def test_group_advantages_are_centred_and_scaled():
    adv = group_advantages([1, 0, 0, 1, 5, 5, 5, 5], [0, 0, 0, 0, 1, 1, 1, 1])
    assert sum(adv[:4]) == pytest.approx(0, abs=1e-9)
    assert adv[0] == pytest.approx(1.0, rel=1e-4) and adv[1] == pytest.approx(-1.0, rel=1e-4)
    assert adv[4:] == [0.0] * 4  # a group that all agrees carries no signal
    assert group_advantages([1, 0], [0, 0], scale=False) == [0.5, -0.5]


def test_running_baseline_uses_the_mean_before_the_new_reward():
    b = RunningBaseline(decay=0.5)
    assert b.advantages([1.0, 0.0, 1.0], ["a", "a", "b"]) == [0.0, -1.0, 0.0]
    assert b.means["a"] == pytest.approx(0.5)


def test_token_weights_normalise_the_batch():
    lens = [3, 5, 2]
    assert sum(w * n for w, n in zip(token_weights(lens, "token_mean"), lens, strict=True)) == pytest.approx(1)
    assert sum(w * n for w, n in zip(token_weights(lens, "seq_mean"), lens, strict=True)) == pytest.approx(1)
    assert token_weights(lens, "constant", constant_len=10) == [1 / 30] * 3


def test_packing_changes_no_logprob(tiny_learner):
    ss = _samples(5)
    alone = [packed_logprobs(tiny_learner.model, [s], 1.0)[0] for s in ss]
    together = packed_logprobs(tiny_learner.model, ss, 1.0)
    for a, b in zip(alone, together, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_same_gradient_for_one_batch_of_8_and_8_micro_batches_of_1(tiny_learner):
    ss = _samples(8, seed=1)
    g_big = _grads(tiny_learner, [ss])
    g_acc = _grads(tiny_learner, [[s] for s in ss])
    assert any(g.abs().sum() > 0 for g in g_big)
    for a, b in zip(g_big, g_acc, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_zero_advantage_gives_zero_gradient(tiny_learner):
    ss = _samples(4, seed=2)
    for s in ss:
        s.advantage = 0.0
    assert all(float(g.abs().max()) == 0.0 for g in _grads(tiny_learner, [ss]))


def test_importance_ratio_is_one_when_behaviour_is_the_sampler():
    """Log-probs logged by LocalPolicy while sampling must equal what the trainer recomputes."""
    torch.manual_seed(0)
    learner = Learner(TrainConfig(model="tiny", temperature=0.9))
    pol = LocalPolicy(learner.model, learner.tokenizer, id="tiny")
    gens = pol.generate_ids([[1, 520, 33, 2], [1, 77]], n=2, max_tokens=6, temperature=0.9, seed=0)
    ss = [Sample(list(g.prompt_token_ids), list(g.token_ids), list(g.logprobs), 1.0, 0.1) for g in gens]
    stats = learner.backward([ss])
    assert stats["is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert stats["is_ratio_min"] > 0.999 and stats["is_ratio_max"] < 1.001
    assert stats["is_truncated_frac"] == 0.0 and stats["rejected_frac"] == 0.0


def test_truncated_importance_weight_is_capped():
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    behav = torch.tensor([-5.0, -1.0])  # first token: ratio e^4 ≫ cap
    tl = sample_loss(logp, logp, behav, advantage=1.0, weight=1.0, cfg=LossConfig(is_cap=2.0))
    tl.loss.backward()
    assert logp.grad.tolist() == pytest.approx([-2.0, -1.0])
    assert tl.truncated.tolist() == [True, False]


def test_ppo_clip_stops_the_gradient_beyond_the_trust_region():
    logp = torch.tensor([0.0], requires_grad=True)
    prox = torch.tensor([-1.0])  # ratio e ≈ 2.7 > 1 + clip_high
    tl = sample_loss(logp, prox, prox, advantage=1.0, weight=1.0, cfg=LossConfig())
    tl.loss.backward()
    assert float(logp.grad) == 0.0 and tl.clipped.all()


def test_sequence_rejection_drops_a_badly_mismatched_sample():
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    tl = sample_loss(logp, logp, torch.tensor([-4.0, -4.0]), 1.0, 1.0, LossConfig(reject_ratio=3.0))
    assert tl.rejected and float(tl.loss.detach()) == 0.0


def test_kl_to_reference_is_zero_at_the_reference_and_positive_away():
    lp = torch.tensor([-1.0, -2.0])
    cfg = LossConfig(kl_coef=0.1)
    assert sample_loss(lp, lp, lp, 0.0, 1.0, cfg, ref_logp=lp).kl.abs().max() == 0
    assert (sample_loss(lp, lp, lp, 0.0, 1.0, cfg, ref_logp=lp - 0.5).kl > 0).all()


def test_pack_respects_the_budget_and_keeps_every_sample():
    ss = _samples(12, seed=3)
    rows = pack(ss, budget=20)
    assert sorted(i for r in rows for i in r) == list(range(12))
    assert all(sum(ss[i].length for i in r) <= 20 or len(r) == 1 for r in rows)


def _grouped(n_groups: int, group: int, seed: int = 0) -> list[Sample]:
    """GRPO-shaped samples: `group` completions per prompt, prompts repeated, in batch order."""
    rng = random.Random(seed)
    out = []
    for _ in range(n_groups):
        p = [rng.randrange(100, 2000) for _ in range(rng.randint(3, 9))]
        for _ in range(group):
            c = [rng.randrange(100, 2000) for _ in range(rng.randint(1, 6))]
            out.append(Sample(list(p), c, [-2.0] * len(c), advantage=rng.uniform(-1, 1)))
    w = token_weights([len(s.completion_ids) for s in out], "token_mean")
    for s, wi in zip(out, w, strict=True):
        s.weight = wi
    return out


def test_a_shared_prompt_changes_no_logprob(tiny_learner):
    ss = _grouped(3, 4)
    shared = packed_logprobs(tiny_learner.model, ss, 1.0, share_prefix=True)
    alone = [packed_logprobs(tiny_learner.model, [s], 1.0)[0] for s in ss]
    for a, b in zip(alone, shared, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def _same_gradient_shared_or_not(learner, ss: list[Sample]) -> None:
    learner.share = True
    g_shared = _grads(learner, [ss])
    learner.share = False
    try:
        g_full = _grads(learner, [ss])
    finally:
        learner.share = True
    assert any(g.abs().sum() > 0 for g in g_full)
    for a, b in zip(g_shared, g_full, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_a_shared_prompt_gives_the_same_gradient(tiny_learner):
    ss = _grouped(2, 4, seed=3)
    _same_gradient_shared_or_not(tiny_learner, ss)


def test_packing_counts_a_shared_prompt_once():
    ss = _grouped(2, 4, seed=4)
    p0 = len(ss[0].prompt_ids)
    cost0 = p0 + sum(len(s.completion_ids) for s in ss[:4])
    rows = pack(ss, budget=cost0, share_prefix=True)
    assert sorted(i for r in rows for i in r) == list(range(8))  # every sample once
    assert [0, 1, 2, 3] in [sorted(r) for r in rows] or any(set(range(4)) <= set(r) for r in rows)
    # a group over budget is split into chunks that each repeat the prompt, never lost
    small = pack(ss, budget=p0 + 6, share_prefix=True)
    assert sorted(i for r in small for i in r) == list(range(8)) and len(small) > len(rows)


def _episode(turns: int, seed: int) -> list[Sample]:
    """One multi-turn episode's samples: turn k+1's prompt is turn k's prompt + reply + tool output."""
    rng = random.Random(seed)
    prompt = [rng.randrange(100, 2000) for _ in range(rng.randint(4, 9))]
    out = []
    for _ in range(turns):
        c = [rng.randrange(100, 2000) for _ in range(rng.randint(1, 5))]
        out.append(Sample(list(prompt), c, [-2.0] * len(c), advantage=0.7))
        prompt = prompt + c + [rng.randrange(100, 2000) for _ in range(rng.randint(1, 6))]
    return out


def test_an_episode_is_one_sequence_and_changes_no_logprob(tiny_learner):
    from etude.train.learner import _layout

    ss = _episode(4, 1) + _grouped(1, 3, seed=5) + _episode(3, 2)
    ids, _, grp, _, _, _ = _layout(ss, True)
    assert len(set(grp)) == 3  # two episodes (one sequence each) and one shared-prompt group
    assert len(ids) < sum(s.length for s in ss)
    shared = packed_logprobs(tiny_learner.model, ss, 1.0, share_prefix=True)
    alone = [packed_logprobs(tiny_learner.model, [s], 1.0)[0] for s in ss]
    for a, b in zip(alone, shared, strict=True):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)
    # one episode alone in a row: every turn from one causal forward
    ep = _episode(3, 7)
    for a, b in zip([packed_logprobs(tiny_learner.model, [s], 1.0)[0] for s in ep],
                    packed_logprobs(tiny_learner.model, ep, 1.0, share_prefix=True), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_an_episode_gives_the_same_gradient_and_costs_its_last_turn(tiny_learner):
    from etude.train.learner import _units

    ss = _episode(4, 3)
    rows = pack(ss, budget=ss[-1].length, share_prefix=True)
    assert rows == [[0, 1, 2, 3]]  # the whole episode fits in its last turn's length
    assert len(pack(ss, budget=ss[-1].length, share_prefix=False)) > 1
    # a reply re-tokenised differently in the next prompt ends the chain there (still exact, less shared)
    p = list(ss[2].prompt_ids)
    p[len(ss[1].prompt_ids)] += 1
    assert _units(ss[:2] + [Sample(p, ss[2].completion_ids, ss[2].behav_logprobs, 0.7)], True) == [[0, 1], [2]]
    _same_gradient_shared_or_not(tiny_learner, ss)
