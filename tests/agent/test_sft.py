"""SFT: one renderer for training and the harness, the expert's plan, resume, bad input."""

import json
import subprocess
import sys

import pytest

from etude.envs.expert import gold_hunk, unique_old_str
from etude.errors import EtudeError
from etude.harness import HarnessConfig, run_agent
from etude.policy.local import LocalPolicy, encode_conversation
from etude.policy.models import smollm2_tokenizer
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import ToolContext
from etude.train.sft import Sequence_, conversation_sequences, load_sft_config, mix, pack_rows

PATCH = """diff --git a/src/p/a.py b/src/p/a.py
--- a/src/p/a.py
+++ b/src/p/a.py
@@ -3,5 +3,5 @@
 def f(x):
     y = x
-    if y > 1:
+    if y <= 1:
         return 1
     return 2
"""


def test_gold_hunk_and_unique_old_str_add_context_until_unique():
    h = gold_hunk(PATCH)
    assert h and h.path == "src/p/a.py" and h.old == ["    if y > 1:"] and h.new == ["    if y <= 1:"]
    src = "def g(y):\n    if y > 1:\n        pass\ndef f(x):\n    y = x\n    if y > 1:\n        return 1\n"
    old, new = unique_old_str(src, h)
    assert src.count(old) == 1 and old.endswith("    if y > 1:") and new.endswith("    if y <= 1:")


def test_sft_tokens_equal_what_the_harness_sends(tmp_path):
    """One renderer: every assistant turn's prompt in the SFT sequence is byte-for-byte the ids the
    harness would send a local model at that turn, and its targets are the sampled ids + <|im_end|>."""
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    outputs = ['<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>', "It returns 1."]
    pol = ScriptedPolicy(outputs)
    traj = run_agent(pol, "What does f return?", ToolContext(workspace=tmp_path), HarnessConfig())
    tok = smollm2_tokenizer()
    seqs = conversation_sequences(tok, traj.messages)
    assert len(seqs) == 1  # the second turn's prompt extends the first: one sequence
    seq = seqs[0]
    for k, seen in enumerate(pol.seen):  # what the harness showed the model at turn k
        prompt = encode_conversation(tok, seen)
        assert seq.ids[: len(prompt)] == prompt
        comp = tok(outputs[k], add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        assert seq.ids[len(prompt): len(prompt) + len(comp)] == comp
        assert seq.labels[len(prompt): len(prompt) + len(comp)] == comp
        assert all(x == -100 for x in seq.labels[: len(prompt)][-3:])
    assert seq.loss_tokens == sum(len(tok(o, add_special_tokens=False)["input_ids"]) + 1 for o in outputs)
    # an untrained turn (an expert's deliberate wrong fix) keeps its tokens as context, without loss
    (masked,) = conversation_sequences(tok, traj.messages, untrained=(0,))
    assert masked.ids == seq.ids
    assert masked.loss_tokens == len(tok(outputs[1], add_special_tokens=False)["input_ids"]) + 1


def test_pack_rows_and_mix_weights():
    seqs = [Sequence_([1] * n, [-100] * n) for n in (5, 3, 2, 7)]
    rows = pack_rows(seqs, 8)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3]
    assert all(sum(len(seqs[i].ids) for i in r) <= 8 for r in rows)
    pools = {"expert": [Sequence_([1], [1], "expert")] * 10, "self": [Sequence_([2], [2], "self")] * 3}
    order = mix(pools, {"expert": 1.0, "self": 1.0}, 1.0, 0)
    assert sum(s.source == "self" for s in order) == sum(s.source == "expert" for s in order) == 10
    with pytest.raises(EtudeError, match="no usable"):
        mix({"expert": []}, {"expert": 1.0}, 1.0, 0)


def test_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "tiny"\nnot_a_key = 1\n')
    with pytest.raises(EtudeError, match="not_a_key"):
        load_sft_config(bad)
    r = subprocess.run([sys.executable, "-m", "etude.cli", "sft", "--config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    notmodel = tmp_path / "nm.toml"
    notmodel.write_text(f'model = "{tmp_path}"\ntasks = "{tmp_path}/none.jsonl"\n')
    r = subprocess.run([sys.executable, "-m", "etude.cli", "sft", "--config", str(notmodel), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_expert_sft_end_to_end_on_tiny_resumes_and_exports(tmp_path, isodate_tasks, task_cache):
    """The expert resolves real tasks through the harness and sandbox; SFT trains the tiny model on
    them, is killed-and-resumed (a second run continues from the checkpoint) and exports a model
    directory that LocalPolicy loads."""
    from etude.tasks import save_tasks
    from etude.tasks.curriculum import _restate
    from etude.tasks.fetch import fetch_sdist

    root = fetch_sdist("isodate", "0.7.2").root
    tasks = [t2 for t in isodate_tasks if len(t.strategy.split("+")) == 1 and (t2 := _restate(t, 1, root))]
    assert tasks
    f = tmp_path / "tasks.jsonl"
    save_tasks(tasks, f)
    cfg = tmp_path / "sft.toml"
    cfg.write_text(f'model = "tiny"\ntasks = "{f}"\nbatch_sequences = 1\ncheckpoint_every = 1\nepochs = 2.0\n'
                   'precision = "fp32"\n[harness]\nmax_steps = 8\nmax_observation_chars = 3000\n')
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "etude.cli", "sft", "--config", str(cfg), "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    n = res["trajectories"]["expert"]
    assert n >= 1 and res["steps"] == 2 * n
    rows = [json.loads(ln) for ln in (out / "data" / "expert.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["resolved"]]
    assert len(kept) == n and all(r["trajectory"]["stop_reason"] in ("answer", "submit") for r in kept)
    # resume: a finished run restarts at its last step and changes nothing
    r2 = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r2.returncode == 0 and json.loads(r2.stdout.strip().splitlines()[-1])["resumed_from_step"] == 2 * n
    pol = LocalPolicy.from_pretrained(str(out / "final"))
    assert pol.generate([{"role": "user", "content": "hi"}] and [__import__("etude").types.Message("user", "hi")],
                        max_tokens=3).token_ids


@pytest.mark.slow
def test_fix_drills_on_real_tasks_leave_the_gold_diff_and_train_no_answer(tmp_path, isodate_tasks, task_cache):
    """Drills run through the real harness and tools: each kept one ends with the gold edit applied
    (its diff undoes the bug), runs no command, and its answer turn carries no loss."""
    from etude.tasks.curriculum import _restate
    from etude.tasks.fetch import fetch_sdist
    from etude.train.sft import drill_trajectories

    root = fetch_sdist("isodate", "0.7.2").root
    tasks = [t2 for t in isodate_tasks if len(t.strategy.split("+")) == 1 and (t2 := _restate(t, 1, root))]
    drills = drill_trajectories(tasks, HarnessConfig(max_steps=8), tmp_path / "drill.jsonl", workers=1)
    assert drills
    tok = smollm2_tokenizer()
    by_id = {t.instance_id: t for t in tasks}
    for tr in drills:
        calls = [x.call.name for x in tr.tool_calls]
        assert calls[0] == "grep" and calls[-1] == "edit_file" and "run_terminal" not in calls
        gold = gold_hunk(by_id[tr.task_id].patch)
        assert [ln[1:] for ln in tr.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")] == gold.new
        answer = tr.messages[-1]
        assert answer.role == "assistant" and not answer.tool_calls
        seq = conversation_sequences(tok, tr.messages, "drill", tr.meta["untrained_turns"])[-1]
        tail = len(tok(answer.content, add_special_tokens=False)["input_ids"])
        assert all(y == -100 for y in seq.labels[-tail:])  # the unchecked answer is not learnt
    again = drill_trajectories(tasks, HarnessConfig(max_steps=8), tmp_path / "drill.jsonl", workers=1)
    assert [t.task_id for t in again] == [t.task_id for t in drills]  # read back from the cache
    # as an SFT source: `[sources] drill` on a tasks file; tasks the expert also does are left out
    from etude.tasks import save_tasks
    from etude.train.sft import gather, sft_config_from_dict

    f = tmp_path / "tasks.jsonl"
    save_tasks(tasks, f)
    ids = {t.task_id for t in drills}

    def cfg(**kw):
        return sft_config_from_dict({"model": "tiny", "tasks": str(f), **kw})

    pools = gather(cfg(sources={"expert": 0.0, "drill": 1.0, "drill_tasks": str(f)}), tmp_path / "run")
    assert {t.task_id for t in pools["drill"]} == ids
    pools = gather(cfg(sources={"drill": 1.0, "drill_tasks": str(f)}, max_tasks=1), tmp_path / "run2")
    assert {t.task_id for t in pools["drill"]} == ids - {tasks[0].instance_id}  # the expert's task is not drilled


def test_new_drill_tasks_keep_one_task_per_bug_the_expert_does_not_work():
    from etude.train.sft import new_drill_tasks
    from etude.types import Task

    def task(i: str, patch: str) -> Task:
        return Task(instance_id=i, repo="r", base_commit="b", patch=patch, test_patch="", problem_statement="")

    expert = [task("e1", "P1"), task("e2", "P2")]
    cands = [task("c1", "P2"), task("c2", "P3"), task("c3", "P3"), task("c4", "P4"), task("e1", "P1")]
    assert [t.instance_id for t in new_drill_tasks(cands, expert)] == ["c2", "c4"]
    assert new_drill_tasks(cands[:1], expert) == []
