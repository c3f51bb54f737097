"""MoE routing replay: routes recorded at sampling (KV-cache decode included) are forced in the
training forward; gates stay differentiable; the load-balancing loss matches transformers'."""

from __future__ import annotations

import json

import pytest
import torch

from etude.errors import EtudeError
from etude.scale.moe import (
    RoutedGeneration,
    Routes,
    is_moe,
    pack_routes,
    record_routing,
    replay_routing,
    routes_for_rows,
    tiny_moe,
)

ARCHS = ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral")
PROMPT = 6


def _sample(model, prompt_lens=(6, 4), new=8, seed=0):
    """Left-padded batch through `generate` with the KV cache, routes recorded."""
    g = torch.Generator().manual_seed(seed)
    width = max(prompt_lens)
    ids = torch.zeros((len(prompt_lens), width), dtype=torch.long)
    attn = torch.zeros_like(ids)
    for r, p in enumerate(prompt_lens):
        ids[r, width - p :] = torch.randint(3, 256, (p,), generator=g)
        attn[r, width - p :] = 1
    torch.manual_seed(seed)
    model.generation_config.eos_token_id = None  # always `new` tokens, with no logits processor
    with torch.no_grad(), record_routing(model) as rec:
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=new,
            do_sample=True,
            top_k=0,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
            use_cache=True,
        )
    new_ids = out.sequences[:, width:]
    lps = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1).gather(-1, new_ids[..., None])[..., 0]
    routes = routes_for_rows(rec, width, list(prompt_lens), [new] * len(prompt_lens))
    rows = [(ids[r, width - p :].tolist(), new_ids[r].tolist(), lps[r], routes[r]) for r, p in enumerate(prompt_lens)]
    return rows


def _train_logprobs(model, prompt, completion, routes):
    """Unpadded full forward (what the learner does), replaying `routes` (None: free routing)."""
    seq = torch.tensor([prompt + completion])
    forced = None if routes is None else pack_routes([routes], [seq.shape[1]], routes.shape[0], routes.shape[2])
    with torch.no_grad(), replay_routing(model, forced) as sess:
        logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(completion)[:, None])[:, 0]
    return lp, sess


@pytest.mark.parametrize("arch", ARCHS)
def test_replay_reproduces_sampling_logprobs_and_routes(arch):
    model = tiny_moe(arch)
    for prompt, completion, behav, routes in _sample(model):
        assert routes.shape == (2, len(prompt) + len(completion) - 1, 2)  # layers, tokens minus last, k
        lp, sess = _train_logprobs(model, prompt, completion, routes)
        assert sess.forced_rows == 2 * routes.num_tokens and sess.changed_rows == 0
        torch.testing.assert_close(lp, behav, atol=2e-5, rtol=0)
        used = torch.stack(sess.used)[:, :-1]  # the last position has no recorded route
        assert torch.equal(used, routes.tensor())


def test_replay_pins_routes_after_router_perturbation_and_free_routing_drifts():
    model = tiny_moe("olmoe", experts=8)
    rows = _sample(model, prompt_lens=(8,), new=12)
    prompt, completion, behav, routes = rows[0]
    with torch.no_grad():
        for block in [m for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]:
            block.gate.weight.add_(torch.randn_like(block.gate.weight) * 0.5)
    lp_replay, sess = _train_logprobs(model, prompt, completion, routes)
    lp_free, free = _train_logprobs(model, prompt, completion, None)
    assert torch.equal(torch.stack(sess.used)[:, :-1], routes.tensor())  # replay: identical routes
    assert sess.changed_rows > 0  # the perturbation did flip some routes ...
    free_used = torch.stack(free.used)[:, :-1].sort(-1).values
    assert not torch.equal(free_used, routes.tensor().sort(-1).values)  # ... which free routing follows
    # the flipped routes change what the model computes: replay and free routing disagree
    assert (lp_replay - lp_free).abs().max() > 1e-4


def test_replayed_gates_pass_gradient_to_the_router():
    model = tiny_moe("qwen3_moe").train()
    prompt, completion, _, routes = _sample(model, prompt_lens=(5,), new=4)[0]
    seq = torch.tensor([prompt + completion])
    with replay_routing(model, pack_routes([routes], [seq.shape[1]], 2, 2)):
        model(input_ids=seq, labels=seq).loss.backward()
    grads = [m.gate.weight.grad for m in model.modules() if hasattr(m, "experts") and hasattr(m, "gate")]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("arch", ("olmoe", "mixtral"))
def test_aux_loss_matches_transformers(arch):
    model = tiny_moe(arch)
    ids = torch.randint(3, 256, (2, 9))
    with torch.no_grad(), replay_routing(model, None) as sess:
        out = model(input_ids=ids, output_router_logits=True)
    torch.testing.assert_close(sess.aux_loss(), out.aux_loss.float(), atol=1e-5, rtol=1e-5)


def test_routes_survive_json_and_generation_roundtrip():
    t = torch.randint(0, 64, (3, 17, 2))
    g = RoutedGeneration(text="x", token_ids=(1, 2), logprobs=(-0.1, -0.2), routes=Routes.from_tensor(t))
    d = json.loads(g.to_json())
    assert torch.equal(Routes.from_dict(d["routes"]).tensor(), t)


def test_pack_routes_marks_missing_positions_free_and_rejects_wrong_shapes():
    r = Routes.from_tensor(torch.ones(2, 3, 2, dtype=torch.long))
    packed = pack_routes([r, None], [4, 2], 2, 2)
    assert packed.shape == (2, 6, 2)
    assert (packed[:, :3] == 1).all() and (packed[:, 3:] == -1).all()
    with pytest.raises(EtudeError, match="do not fit"):
        pack_routes([r], [4], 3, 2)
    model = tiny_moe("olmoe")
    with pytest.raises(EtudeError, match="shape"), replay_routing(model, pack_routes([r], [4], 2, 2)):
        model(input_ids=torch.ones(1, 5, dtype=torch.long))


def test_dense_models_are_not_moe():
    from etude.scale.lowp_train import tiny_llama

    assert not is_moe(tiny_llama())
    assert is_moe(tiny_moe("qwen2_moe"))
