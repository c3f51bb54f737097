"""A checkpoint on an engine that batches by itself (the vllm backend) is served without the
batcher's max_batch cap: the real app and store in front of a gate engine (the only fake) that
answers nothing until N requests are in flight at once. Behind a Batcher with max_batch 4 it
would never see more than 4. Also: the pool hands such a policy an EngineQueue, tells the
loader when it unloads a checkpoint, and VLLMLoader closes an engine only once no loaded
checkpoint uses it."""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from etude.policy.batcher import Batcher, EngineQueue, Job
from etude.protocols import SubmitPolicy
from etude.serve import pool as pool_mod
from etude.serve.pool import PolicyPool, VLLMLoader
from etude.serve.registry import Checkpoint
from etude.types import Generation, Message

SESSIONS = 20


class GateEngine(SubmitPolicy):
    """Holds every request until `release_at` are in flight, then answers them all; a guard timer
    answers whatever it holds after 60 s and records that the gate never opened."""

    native_tools = False

    def __init__(self, id: str, version: int, release_at: int):
        self.id, self.version, self.release_at = id, version, release_at
        self.held: list[tuple[list[int], Future]] = []
        self.most_held = 0
        self.timed_out = False
        self._lock = threading.Lock()
        self._guard = threading.Timer(60, self._open, kwargs={"timed_out": True})
        self._guard.daemon = True
        self._guard.start()

    def encode_prompt(self, messages):
        return [1, 2, *(len(m.content) for m in messages)]

    def context_length(self) -> int:
        return 4096

    def submit_ids(self, prompt, *, max_tokens=16, temperature=0.7, top_p=None, **_):
        fut: Future = Future()
        with self._lock:
            self.held.append((list(prompt), fut))
            self.most_held = max(self.most_held, len(self.held))
            full = len(self.held) >= self.release_at
        if full:
            self._open()
        return fut

    def _open(self, timed_out: bool = False) -> None:
        with self._lock:
            held, self.held = self.held, []
            self.timed_out |= timed_out and bool(held)
        for prompt, fut in held:
            fut.set_result(Generation(text="done", prompt_token_ids=tuple(prompt), token_ids=(5, 6), logprobs=(-0.1, -0.2),
                                      finish_reason="stop", policy_id=self.id, policy_version=self.version))


def test_twenty_sessions_are_in_flight_at_once_on_an_engine_that_batches_itself(server_factory):
    engines: dict[str, GateEngine] = {}

    def loader(cp):
        engines[cp.name] = GateEngine(cp.name, cp.version, SESSIONS)
        return engines[cp.name]

    running = server_factory(loader=loader, max_batch=4)
    key = running.key("acme")

    def ask(s: int) -> httpx.Response:
        return httpx.post(f"{running.base_url}/chat/completions", timeout=120,
                          headers={"Authorization": f"Bearer {key}", "x-etude-session": f"s{s}"},
                          json={"model": "auto", "messages": [{"role": "user", "content": f"fix bug {s}"}],
                                "max_tokens": 8})

    with ThreadPoolExecutor(SESSIONS) as ex:
        answers = list(ex.map(ask, range(SESSIONS)))
    assert [a.status_code for a in answers] == [200] * SESSIONS
    (eng,) = engines.values()
    assert eng.most_held == SESSIONS and not eng.timed_out  # the gate opened: nothing capped them at 4
    recs = [running.store.interaction("acme", a.json()["id"]) for a in answers]
    assert sorted(r["params"]["batch_size"] for r in recs)[-1] == SESSIONS  # in flight when the last was handed over
    assert all(r["completion_token_ids"] == [5, 6] and r["logprobs"] == [-0.1, -0.2] for r in recs)
    health = httpx.get(running.base_url.removesuffix("/v1") + "/health").json()["batching"]
    (stats,) = health.values()
    assert stats["kind"] == "engine" and stats["jobs"] == SESSIONS and stats["max_batch"] == SESSIONS


def _cp(name: str, path: str | Path = "fake", version: int = 0) -> Checkpoint:
    return Checkpoint(name=name, path=str(path), version=version, state="production")


def test_the_pool_gives_an_engine_queue_to_a_policy_that_batches_itself_and_releases_unloaded_ones():
    released: list[str] = []

    class Loader:
        def __call__(self, cp):
            return GateEngine(cp.name, 0, 1) if cp.name.startswith("vllm") else _Plain()

        def release(self, name):
            released.append(name)

    pool = PolicyPool(Loader(), max_loaded=1)
    assert isinstance(pool.get(_cp("vllm-a")), EngineQueue)
    assert isinstance(pool.get(_cp("hf-b")), Batcher)
    assert released == ["vllm-a"]
    pool.close()


class _Plain:
    id, version, native_tools = "plain", 0, False

    def generate(self, messages, tools=(), **kw):
        return Generation(text="x")


def test_an_engine_queue_passes_errors_on_and_counts_what_is_in_flight():
    class Refusing(GateEngine):
        def submit_ids(self, prompt, **kw):
            fut: Future = Future()
            fut.set_exception(RuntimeError("adapter failed to load"))
            return fut

    q = EngineQueue(Refusing("x", 0, 1))
    job = Job([Message("user", "hi")], [1, 2], 8, 0.7, None)
    with pytest.raises(RuntimeError, match="adapter failed"):
        q.submit(job).result(timeout=5)
    assert q.waiting() == 0 and q.stats.jobs == 1
    gate = GateEngine("y", 0, 3)
    q = EngineQueue(gate)
    futs = [q.submit(Job([Message("user", "hi")], [1, i], 8, 0.7, None)) for i in range(2)]
    assert q.waiting() == 2 and not any(f.done() for f in futs)
    gate._open()
    assert [f.result(timeout=5).text for f in futs] == ["done", "done"] and q.waiting() == 0
    q.close()
    with pytest.raises(RuntimeError, match="unloaded"):
        q.submit(job)


class FakeVLLMPolicy:
    """Stands in for VLLMPolicy in VLLMLoader (no vLLM here): records adapters, views, close."""

    def __init__(self, model, **kw):
        self.model_dir, self.closed, self.adapters = model, False, {}

    def add_adapter(self, name, path):
        self.adapters[name] = path

    def view(self, name, *, version=0, adapter=None):
        return (self, name, version, adapter)

    def close(self):
        self.closed = True


def test_vllm_loader_closes_an_engine_only_when_no_loaded_checkpoint_uses_it(tmp_path, monkeypatch):
    monkeypatch.setattr(pool_mod, "VLLMPolicy", FakeVLLMPolicy)
    base, other, adapter = tmp_path / "base", tmp_path / "candidate", tmp_path / "acme-lora"
    for d in (base, other, adapter):
        d.mkdir()
    for d in (base, other):
        (d / "config.json").write_text("{}")
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    loader = VLLMLoader()
    prod, lora, cand = loader(_cp("prod", base)), loader(_cp("acme-v2", adapter, 2)), loader(_cp("cand", other))
    assert prod[0] is lora[0] and lora[3] == "acme-v2" and cand[0] is not prod[0]  # the adapter shares the base's engine
    loader.release("prod")
    assert not prod[0].closed  # the adapter still uses it
    loader.release("cand")
    assert cand[0].closed and list(loader.engines) == [str(base)]
    loader.release("acme-v2")
    assert prod[0].closed and loader.engines == {}
