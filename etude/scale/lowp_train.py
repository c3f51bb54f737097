"""A short language-model training run at a chosen precision recipe, for comparing numerics.

Used by tests and bench/precision.py: the same tiny causal LM, data and seed, trained with
bf16 autocast (the reference) and with emulated FP8 / MXFP8 linears; the loss curves are
compared. On a GPU with torchao the fast kernels replace the emulation (not done here)."""

from __future__ import annotations

import torch

from etude.scale.mx import convert_linears


def tiny_llama(seed: int = 0, vocab: int = 256, hidden: int = 64, layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(cfg)


def synthetic_batches(steps: int, batch: int = 8, seq: int = 32, vocab: int = 256, seed: int = 0):
    """A learnable stream: each sequence counts up from a random start modulo 64 (plus noise tokens)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        start = torch.randint(0, 64, (batch, 1), generator=g)
        yield (start + torch.arange(seq)) % 64 + torch.randint(0, 2, (batch, seq), generator=g) * 64


def train_curve(recipe: str, steps: int = 40, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Loss per step. `recipe`: fp32 | bf16 | fp8_rowwise | mxfp8 (the last two emulated, with
    bf16 autocast around them like the reference)."""
    model = tiny_llama(seed)
    convert_linears(model, recipe)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for ids in synthetic_batches(steps, seed=seed):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe != "fp32"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().item())
    return losses
