"""The edit turn of a task (etude.envs.fixturn, env `fix`, bench/fix_probe.py): a reply is a right
fix only when its edit applies once and gives the gold file (layout aside); an edit elsewhere, a
malformed call or an ambiguous old_str is not, and the reward ranks them in that order. On real
tasks, the env's prompts are drill conversations that stop before the edit, the gold edit scores
1.0, and `etude train` runs a GRPO step on them."""

from __future__ import annotations

import json

import pytest

from etude.envs.families import FixTurnEnv
from etude.envs.fixturn import REWARDS, TIERS, score_edit
from etude.types import Problem
from tests.agent import TINY_STEP, train_cli

SRC = "def f(a, b):\n    if a < b:\n        return a\n    return b\n"
GOLD = SRC.replace("a < b", "a > b")


def _reply(old: str, new: str, path: str = "pkg/m.py") -> str:
    args = {"path": path, "old_str": old, "new_str": new}
    return "<tool_call>\n" + json.dumps({"name": "edit_file", "arguments": args}) + "\n</tool_call>"


def _score(reply: str) -> dict[str, bool]:
    return score_edit(reply, SRC, GOLD, "pkg/m.py", "    if a < b:")


def test_the_gold_edit_scores_right_and_layout_does_not_matter():
    assert _score(_reply("    if a < b:", "    if a > b:")) == {
        "well_formed": True, "attempted": True, "edits": True, "on_bug_line": True, "right_fix": True}
    assert _score(_reply("    if a < b:", "    if (a > b):"))["right_fix"]  # the same AST


def test_wrong_edits_and_broken_calls_are_not_right():
    wrong = _score(_reply("    if a < b:", "    if a <= b:"))
    assert wrong["edits"] and wrong["on_bug_line"] and not wrong["right_fix"]
    elsewhere = _score(_reply("        return a", "        return b"))
    assert elsewhere["edits"] and not elsewhere["on_bug_line"] and not elsewhere["right_fix"]
    twice = _score(_reply("return", "yield"))  # old_str occurs twice: the tool refuses it
    assert twice["attempted"] and not twice["edits"]
    assert not _score(_reply("    if a < b:", "    if a > b:", path="pkg/other.py"))["edits"]
    broken = _score('<tool_call>\n{"name": "edit_file", "arguments": {"path": "pkg/m.py", "old_str": "x}\n</tool_call>')
    assert broken == {"well_formed": False, "attempted": False, "edits": False, "on_bug_line": False,
                      "right_fix": False}
    assert not _score('<tool_call>\n{"name": "read_file", "arguments": {"path": "pkg/m.py"}}\n</tool_call>')["attempted"]


def test_a_reply_is_read_in_the_harness_call_format():
    args = {"path": "pkg/m.py", "old_str": "    if a < b:", "new_str": "    if a > b:"}
    mistral = "[TOOL_CALLS]" + json.dumps([{"name": "edit_file", "arguments": args}])
    assert score_edit(mistral, SRC, GOLD, "pkg/m.py", "    if a < b:", "mistral")["right_fix"]
    assert not _score(mistral)["well_formed"]  # in a <tool_call> harness it is no call
    p = Problem("fix-t", "fix", (), {"src": SRC, "gold": GOLD, "path": "pkg/m.py", "bug_line": "    if a < b:"})
    env = FixTurnEnv(tasks_file="x.jsonl", harness={"tool_format": "mistral"})
    assert env.check(p, mistral)[0] == REWARDS["right_fix"]


def test_the_reward_ranks_right_fix_then_bug_line_then_any_edit_then_a_call_then_garbage():
    replies = [_reply("    if a < b:", "    if a > b:"), _reply("    if a < b:", "    if a <= b:"),
               _reply("        return a", "        return b"), _reply("return", "yield"),
               '<tool_call>\n{"name": "read_file", "arguments": {"path": "pkg/m.py"}}\n</tool_call>',
               '<tool_call>\n{"name": "edit_file", "arguments": {"path": </tool_call>']
    p = Problem("fix-t", "fix", (), {"src": SRC, "gold": GOLD, "path": "pkg/m.py", "bug_line": "    if a < b:"})
    rewards = [FixTurnEnv(tasks_file="x.jsonl").check(p, r)[0] for r in replies]
    assert rewards == [REWARDS[k] for k in TIERS]
    assert rewards == sorted(rewards, reverse=True) and len(set(rewards)) == 5  # attempted == well_formed by default
    # weights can rank trying an edit above not trying one (a miss above a read)
    env = FixTurnEnv(tasks_file="x.jsonl", rewards={"weights": {"well_formed": -0.1}})
    ranked = [env.check(p, r)[0] for r in replies]
    assert ranked[3] == 0.0 and ranked[4] == -0.1 and ranked == sorted(ranked, reverse=True)


def test_the_fix_env_needs_a_tasks_file_and_refuses_a_bad_harness_key_in_one_line():
    from etude.envs.families import make_env
    from etude.errors import EtudeError
    from etude.train.config import EnvConfig

    with pytest.raises(EtudeError, match="tasks_file"):
        make_env(EnvConfig(name="fix"))
    with pytest.raises(EtudeError, match=r"unknown key\(s\) in \[env\.harness\]: max_obs \(known: "):
        make_env(EnvConfig(name="fix", tasks_file="x.jsonl", harness={"max_obs": 1}))
    with pytest.raises(EtudeError, match="max_obs"):  # the tasks env, the same way
        make_env(EnvConfig(name="tasks", tasks_file="x.jsonl", harness={"max_obs": 1}))


@pytest.mark.slow
def test_fix_env_on_real_tasks_prompts_stop_before_the_edit_and_train_runs(tmp_path, isodate_tasks, task_cache):
    from etude.envs.expert import gold_hunk
    from etude.envs.families import FixTurnEnv
    from etude.tasks import save_tasks
    from etude.tasks.curriculum import _restate
    from etude.tasks.fetch import fetch_sdist

    root = fetch_sdist("isodate", "0.7.2").root
    tasks = [t2 for t in isodate_tasks if len(t.strategy.split("+")) == 1 and (t2 := _restate(t, 1, root))]
    f = tmp_path / "tasks.jsonl"
    save_tasks(tasks, f)
    env = FixTurnEnv(tasks_file=str(f), eval_tasks_file=str(f), harness={"max_steps": 8})
    probs = env.problems("train")
    assert probs and len(probs) <= len(tasks)
    by_id = {f"fix-{t.instance_id}": t for t in tasks}
    for p in probs:
        assert p.messages[0].role == "system" and p.messages[-1].role == "tool"
        assert not any(m.role == "assistant" and "edit_file" in m.content for m in p.messages)
        hunk = gold_hunk(by_id[p.id].patch)
        assert hunk.old[0].strip() in "\n".join(m.content for m in p.messages if m.role == "tool")  # on screen
        a = p.answer
        gold_old = next(ln for ln in a["src"].splitlines(keepends=True) if ln.rstrip("\n") == hunk.old[0])
        gold_new = hunk.new[0] + "\n"
        if a["src"].count(gold_old) == 1:
            reward, terms, ok = env.check(p, _reply(gold_old, gold_new, a["path"]))
            assert (reward, ok, terms["right_fix"]) == (1.0, True, 1.0)
        assert env.check(p, "I think it is fixed.") == (REWARDS["malformed"], {
            "right_fix": 0.0, "on_bug_line": 0.0, "edits": 0.0, "attempted": 0.0, "well_formed": 0.0, "malformed": 1.0},
            False)
    recs = train_cli(tmp_path, TINY_STEP + 'eval_every = 1\nmicro_batch_tokens = 4096\n'
                     f'[env]\nname = "fix"\ntasks_file = "{f}"\neval_tasks_file = "{f}"\n[env.harness]\nmax_steps = 8\n')
    train = [x for x in recs if x["kind"] == "train"]
    assert len(train) == 1 and train[0]["samples"] == 2
    assert min(REWARDS.values()) <= train[0]["reward"] <= max(REWARDS.values())


def test_drill_cache_is_one_file_per_harness_whatever_the_temperature(tmp_path, monkeypatch):
    import dataclasses

    from etude.envs.fixturn import drill_cache
    from etude.harness import HarnessConfig

    monkeypatch.setenv("ETUDE_CACHE", str(tmp_path))
    hc = HarnessConfig(max_steps=6)
    assert drill_cache(hc) == drill_cache(dataclasses.replace(hc, temperature=0.0))
    assert drill_cache(hc) != drill_cache(dataclasses.replace(hc, max_observation_chars=500))
    assert drill_cache(hc).parent.parent == tmp_path
