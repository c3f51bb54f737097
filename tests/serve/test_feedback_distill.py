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
