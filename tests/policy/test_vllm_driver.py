"""VLLMPolicy's serving driver (continuous batching) on a scripted stand-in for `vllm.LLM`: the
only fake, in place of an engine this environment cannot run (tests/vllm runs the real one).

Requests handed over with `submit_ids` run together and each returns when it is done; outputs
named by vLLM's external id reach the request filed under the internal id `LLM.enqueue`
returns; a dead engine fails every request in flight and every later submit; while the driver
runs, `generate_ids` joins it and weights cannot be swapped under running requests."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from etude.errors import EtudeError
from etude.policy.vllm_backend import EngineView, VLLMPolicy
from etude.protocols import BatchPolicy, NativeToolsPolicy, Policy, SubmitPolicy, TokenizerPolicy, TokenPolicy


class ScriptedEngine:
    """`LLM.enqueue` + `llm_engine.step()`: request k (external id "k", internal "k-<8 chars>")
    samples token 100 + k once per step until it has max_tokens tokens. Steps wait for `go`."""

    def __init__(self, fail_at_step: int | None = None):
        self.go = threading.Event()
        self.stepping = threading.Event()  # set once a step has begun (and holds the engine lock)
        self.running: dict[str, dict] = {}
        self.counter = 0
        self.steps = 0
        self.fail_at_step = fail_at_step
        self.llm_engine = SimpleNamespace(step=self.step)

    def enqueue(self, prompts, params, lora_request=None, use_tqdm=True):
        (p,), (sp,) = prompts, params
        ext = str(self.counter)
        self.counter += 1
        self.running[ext] = {"prompt": p["prompt_token_ids"], "n": sp.max_tokens, "ids": []}
        return [f"{ext}-a1b2c3d4"]

    def step(self):
        self.stepping.set()
        self.go.wait(timeout=30)
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("EngineDeadError: engine core died")
        done = []
        for ext, r in list(self.running.items()):
            r["ids"].append(100 + int(ext))
            if len(r["ids"]) >= r["n"]:
                del self.running[ext]
                out = SimpleNamespace(index=0, token_ids=list(r["ids"]),
                                      logprobs=[{t: SimpleNamespace(logprob=-0.25)} for t in r["ids"]])
                done.append(SimpleNamespace(request_id=ext, finished=True, outputs=[out]))
        return done

    def generate(self, *a, **k):
        raise AssertionError("LLM.generate while the driver steps the engine: outputs would be taken")


class FakeTokenizer:
    eos_token_id = 2
    unk_token_id = 0

    def convert_tokens_to_ids(self, tok):
        return 3

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


class DrivenPolicy(VLLMPolicy):
    """A VLLMPolicy around the scripted engine (no model, no vLLM)."""

    def __init__(self, llm):  # noqa: D107 - deliberately not VLLMPolicy.__init__ (it starts an engine)
        self._vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw))
        self.llm, self.tokenizer, self.id, self.version, self.top_p = llm, FakeTokenizer(), "base", 3, 1.0
        self._limit, self._tied, self._view, self.engine_kw = 64, False, None, {}
        self._lock, self._driver, self._adapters = threading.Lock(), None, {}
        self._driver_lock = threading.Lock()


@pytest.fixture
def engine():
    llm = ScriptedEngine()
    pol = DrivenPolicy(llm)
    yield llm, pol
    llm.go.set()
    pol.close()


def test_declares_its_capabilities_through_the_shared_chat_template_base(engine):
    _, pol = engine
    for proto in (Policy, TokenPolicy, BatchPolicy, SubmitPolicy, NativeToolsPolicy, TokenizerPolicy):
        assert isinstance(pol, proto), proto.__name__
    assert pol.stop_token_ids == [2, 3]  # the tokenizer's EOS and end-of-turn token (ChatTemplatePolicy)


def test_requests_run_together_and_each_returns_its_own_tokens(engine):
    llm, pol = engine
    futures = [pol.submit_ids([1, 2, i], max_tokens=3 + i % 2, temperature=1.0) for i in range(24)]
    assert pol.engine_stats()["max_in_flight"] == 24  # no cap in front of the engine
    llm.go.set()
    gens = [f.result(timeout=30) for f in futures]
    by_prompt = {g.prompt_token_ids: g for g in gens}
    assert len(by_prompt) == 24
    for i in range(24):
        g = by_prompt[(1, 2, i)]
        assert len(g.token_ids) == len(g.logprobs) == 3 + i % 2 and len(set(g.token_ids)) == 1
        assert g.logprobs[0] == -0.25 and g.finish_reason == "length" and (g.policy_id, g.policy_version) == ("base", 3)
    st = pol.engine_stats()
    assert st["in_flight"] == 0 and st["seqs"] / st["steps"] > 1  # the engine ran them together


def test_a_request_is_handed_over_while_a_step_holds_the_engine(engine):
    """submit_ids runs on the server's event loop: it must not wait for the step in progress."""
    llm, pol = engine
    first = pol.submit_ids([1], max_tokens=2)
    assert llm.stepping.wait(timeout=20)  # the driver is inside a step, holding the engine lock
    handed: list = []
    t = threading.Thread(target=lambda: handed.append(pol.submit_ids([2], max_tokens=2)), daemon=True)
    t.start()
    t.join(timeout=20)  # a liveness bound, not a timing: with the engine lock it waits for `go` forever
    assert handed and not llm.go.is_set() and not handed[0].done()
    llm.go.set()
    assert len(first.result(timeout=30).token_ids) == len(handed[0].result(timeout=30).token_ids) == 2


def test_a_prompt_that_leaves_no_room_is_answered_empty_without_the_engine(engine):
    llm, pol = engine
    g = pol.submit_ids(list(range(64)), max_tokens=4).result(timeout=5)
    assert g.token_ids == () and g.finish_reason == "length" and llm.counter == 0


def test_generate_ids_joins_the_driver_once_it_runs(engine):
    llm, pol = engine
    first = pol.submit_ids([5], max_tokens=2)
    llm.go.set()
    first.result(timeout=30)
    gens = pol.generate_ids([[7], [8]], max_tokens=2, temperature=1.0)  # ScriptedEngine.generate would raise
    assert [g.prompt_token_ids for g in gens] == [(7,), (8,)] and all(len(g.token_ids) == 2 for g in gens)


def test_weights_are_not_swapped_under_running_requests(engine):
    llm, pol = engine
    fut = pol.submit_ids([5], max_tokens=2)
    with pytest.raises(EtudeError, match="in flight"):
        pol.load_weights({})
    llm.go.set()
    fut.result(timeout=30)


def test_a_dead_engine_fails_every_request_and_refuses_new_ones():
    llm = ScriptedEngine(fail_at_step=1)
    pol = DrivenPolicy(llm)
    futures = [pol.submit_ids([i], max_tokens=4) for i in range(3)]
    llm.go.set()
    for f in futures:
        with pytest.raises(EtudeError, match="engine step failed: RuntimeError: EngineDeadError"):
            f.result(timeout=30)
    with pytest.raises(EtudeError, match="cannot take requests"):
        pol.submit_ids([9], max_tokens=2)
    pol.close()


def test_close_fails_what_is_still_waiting():
    llm = ScriptedEngine()
    pol = DrivenPolicy(llm)
    fut = pol.submit_ids([1], max_tokens=50)
    threading.Timer(0.5, llm.go.set).start()  # the step in progress ends; the next loop sees the close
    pol.close()
    with pytest.raises(EtudeError, match="closed"):
        fut.result(timeout=30)


def test_a_view_restamps_its_checkpoint_name_and_version(engine):
    llm, pol = engine
    view = EngineView(pol, "acme-v7", 7)
    fut = view.submit_ids([4, 4], max_tokens=2)
    llm.go.set()
    g = fut.result(timeout=30)
    assert (g.policy_id, g.policy_version, g.prompt_token_ids) == ("acme-v7", 7, (4, 4))
    assert view.engine_stats() == pol.engine_stats()
