"""The single-turn envs' rewards, pinned on hand-made replies. The expected values were computed
from the env code before its scores went through the reward rubric (issue 33: the fix env's tiers
became rubric terms), so a change of the composition that moved any reward would fail here. The
rubric's weights come from `[env.rewards] weights` like the episode rubric's."""

from __future__ import annotations

import json

import pytest

from etude.envs.families import ArithEnv, FixTurnEnv, make_env
from etude.envs.fixturn import REWARDS, TIERS
from etude.errors import EtudeError
from etude.train.config import EnvConfig
from etude.types import Problem

SRC = "def f(a, b):\n    if a < b:\n        return a\n    return b\n"
FIX = Problem("fix-t", "fix", (), {"src": SRC, "gold": SRC.replace("a < b", "a > b"), "path": "pkg/m.py",
                                   "bug_line": "    if a < b:"})
BROKEN = '<tool_call>\n{"name": "edit_file", "arguments": {"path": </tool_call>'


def _call(name: str, **args: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _edit(old: str, new: str, path: str = "pkg/m.py") -> str:
    return _call("edit_file", path=path, old_str=old, new_str=new)


# (reply, reward, resolved) as the env scored them before the rubric.
FIX_CASES = {
    "gold": (_edit("    if a < b:", "    if a > b:"), 1.0, True),
    "gold, other layout": (_edit("    if a < b:", "    if (a > b):"), 1.0, True),
    "right fix, old_str short of the bug line": (_edit("a < b", "a > b"), 1.0, True),
    "wrong fix on the bug line": (_edit("    if a < b:", "    if a <= b:"), 0.3, False),
    "edit elsewhere": (_edit("        return a", "        return b"), 0.1, False),
    "edit elsewhere and a broken call": (_edit("        return a", "        return b") + "\n" + BROKEN, 0.1, False),
    "ambiguous old_str": (_edit("return", "yield"), 0.0, False),
    "another file": (_edit("    if a < b:", "    if a > b:", path="pkg/other.py"), 0.0, False),
    "a read, no edit": (_call("read_file", path="pkg/m.py"), 0.0, False),
    "broken call": (BROKEN, -0.2, False),
    "prose": ("I think it is fixed.", -0.2, False),
}


@pytest.mark.parametrize("case", FIX_CASES)
def test_the_fix_env_reward_of_hand_made_edits_is_unchanged(case):
    reply, reward, resolved = FIX_CASES[case]
    got, terms, ok = FixTurnEnv(tasks_file="x.jsonl").check(FIX, reply)
    assert (got, ok) == (reward, resolved)  # exact: the same float as before
    assert list(terms) == list(TIERS) and sorted(terms.values()) == [0.0] * (len(TIERS) - 1) + [1.0]  # the best tier only
    best = next(t for t in TIERS if terms[t] == 1.0)
    assert REWARDS[best] == reward and terms["right_fix"] == float(resolved)


def test_the_fix_tiers_weights_come_from_the_env_rewards_table_and_a_misspelt_term_is_refused():
    wrong = FIX_CASES["wrong fix on the bug line"][0]
    env = make_env(EnvConfig(name="fix", tasks_file="x.jsonl", rewards={"weights": {"on_bug_line": 0.5}}))
    assert env.check(FIX, wrong)[0] == 0.5
    assert env.check(FIX, FIX_CASES["broken call"][0])[0] == -0.2  # the other tiers keep their defaults
    with pytest.raises(EtudeError, match="right_fx is no term of env fix"):
        make_env(EnvConfig(name="fix", tasks_file="x.jsonl", rewards={"weights": {"right_fx": 1.0}}))
    with pytest.raises(EtudeError, match="correctness is no term of env arith"):  # an episode term
        make_env(EnvConfig(name="arith", rewards={"weights": {"correctness": 1.0}}))
    with pytest.raises(EtudeError, match="weights values must be numbers"):
        make_env(EnvConfig(name="fix", tasks_file="x.jsonl", rewards={"weights": {"edits": "a lot"}}))


ARITH = Problem("arith-t", "arith", (), 71)
ARITH_CASES = {"71": (1.1, True), "49 + 22 = 71": (1.0, True), "72": (0.1, False), " 71. ": (1.1, True),
               "no": (0.0, False), "1,071": (0.0, False)}


@pytest.mark.parametrize("reply", ARITH_CASES)
def test_the_arith_env_reward_is_unchanged(reply):
    reward, terms, ok = ArithEnv().check(ARITH, reply)
    assert (reward, ok) == ARITH_CASES[reply]
    assert set(terms) == {"correct", "format"} and terms["correct"] == float(ok)
    unweighted = ArithEnv(rewards={"weights": {"format": 0.0}}).check(ARITH, reply)
    assert unweighted == (float(ok), terms, ok)  # format reported, not counted
