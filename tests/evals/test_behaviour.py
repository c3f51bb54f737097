"""`behaviour` in an eval summary, from hand-made records: what each figure counts."""

import pytest

from etude.evals.summary import behaviour


def _rec(resolved, *, issued, good, calls, parallel, turns, repeated, tokens, status="ok"):
    eff = {"calls_issued": issued, "calls_well_formed": good, "tool_calls": calls, "parallel_calls": parallel,
           "turns": turns, "repeated_turns": repeated, "tokens": tokens}
    return {"status": status, "resolved": resolved, "efficiency": eff}


def test_behaviour_counts_calls_turns_and_tokens_of_finished_episodes():
    groups = {
        "a": [_rec(True, issued=4, good=4, calls=4, parallel=2, turns=3, repeated=0, tokens=1000)],
        "b": [_rec(False, issued=6, good=3, calls=5, parallel=0, turns=5, repeated=2, tokens=3000)],
        "c": [_rec(True, issued=9, good=0, calls=9, parallel=9, turns=9, repeated=9, tokens=9, status="error")],
    }
    b = behaviour(groups)
    assert b["episodes"] == 2  # the errored episode counts nowhere
    assert (b["valid_call_rate"]["k"], b["valid_call_rate"]["n"]) == (7, 10)
    assert b["parallel_call_share"]["mean"] == pytest.approx(2 / 9)
    assert (b["repeated_turn_share"]["k"], b["repeated_turn_share"]["n"]) == (2, 8)
    assert b["repeated_turn_share"]["ci_low"] < 0.25 < b["repeated_turn_share"]["ci_high"]
    assert b["turns_mean"] == 4 and b["tokens_mean"] == 2000
    assert b["tokens_per_resolved"] == 4000  # all tokens over the one resolved episode


def test_behaviour_without_resolved_episodes_has_no_tokens_per_resolved():
    b = behaviour({"a": [_rec(False, issued=0, good=0, calls=0, parallel=0, turns=1, repeated=0, tokens=50)]})
    assert b["tokens_per_resolved"] is None and b["valid_call_rate"]["mean"] is None
