"""LocalPolicy on the tiny random model: shapes, behaviour log-probs, batching, weight swaps."""

from __future__ import annotations

import pytest
import torch

from etude.errors import EtudeError
from etude.policy.local import LocalPolicy, load_model
from etude.protocols import (
    BatchPolicy,
    ModelPolicy,
    NativeToolsPolicy,
    Policy,
    SubmitPolicy,
    TokenizerPolicy,
    TokenPolicy,
)
from etude.types import Message, ToolCall


@pytest.fixture(scope="module")
def tiny() -> LocalPolicy:
    return LocalPolicy.from_pretrained("tiny")


def _conv(text: str) -> list[Message]:
    return [Message("system", "You are terse."), Message("user", text)]


def _full_forward_logprobs(pol: LocalPolicy, prompt, completion, temperature: float) -> torch.Tensor:
    ids = torch.tensor([list(prompt) + list(completion)])
    with torch.no_grad():
        logits = pol.model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def test_implements_policy_protocol(tiny):
    assert isinstance(tiny, Policy)
    assert tiny.native_tools is False
    for proto in (TokenPolicy, BatchPolicy, NativeToolsPolicy, ModelPolicy, TokenizerPolicy):
        assert isinstance(tiny, proto), proto.__name__
    assert not isinstance(tiny, SubmitPolicy)  # no engine of its own: serving batches in front of it


def test_generation_fields_are_consistent(tiny):
    g = tiny.generate(_conv("hi"), [], max_tokens=7, temperature=1.0, seed=1)
    assert g.prompt_token_ids == tuple(tiny.encode_prompt(_conv("hi")))
    assert 1 <= len(g.token_ids) <= 7
    assert len(g.logprobs) == len(g.token_ids)
    assert all(lp <= 0 for lp in g.logprobs)
    assert g.policy_id == tiny.id and g.policy_version == tiny.version
    assert g.finish_reason in ("stop", "length")


def test_batched_logprobs_match_a_full_forward_pass(tiny):
    """Left padding + KV cache must not change the behaviour log-probs the trainer relies on."""
    convs = [_conv("a"), _conv("a much longer request with many more tokens in it than the first")]
    gens = tiny.generate_batch(convs, n=2, max_tokens=6, temperature=0.8, seed=3)
    assert len(gens) == 4
    assert gens[0].prompt_token_ids == gens[1].prompt_token_ids != gens[2].prompt_token_ids
    for g in gens:
        ref = _full_forward_logprobs(tiny, g.prompt_token_ids, g.token_ids, 0.8)
        assert torch.allclose(ref, torch.tensor(g.logprobs), atol=1e-4)


def test_top_p_renormalises_so_behaviour_logprob_is_not_below_full_softmax(tiny):
    g = tiny.generate(_conv("hello"), max_tokens=8, temperature=1.0, top_p=0.5, seed=0)
    full = _full_forward_logprobs(tiny, g.prompt_token_ids, g.token_ids, 1.0)
    assert (torch.tensor(g.logprobs) >= full - 1e-5).all()
    assert (torch.tensor(g.logprobs) > full + 1e-3).any()  # truncation did something


def test_seed_makes_sampling_reproducible(tiny):
    a = tiny.generate(_conv("x"), max_tokens=8, temperature=1.0, seed=42)
    b = tiny.generate(_conv("x"), max_tokens=8, temperature=1.0, seed=42)
    assert a.token_ids == b.token_ids


def test_load_weights_bumps_version_and_changes_samples(tiny, tmp_path):
    from safetensors.torch import save_file

    before = tiny.version
    prompt = tiny.encode_prompt(_conv("x"))
    g0 = tiny.generate_ids([prompt], max_tokens=4, temperature=0.0)[0]
    state = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    noisy = {k: v + 0.5 * torch.randn_like(v) for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in noisy.items() if k != "lm_head.weight"}, str(tmp_path / "model.safetensors"))
    assert tiny.load_weights(tmp_path) == before + 1
    g1 = tiny.generate_ids([prompt], max_tokens=4, temperature=0.0)[0]
    assert g1.policy_version == before + 1
    assert g1.logprobs != g0.logprobs
    assert tiny.load_weights(state, version=7) == 7
    assert tiny.generate_ids([prompt], max_tokens=4, temperature=0.0)[0].token_ids == g0.token_ids
    with pytest.raises(EtudeError):
        tiny.load_weights({"not.a.weight": torch.zeros(1)})


def test_assistant_tool_calls_are_rendered_as_text(tiny):
    call = ToolCall(id="1", name="read_file", arguments={"path": "a.py"})
    msgs = _conv("read a.py") + [Message("assistant", "", tool_calls=(call,)), Message("tool", "print(1)", tool_call_id="1")]
    text = tiny.tokenizer.decode(tiny.encode_prompt(msgs))
    assert '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>' in text


def test_prompt_longer_than_context_yields_empty_length_generation(tiny):
    g = tiny.generate_ids([[5] * (tiny.context_length() + 1)], max_tokens=4)[0]
    assert g.finish_reason == "length" and g.token_ids == ()


def test_unknown_model_name_is_a_clear_error():
    with pytest.raises(EtudeError, match="unknown model"):
        load_model("no-such-model")


def test_make_policy_builds_the_local_backend():
    from etude.policy import make_policy

    pol = make_policy("tiny")
    assert isinstance(pol, LocalPolicy) and pol.id == "tiny"


def test_vllm_backend_imports_without_vllm_and_fails_clearly():
    import importlib.util

    from etude.policy import vllm_backend

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(EtudeError, match="vllm"):
        vllm_backend.VLLMPolicy("/nonexistent")


def test_a_group_prefilled_once_samples_what_separate_prompts_would():
    """n > 1 prefills each prompt once and repeats its KV cache: same tokens and log-probs as
    sampling n copies of the prompt one by one (same seed)."""
    pol = LocalPolicy.from_pretrained("tiny")
    prompts = [[1, 520, 33, 2, 900], [1, 77, 12]]
    grouped = pol.generate_ids(prompts, n=3, max_tokens=6, temperature=1.0, seed=7)
    copies = pol.generate_ids([p for p in prompts for _ in range(3)], n=1, max_tokens=6, temperature=1.0, seed=7)
    assert [g.prompt_token_ids for g in grouped] == [tuple(p) for p in prompts for _ in range(3)]
    for a, b in zip(grouped, copies, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_unseeded_calls_draw_fresh_samples_and_a_seed_repeats():
    pol = LocalPolicy.from_pretrained("tiny")
    prompt = [[1, 520, 33, 2]]
    a = pol.generate_ids(prompt, n=4, max_tokens=8, temperature=1.0)
    b = pol.generate_ids(prompt, n=4, max_tokens=8, temperature=1.0)
    assert [g.token_ids for g in a] != [g.token_ids for g in b]  # the global RNG moved on
    s1 = pol.generate_ids(prompt, n=4, max_tokens=8, temperature=1.0, seed=3)
    s2 = pol.generate_ids(prompt, n=4, max_tokens=8, temperature=1.0, seed=3)
    assert [g.token_ids for g in s1] == [g.token_ids for g in s2]
