"""Verified edits: a turn whose edit leaves the request's named test failing is undone and
sampled again; the first attempt stands when none passes; everything is recorded."""

import json

import pytest

from etude.errors import EtudeError
from etude.harness import HarnessConfig, run_agent
from etude.harness.verify import Snapshot, named_tests
from etude.policy.scripted import ScriptedPolicy

REQUEST = "The test `tests/test_a.py::test_f` fails with `assert 1 == 2`. The bug is in `f`. Fix it."
# a stand-in for pytest that needs nothing in the sandbox: passes iff pkg/a.py's f() returns 2
CHECK = "python -c \"import sys; sys.path.insert(0, 'pkg'); import a; sys.exit(0 if a.f() == 2 else 1)\""


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def fix(new):
    return call("edit_file", path="pkg/a.py", old_str="return 1", new_str=f"return {new}")


class Recording(ScriptedPolicy):
    def generate(self, messages, tools, **kw):
        self.temps = getattr(self, "temps", []) + [kw.get("temperature")]
        return super().generate(messages, tools, **kw)


def cfg(k, scope="tests"):
    return HarnessConfig(verify_edits=k, verify_command=CHECK, temperature=0.0, verify_temperature=0.9,
                         verify_scope=scope)


def test_test_ids_are_read_from_the_request():
    assert named_tests(REQUEST) == ("tests/test_a.py::test_f",)
    text = ("`tests/t.py::C::test_x[1-a]` and tests/u/v.py::test_y fail; tests/t.py::C::test_x[1-a] again; "
            "see src/mod.py and docs.")
    assert named_tests(text) == ("tests/t.py::C::test_x[1-a]", "tests/u/v.py::test_y")
    assert named_tests("The function `f` in `pkg/a.py` is wrong.") == ()


def test_a_failing_edit_is_undone_and_sampled_again(ctx, ws):
    pol = Recording([fix(3), fix(2), "Fixed f."])
    t = run_agent(pol, REQUEST, ctx, cfg(4))
    assert (ws / "pkg" / "a.py").read_text() == "def f():\n    return 2\n"
    rec = t.meta["verified_edits"]
    assert len(rec) == 1 and rec[0]["turn"] == 0 and rec[0]["tests"] == ["tests/test_a.py::test_f"]
    assert [a["outcome"] for a in rec[0]["attempts"]] == ["failed", "passed"] and rec[0]["kept"] == 1
    assert pol.temps[:2] == [0.0, 0.9]  # the second attempt is sampled at verify_temperature
    # the kept attempt is the turn the model and the trajectory see; the rejected one is not in the context
    assert "return 2" in json.dumps(t.turns[0].tool_executions[0].call.arguments)
    assert not any("return 3" in m.content for m in pol.seen[2])
    assert len(t.turns) == 2 and t.final_message == "Fixed f."


def test_when_no_attempt_passes_the_first_stands(ctx, ws):
    pol = ScriptedPolicy([fix(3), fix(4), call("read_file", path="pkg/a.py"), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(3))
    assert (ws / "pkg" / "a.py").read_text() == "def f():\n    return 3\n"
    rec = t.meta["verified_edits"][0]
    assert [a["outcome"] for a in rec["attempts"]] == ["failed", "failed", "not an edit"] and rec["kept"] == 0
    assert "return 3" in json.dumps(t.turns[0].tool_executions[0].call.arguments)


def test_a_created_file_is_removed_when_its_attempt_is_rejected(ctx, ws):
    write = call("write_file", path="pkg/new.py", content="x = 1\n") + fix(5)
    pol = ScriptedPolicy([fix(7), write, fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(3))
    assert not (ws / "pkg" / "new.py").exists()
    assert [a["outcome"] for a in t.meta["verified_edits"][0]["attempts"]] == ["failed", "failed", "passed"]


def test_off_without_named_tests_or_with_commands(ctx, ws):
    pol = ScriptedPolicy([fix(3), "Done."])
    t = run_agent(pol, "f should return 2; fix pkg/a.py", ctx, cfg(4))
    assert "verified_edits" not in t.meta and (ws / "pkg" / "a.py").read_text().endswith("return 3\n")
    pol = ScriptedPolicy([fix(3) + call("run_terminal", command="echo hi"), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(4))
    assert "verified_edits" not in t.meta and (ws / "pkg" / "a.py").read_text().endswith("return 3\n")


def test_an_edit_that_does_not_apply_is_sampled_again(ctx, ws):
    bad = call("edit_file", path="pkg/a.py", old_str="return 9", new_str="return 2")
    noop = call("edit_file", path="pkg/a.py", old_str="return 1", new_str="return 1")
    pol = ScriptedPolicy([bad, noop, fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(4).replace(verify_unapplied=True))
    rec = t.meta["verified_edits"]
    assert len(rec) == 1 and rec[0]["turn"] == 0 and rec[0]["kept"] == 2
    assert [a["outcome"] for a in rec[0]["attempts"]] == ["not applied", "not applied", "passed"]
    assert (ws / "pkg" / "a.py").read_text().endswith("return 2\n") and t.turns[0].broken_calls == 0
    assert len(t.turns) == 2 and t.final_message == "Done."


def test_a_refused_edit_stands_when_no_attempt_passes(ctx, ws):
    bad = call("edit_file", path="pkg/a.py", old_str="return 9", new_str="return 2")
    pol = ScriptedPolicy([bad, fix(3), fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(2).replace(verify_unapplied=True))
    rec = t.meta["verified_edits"]
    assert [a["outcome"] for a in rec[0]["attempts"]] == ["not applied", "failed"] and rec[0]["kept"] == 0
    assert t.turns[0].broken_calls == 1  # the refusal reached the model as an observation
    assert "return 9" in json.dumps(t.turns[0].tool_executions[0].call.arguments)
    # the failed second attempt was undone; the model's next turn (fix(2)) is checked on its own
    assert (ws / "pkg" / "a.py").read_text().endswith("return 2\n")
    assert [r["turn"] for r in rec] == [0, 1] and rec[1]["attempts"][0]["outcome"] == "passed"


def test_by_default_a_refused_edit_is_the_models_to_see(ctx, ws):
    bad = call("edit_file", path="pkg/a.py", old_str="return 9", new_str="return 2")
    pol = ScriptedPolicy([bad, fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(4))
    assert t.turns[0].broken_calls == 1  # the error reached the model as an observation
    assert [len(r["attempts"]) for r in t.meta["verified_edits"]] == [1]  # only turn 1 was checked
    assert t.meta["verified_edits"][0]["turn"] == 1


def test_snapshot_restores_bytes(ws):
    snap = Snapshot(ws)
    snap.add(["pkg/a.py", "pkg/none.py", "../outside.py"])
    (ws / "pkg" / "a.py").write_text("changed")
    (ws / "pkg" / "none.py").write_text("new")
    after = snap.current()
    snap.restore()
    assert (ws / "pkg" / "a.py").read_text() == "def f():\n    return 1\n" and not (ws / "pkg" / "none.py").exists()
    snap.restore(after)
    assert (ws / "pkg" / "a.py").read_text() == "changed"


def test_negative_attempts_are_refused():
    with pytest.raises(EtudeError, match="verify_edits"):
        HarnessConfig(verify_edits=-1)


def test_a_folder_or_a_path_under_a_file_never_crashes_the_episode(ctx, ws):
    bad_dir = fix(3) + call("write_file", path="pkg", content="x")
    bad_under = fix(4) + call("write_file", path="pkg/a.py/x.py", content="x")
    pol = ScriptedPolicy([bad_dir, bad_under, fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(3))
    assert t.stop_reason == "answer" and (ws / "pkg").is_dir()
    assert (ws / "pkg" / "a.py").read_text().endswith("return 2\n")


def test_when_none_passes_python_runs_the_first_attempts_code(ctx, ws):
    """The last check cached the last attempt's bytecode, of the same size and second as the first
    attempt's source: the undo drops it, so the model's next command imports what the file says."""
    probe = call("run_terminal", command="python -c \"import sys; sys.path.insert(0, 'pkg'); import a; print('f', a.f())\"")
    pol = ScriptedPolicy([fix(3), fix(4), fix(5), probe, "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(3))
    assert (ws / "pkg" / "a.py").read_text().endswith("return 3\n")
    assert "f 3" in t.turns[1].tool_executions[0].result.output


def test_an_attempt_that_edits_the_named_test_is_not_kept(ctx, ws):
    (ws / "tests").mkdir()
    (ws / "tests" / "test_a.py").write_text("def test_f():\n    assert True\n")
    cheat = call("write_file", path="tests/test_a.py", content="def test_f():\n    pass\n") + fix(2)
    pol = ScriptedPolicy([fix(3), cheat, call("write_file", path="tests/conftest.py", content=""), fix(2), "Done."])
    t = run_agent(pol, REQUEST, ctx, cfg(4))
    outcomes = [a["outcome"] for a in t.meta["verified_edits"][0]["attempts"]]
    assert outcomes == ["failed", "not an edit", "not an edit", "passed"]
    assert (ws / "tests" / "test_a.py").read_text() == "def test_f():\n    assert True\n"
    assert not (ws / "tests" / "conftest.py").exists()


def test_the_files_scope_runs_the_named_tests_files(ctx, ws):
    """With verify_scope "files" the check gets the test files, not the ids (stand-in command:
    it passes only when its argument is the file)."""
    check = "python -c \"import sys; sys.exit(0 if sys.argv[1:] == ['tests/test_a.py'] else 1)\""
    h = HarnessConfig(verify_edits=3, verify_command=check, temperature=0.0)
    assert h.verify_scope == "files"
    t = run_agent(ScriptedPolicy([fix(3), "Done."]), REQUEST, ctx, h)
    rec = t.meta["verified_edits"][0]
    assert rec["ran"] == ["tests/test_a.py"] and [a["outcome"] for a in rec["attempts"]] == ["passed"]
    with pytest.raises(EtudeError, match="verify_scope"):
        HarnessConfig(verify_scope="suite")
