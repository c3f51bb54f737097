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
    assert ckpt["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert ckpt["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4) and plain["grad_norm"] > 0
    assert w_plain.keys() == w_ckpt.keys()
    for n in w_plain:
        assert torch.allclose(w_plain[n], w_ckpt[n], atol=1e-6), n
