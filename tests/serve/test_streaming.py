"""Incremental streaming pieces: the batcher's step hook and the visible-text hold-back."""

from __future__ import annotations

import torch

from etude.policy.batcher import Batcher, Job
from etude.serve.app import VisibleText
from etude.types import Generation


class CharTokenizer:
    """Token id = a character's code point (enough to test incremental decoding)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_visible_text_streams_until_a_tool_call_and_holds_back_a_partial_tag():
    v = VisibleText(CharTokenizer(), hold_tool_calls=True)
    out = [v.add(ord(ch)) for ch in "Let me look. <tool_call>{}"]
    assert "".join(out) == "Let me look. "
    assert all("<" not in piece for piece in out)
    v2 = VisibleText(CharTokenizer(), hold_tool_calls=True)
    assert "".join(v2.add(ord(ch)) for ch in "a <tool") == "a "  # "<tool" might become a tag: held
    assert v2.add(ord("s")) == "<tools"  # ...it did not
    plain = VisibleText(CharTokenizer(), hold_tool_calls=False)
    assert "".join(plain.add(ord(ch)) for ch in "x <tool_call>") == "x <tool_call>"


class StepModel:
    """A stand-in for a transformers model: generate() reports each step to its streamer."""

    def __init__(self, steps):
        self.steps = steps

    def generate(self, streamer=None, **_):
        if streamer is not None:
            streamer.put(torch.tensor([[1, 2, 3]] * len(self.steps[0])))  # the prompt
            for step in self.steps:
                streamer.put(torch.tensor(step))
            streamer.end()


class StepPolicy:
    stop_token_ids = [0]

    def __init__(self, steps):
        self.model = StepModel(steps)
        self.id, self.version = "step", 0

    def encode_prompt(self, messages):
        return [1, 2, 3]

    def generate_ids(self, prompts, max_tokens, temperature, top_p, seed=None):
        self.model.generate()
        return [Generation(text="", prompt_token_ids=tuple(p)) for p in prompts]


def test_the_step_hook_feeds_each_row_its_own_tokens_until_it_stops():
    # row 0 stops (token 0) after two tokens; row 1 runs on but asked for at most 3
    pol = StepPolicy([[11, 21], [12, 22], [0, 23], [0, 24], [0, 25]])
    b = Batcher(pol, wait_ms=50)
    got: dict[int, list[int]] = {0: [], 1: []}
    jobs = [Job(messages=[], prompt_ids=[1, 2, 3], max_tokens=m, temperature=1.0, top_p=1.0,
                on_token=got[r].append) for r, m in ((0, 8), (1, 3))]
    futs = [b.submit(j) for j in jobs]
    for f in futs:
        f.result(timeout=10)
    b.close()
    assert b.steps_visible
    assert got == {0: [11, 12], 1: [21, 22, 23]}
    assert all(j.first_token_at is not None for j in jobs)
