"""Canary metrics read back from a real SQLite store: broken calls, clarifications, edits,
feedback events, per-user rows that etude.experiments.analyze accepts."""

from __future__ import annotations

import json
from pathlib import Path

from etude.experiments import analyze
from etude.loop.distill import distill
from etude.loop.metrics import ab_rows, arm_ratios, interaction_facts
from etude.store import open_store

EXP = "exp-1"


def _log(store, user: str, arm: str, *, content: str = "done", tool_calls=(), parse_errors=(), messages=None,
         tokens: int = 10, session: str | None = None) -> str:
    return store.log_interaction({
        "org_id": "acme", "user_id": user, "session_id": session or f"{user}-{arm}", "checkpoint": f"ck-{arm}",
        "policy_version": 0, "experiment_id": EXP, "arm": arm, "latency_s": 1.0,
        "response": {"content": content, "tool_calls": list(tool_calls), "parse_errors": list(parse_errors)},
        "completion_token_ids": list(range(tokens)), "logprobs": [-0.1] * tokens,
        "messages": messages or [{"role": "user", "content": "fix it"}]})


def _call(cid: str, name: str, args: dict) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


def test_facts_rows_and_ratios_from_the_store(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'e.db'}")
    store.ensure_org("acme")
    # control user: one edit whose result came back as an error, then rejected
    a = _log(store, "u1", "control", tool_calls=[_call("c1", "edit_file", {"path": "a.py", "old_str": "x", "new_str": "y"})],
             session="s1")
    _log(store, "u1", "control", session="s1", messages=[
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "edit_file", "arguments": {}}]},
        {"role": "tool", "content": "Error: old_str not found", "tool_call_id": "c1"}])
    store.log_feedback({"org_id": "acme", "interaction_id": a, "kind": "reject", "data": {}})
    # canary users: a malformed call, a clarification-only answer, an accept
    _log(store, "u2", "canary", parse_errors=["bad JSON in tool call"], tokens=30)
    b = _log(store, "u3", "canary", content="Which file do you mean?", tokens=6)
    store.log_feedback({"org_id": "acme", "interaction_id": b, "kind": "accept", "data": {}})
    store.log_feedback({"org_id": "acme", "interaction_id": b, "kind": "followup", "data": {"label": "dissatisfied"}})
    _log(store, "other", "control")  # same experiment, another user, nothing special
    store.log_interaction({"org_id": "acme", "checkpoint": "x", "policy_version": 0, "user_id": "u9"})  # no experiment

    facts = interaction_facts(store, "acme", EXP)
    assert len(facts) == 5  # the interaction outside the experiment is not read
    by_user = {}
    for f in facts:
        by_user.setdefault(f["user"], []).append(f)
    assert [f["broken"] for f in by_user["u1"]] == [1, 0]  # the failed edit, read from the next request
    assert by_user["u1"][0]["edit"] == 1 and by_user["u1"][0]["reject"] == 1
    assert by_user["u2"][0]["broken"] == 1 and by_user["u2"][0]["clarification"] == 0
    assert by_user["u3"][0]["clarification"] == 1 and by_user["u3"][0]["accept"] == 1
    assert by_user["u3"][0]["dissatisfied"] == 1

    ratios = arm_ratios(facts)
    assert ratios["control"]["interactions"] == 3 and ratios["canary"]["interactions"] == 2
    assert ratios["control"]["tool_error_rate"] == 1 / 3 and ratios["canary"]["tool_error_rate"] == 0.5
    for arm in ("control", "canary"):  # per call: the same broken calls over the calls attempted
        mine = [f for f in facts if f["arm"] == arm]
        assert ratios[arm]["broken_call_rate"] == sum(f["broken"] for f in mine) / sum(f["calls"] for f in mine)
    # every call this traffic made broke: 1 a call, while per interaction it is 1/3 and 0.5
    assert ratios["control"]["broken_call_rate"] == 1.0 == ratios["canary"]["broken_call_rate"]
    assert ratios["canary"]["clarification_rate"] == 0.5 and ratios["control"]["accept_rate"] == 0.0
    assert ratios["canary"]["answer_length"] == 18.0 and ratios["control"]["edit_persistence"] is None

    rows = ab_rows(facts)
    assert {r["arm"] for r in rows} == {"control", "treatment"}
    accept = [r for r in rows if r["metric"] == "accept_rate"]
    assert sorted((r["user_id"], r["numerator"], r["denominator"]) for r in accept) == [("u1", 0, 1), ("u3", 1, 1)]
    res = analyze(rows)
    assert res["users"] == {"control": 2, "treatment": 2}
    assert "tool_error_rate" in res["metrics"]


def test_a_calls_result_is_read_from_its_own_session_and_turn_when_call_ids_repeat(tmp_path: Path) -> None:
    """A text parser numbers each reply's calls from call_0: the same id in every turn of every
    session. Each call's result is the tool message of the request that carries *its* turn back."""
    store = open_store(f"sqlite:///{tmp_path / 'e.db'}")
    store.ensure_org("acme")
    edit = _call("call_0", "edit_file", {"path": "a.py", "old_str": "x", "new_str": "y"})
    read = _call("call_0", "read_file", {"path": "a.py"})

    def back(call: dict, result: str, earlier: list | None = None) -> list:
        return [*(earlier or [{"role": "user", "content": "fix it"}]),
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call["id"], "name": call["function"]["name"], "arguments": {}}]},
                {"role": "tool", "content": result, "tool_call_id": "call_0"}]

    ok_turn = _log(store, "u1", "control", tool_calls=[edit], session="s1")  # its edit applies
    later = back(edit, "Edited a.py")
    second = _log(store, "u1", "control", tool_calls=[read], session="s1", messages=later)  # then a read that fails
    _log(store, "u1", "control", session="s1", messages=back(read, "Error: no such file", later))
    bad_turn = _log(store, "u2", "canary", tool_calls=[edit], session="s2")  # another session: its edit fails
    _log(store, "u2", "canary", session="s2", messages=back(edit, "Error: old_str not found"))

    facts = {f["ts"]: f for f in interaction_facts(store, "acme", EXP)}
    rows = {r["id"]: r for r in store.interactions(org="acme", experiment_id=EXP)}
    broken = {iid: facts[rows[iid]["created_at"]]["broken"] for iid in (ok_turn, second, bad_turn)}
    assert broken == {ok_turn: 0, second: 1, bad_turn: 1}
    res = distill(store, "acme")
    by_id = {s.interaction_id: s.reward.terms["broken_calls"] for s in res}
    assert (by_id[ok_turn], by_id[second], by_id[bad_turn]) == (0.0, -0.25, -0.25)
