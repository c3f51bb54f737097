"""Feedback client + distillation over the real server: every interaction gets a reward (broken
calls and clarification-only answers included), behaviour log-probs come from the store, stale
checkpoints are excluded and counted."""

from __future__ import annotations

import openai
import pytest

from etude.errors import EtudeError
from etude.feedback import AgentWrite, measure_edit_persistence, report_edit_persistence, report_feedback
from etude.loop.distill import DistillConfig, distill
from etude.serve import registry

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def _ask(c, content, session=None, model="auto", messages=None, **kw):
    h = {"x-etude-session": session} if session else {}
    raw = c.chat.completions.with_raw_response.create(
        model=model, user="u1", extra_headers=h, messages=messages or [{"role": "user", "content": content}], **kw)
    return raw.headers["x-etude-interaction-id"], raw.parse()


def test_measure_edit_persistence_reads_the_repository_on_disk(tmp_path):
    (tmp_path / "a.py").write_text("def add(a, b):\n    return a + b\n")
    edits = [AgentWrite("a.py", "def add(a, b):\n    return a + b\n"), AgentWrite("gone.py", "x = 1\ny = 2\n")]
    rep = measure_edit_persistence(tmp_path, edits)
    assert rep.per_file["a.py"] == 1.0 and rep.per_file["gone.py"] == 0.0
    assert 0.5 < rep.score < 1.0 and rep.ranges == 2
    (tmp_path / "b.py").write_text("old = True\n")
    assert measure_edit_persistence(tmp_path, [AgentWrite("b.py", "new = False\n", "old = True\n")]).reverted


def test_distill_scores_every_interaction_with_feedback_and_logprobs(server, tmp_path):
    key = server.key("acme")
    c = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    registry.register_checkpoint(server.store, "v2", "fake", version=2)

    plain, _ = _ask(c, "fix the bug", session="s1", model="v2")
    _ask(c, None, session="s1", model="v2", messages=[
        {"role": "user", "content": "fix the bug"}, {"role": "assistant", "content": "echo"},
        {"role": "user", "content": "that's wrong, it still fails"}])
    broken, _ = _ask(c, "broken call please", model="v2", tools=TOOLS)
    question, _ = _ask(c, "can you fix it?", model="v2")
    tooled, resp = _ask(c, "use a tool", session="s2", model="v2", tools=TOOLS)
    call = resp.choices[0].message.tool_calls[0]
    after_tool, _ = _ask(c, None, session="s2", model="v2", tools=TOOLS, messages=[
        {"role": "user", "content": "use a tool"},
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Error: no such file a.py"}])
    stale, _ = _ask(c, "old model", model="fake")

    (tmp_path / "m.py").write_text("def f():\n    return 1\n")
    written = [AgentWrite("m.py", "def f():\n    return 1\n\ndef g():\n    return 2\n")]
    report_edit_persistence(server.base_url, key, tmp_path, written, interaction_id=plain, delay_s=0)
    report_feedback(server.base_url, key, session_id="s2", kind="retry")  # names the session's newest turn
    with pytest.raises(EtudeError):
        report_feedback(server.base_url, server.key("other"), plain, "accept")

    res = distill(server.store, "acme", config=DistillConfig(max_staleness=1, reference_version=2))
    by_id = {s.interaction_id: s for s in res}
    assert res.n_interactions == 7 and len(res) == 6
    assert res.excluded_stale == 1 and res.excluded_by_checkpoint == {"fake": 1} and stale not in by_id

    p = by_id[plain]
    persisted = measure_edit_persistence(tmp_path, written).score
    assert p.reward.terms["edit_persistence"] == pytest.approx(2 * persisted - 1)
    assert p.reward.terms["followup"] == -1.0  # the next user message was dissatisfied
    rec = server.store.interaction("acme", plain)
    assert list(p.behaviour_logprobs) == rec["logprobs"] and p.policy_version == 2
    assert list(p.prompt_token_ids) == rec["prompt_token_ids"]

    assert by_id[broken].reward.terms["broken_calls"] < 0  # malformed call: kept and penalised
    assert by_id[question].reward.terms["needless_clarification"] == -1.0
    assert by_id[tooled].reward.terms["broken_calls"] < 0  # its tool result came back as an error
    assert all(s.reward.terms["latency"] is not None for s in res)
    assert by_id[after_tool].reward.terms["followup"] == -1.0  # a retry event implies dissatisfied

    ep = p.to_episode()
    assert ep.turns[0].logprobs == rec["logprobs"] and ep.reward == p.reward.total and ep.policy_version == 2

    # default reference: the production checkpoint's version
    registry.promote(server.store, "v2")
    assert distill(server.store, "acme", config=DistillConfig(max_staleness=2)).excluded_stale == 0
    assert distill(server.store, "acme", config=DistillConfig(max_staleness=1)).excluded_stale == 1
    assert len(distill(server.store, "other")) == 0


def test_distilled_rewards_rank_a_correct_answer_above_a_wrong_one(server):
    """The same request answered twice over the real server (two turns each: a tool call, then
    the answer). One user keeps the change (accept, edits persisting); the other rejects it,
    reverts it and complains; the complaint's answer is accepted. Every turn carries the verdict
    on its own change: each turn of the kept answer outranks each turn of the rejected one,
    the follow-up's answer is judged by its own verdict, and latency is never saturated."""
    key = server.key("acme")
    c = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    request = "use a tool to fix the failing test in parser.py"

    def episode(session, user, history=()):
        msgs = [*history, {"role": "user", "content": request if not history else "that's wrong, it still fails; use a tool again"}]
        raw = c.chat.completions.with_raw_response.create(model="auto", user=user, tools=TOOLS, messages=msgs,
                                                          extra_headers={"x-etude-session": session})
        first, resp = raw.headers["x-etude-interaction-id"], raw.parse()
        call = resp.choices[0].message.tool_calls[0]
        msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id, "content": "def parse(s):\n    return s\n"}]
        second, _ = _ask(c, None, session=session, messages=msgs, tools=TOOLS)
        return [first, second], msgs

    good, _ = episode("s-good", "u-good")
    bad, history = episode("s-bad", "u-bad")
    fix, _ = episode("s-bad", "u-bad", history=history)  # the dissatisfied follow-up and its answer
    report_feedback(server.base_url, key, good[0], "edit_persistence", 0.9, {"reverted": False})
    report_feedback(server.base_url, key, good[-1], "accept")
    report_feedback(server.base_url, key, bad[0], "edit_persistence", 0.0, {"reverted": True})
    report_feedback(server.base_url, key, bad[-1], "reject")
    report_feedback(server.base_url, key, fix[-1], "accept")

    by_id = {s.interaction_id: s for s in distill(server.store, "acme")}
    total = lambda i: by_id[i].reward.total  # noqa: E731
    assert min(total(i) for i in good) > max(total(i) for i in bad)
    for i in good:
        assert by_id[i].reward.terms["accept"] == 1.0 and by_id[i].trajectory.meta["episode"].startswith("s-good#0")
    for i in bad:  # the verdict and the complaint reach the turn they were not posted on too
        assert by_id[i].reward.terms["accept"] == -1.0 and by_id[i].reward.terms["followup"] == -1.0
    assert by_id[good[0]].reward.terms["edit_persistence"] == pytest.approx(0.8)
    assert by_id[good[1]].reward.terms["edit_persistence"] is None  # persistence judges the turn that wrote
    for i in fix:  # the follow-up's answer is an episode of its own, judged by its own verdict
        assert by_id[i].trajectory.meta["episode"] == "s-bad#1"
        assert by_id[i].reward.terms["accept"] == 1.0 and by_id[i].reward.terms["followup"] is None
    assert min(total(i) for i in fix) > max(total(i) for i in bad)
    lat = [s.reward.terms["latency"] for s in by_id.values()]
    assert all(-1.0 < x < 1.0 for x in lat)
    assert all(s.trajectory.meta["feedback"]["latency_reference_s"] > 0 for s in by_id.values())


def test_broken_calls_and_clarifications_keep_their_penalty_when_accepted(server):
    """An accepted verdict does not wash out a broken call or a question asked instead of acting."""
    key = server.key("acme")
    c = openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)
    broken, _ = _ask(c, "broken call please", tools=TOOLS)
    question, _ = _ask(c, "can you fix it?")
    plain, _ = _ask(c, "fix it")
    for i in (broken, question, plain):
        report_feedback(server.base_url, key, i, "accept")
    by_id = {s.interaction_id: s for s in distill(server.store, "acme")}
    assert by_id[broken].reward.terms["broken_calls"] < 0 and by_id[question].reward.terms["needless_clarification"] == -1
    assert by_id[broken].reward.total < by_id[plain].reward.total
    assert by_id[question].reward.total < by_id[plain].reward.total
