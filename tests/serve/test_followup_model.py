"""The optional follow-up model: the rules decide first, the model labels only what they miss."""

from __future__ import annotations

import openai
import pytest

from etude.feedback.followup_model import EmbeddingFollowupClassifier, classify


class Always:
    spec = "always"

    def classify(self, message):
        return "dissatisfied", 1.0


def test_rules_take_precedence_and_the_model_fills_in_neutral_only():
    assert classify("thanks, works now", None, Always()) == ("satisfied", "rules")
    assert classify("it still fails", None, Always()) == ("dissatisfied", "rules")
    assert classify("ugh, the output is garbage", None, Always()) == ("dissatisfied", "model:always")
    assert classify("ugh, the output is garbage", None, None) == ("neutral", "rules")


def test_server_labels_a_follow_up_the_rules_miss_with_the_model(server_factory):
    running = server_factory(followup_model="hash")  # lexical hashing embedder: fast, deterministic
    c = openai.OpenAI(base_url=running.base_url, api_key=running.key("acme"), max_retries=0)
    h = {"x-etude-session": "s"}
    c.chat.completions.create(model="auto", extra_headers=h, messages=[{"role": "user", "content": "fix it"}])
    raw = c.chat.completions.with_raw_response.create(model="auto", extra_headers=h, messages=[
        {"role": "user", "content": "fix it"}, {"role": "assistant", "content": "done"},
        {"role": "user", "content": "this is garbage"}])
    msg = running.store.interaction("acme", raw.headers["x-etude-interaction-id"])["messages"][-1]
    assert (msg["label"], msg["label_source"]) == ("dissatisfied", "model:hash")


@pytest.mark.slow
def test_minilm_catches_paraphrased_dissatisfaction():
    clf = EmbeddingFollowupClassifier("minilm")
    assert classify("ugh, the output is garbage", None, clf) == ("dissatisfied", "model:minilm")
    assert classify("nope, same traceback as before", None, clf)[0] == "dissatisfied"
    assert classify("now add a test for the parser", None, clf)[0] == "neutral"
