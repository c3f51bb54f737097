"""bench/harness_ablation.py: the variant syntax and the repeated-reply measure every arm shares."""

import json

import pytest

from tests.bench import load_bench

ab = load_bench("harness_ablation")


def test_variant_reads_a_name_and_its_harness_changes():
    assert ab.variant("notice_on:repeat_notice=true,max_steps=12") == ("notice_on", {"repeat_notice": True, "max_steps": 12})
    with pytest.raises(ab.EtudeError, match="NAME:KEY=VALUE"):
        ab.variant("repeat_notice=true")


def test_repeated_replies_counts_replies_seen_earlier_in_the_same_episode(tmp_path):
    def traj(name, replies):
        msgs = [{"role": "user", "content": "go"}] + [{"role": "assistant", "content": r} for r in replies]
        (tmp_path / name).write_text(json.dumps({"messages": msgs}) + "\n")
        return {"trajectory": name}

    recs = {"a": traj("a.jsonl", ["x", "y", "x ", "x"]), "b": traj("b.jsonl", ["x", "z"]), "c": {"trajectory": None}}
    r = ab.repeated_replies(tmp_path, recs)
    assert (r["k"], r["n"], r["episodes_with_a_repeat"]) == (2, 6, 1)  # "x " is "x" again; another episode's "x" is not
