"""SFTConfig.gradient_checkpointing: the same step, recomputed activations (full weights and LoRA)."""

import pytest
import torch

from etude.train.config import LoraConfig
from etude.train.sft_config import SFTConfig
from etude.train.sft_tokens import Sequence_
from etude.train.sft_train import SFTTrainer


def _step(tmp_path, gc, lora):
    cfg = SFTConfig(model="tiny", precision="fp32", gradient_checkpointing=gc, lora=LoraConfig(enabled=lora), lr=1e-2)
    tr = SFTTrainer(cfg, tmp_path / f"gc{gc}-lora{lora}")
    ids = list(range(5, 69))
    seqs = [Sequence_(ids, [-100] * 40 + ids[40:], "expert"), Sequence_(ids[:30], [-100] * 10 + ids[10:30], "expert")]
    stats = tr.step(seqs, cfg.lr)
    return stats, {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}, tr.model


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointing_gives_the_same_step(tmp_path, lora):
    plain, w_plain, _ = _step(tmp_path, False, lora)
    ckpt, w_ckpt, model = _step(tmp_path, True, lora)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())  # it is on
    assert model.config.use_cache is not False  # an exported model still generates with a KV cache
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4) and plain["grad_norm"] > 0
    assert w_plain.keys() == w_ckpt.keys()
    for n in w_plain:
        assert torch.allclose(w_plain[n], w_ckpt[n], atol=1e-6), n


def test_the_rl_learner_gets_the_same_gradients_with_checkpointing():
    """TrainConfig.gradient_checkpointing: a packed tree-masked micro-batch (shared prompt, several
    replies) backpropagates to the same gradients, LoRA or not."""
    import random

    from etude.train.config import TrainConfig
    from etude.train.learner import Learner, Sample
    from etude.train.losses import token_weights

    rng = random.Random(0)
    prompt = [rng.randrange(100, 2000) for _ in range(12)]
    samples = [Sample(prompt, c, [-2.0] * len(c), advantage=a)
               for a, c in ((a, [rng.randrange(100, 2000) for _ in range(rng.randint(2, 6))]) for a in (1.0, -1.0, 0.5, -0.5))]
    for s, w in zip(samples, token_weights([len(s.completion_ids) for s in samples], "token_mean"), strict=True):
        s.weight = w
    for lora in (False, True):
        grads = []
        for gc in (False, True):
            torch.manual_seed(0)
            lr = Learner(TrainConfig(model="tiny", temperature=1.0, precision="fp32", gradient_checkpointing=gc, share_prefix=True,
                                     lora=LoraConfig(enabled=lora)))
            assert any(getattr(m, "gradient_checkpointing", False) for m in lr.model.modules()) == gc
            lr.model.train()
            lr.opt.zero_grad(set_to_none=True)
            lr.backward([samples])
            grads.append([p.grad.clone() for p in lr.params])
        assert any(float(g.abs().sum()) > 0 for g in grads[0])
        for a, b in zip(*grads, strict=True):
            assert torch.allclose(a, b, atol=1e-6)
