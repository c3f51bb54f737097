"""An organisation's LoRA adapter (peft, on the tiny model) served by the real loader: usable by
its org under its own name, invisible to every other org, its answers logged under its name."""

from __future__ import annotations

import openai
import pytest

from etude.serve import registry


@pytest.fixture
def adapter_dir(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from etude.policy.models import load_model

    model, tok = load_model("tiny")
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():  # a visible change, so the adapter really alters the outputs
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    out = tmp_path / "acme-lora"
    peft_model.save_pretrained(out)
    return out


@pytest.mark.slow
def test_org_adapter_is_served_to_its_org_only(server_factory, adapter_dir):
    running = server_factory(real_loader=True, model="tiny", max_tokens_limit=64)
    registry.register_checkpoint(running.store, "acme-lora", str(adapter_dir), org="acme", version=7)
    acme = openai.OpenAI(base_url=running.base_url, api_key=running.key("acme"), max_retries=0)
    other = openai.OpenAI(base_url=running.base_url, api_key=running.key("globex"), max_retries=0)
    msgs = [{"role": "user", "content": "hello"}]
    r = acme.chat.completions.create(model="acme-lora", messages=msgs, max_tokens=5, temperature=0)
    base = acme.chat.completions.create(model="tiny", messages=msgs, max_tokens=5, temperature=0)
    assert r.model == "acme-lora" and base.model == "tiny"
    rec, base_rec = (running.store.interaction("acme", x.id) for x in (r, base))
    assert rec["checkpoint"] == "acme-lora" and rec["policy_version"] == 7
    assert rec["completion_token_ids"] != base_rec["completion_token_ids"]  # greedy: only the weights differ
    with pytest.raises(openai.NotFoundError):
        other.chat.completions.create(model="acme-lora", messages=msgs, max_tokens=5)
