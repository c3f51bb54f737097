"""The agent loop with the scripted policy and the real tools on a real directory."""

import json
import threading

import pytest

from etude.errors import EtudeError
from etude.harness import HarnessConfig, load_trajectories, run_agent
from etude.harness import loop as loop_mod
from etude.policy.scripted import ScriptedPolicy
from etude.types import Generation, Message


def call(name, **args):
    """One `<tool_call>` block, as a local model writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_answer_ends_episode_and_prompt_offers_tools(ctx):
    pol = ScriptedPolicy(["Reading. " + call("read_file", path="pkg/a.py"), "It returns 1."])
    t = run_agent(pol, "What does f return?", ctx)
    assert t.stop_reason == "answer" and len(t.turns) == 2 and t.final_message == "It returns 1."
    system = pol.seen[0][0]
    assert system.role == "system" and "<tools>" in system.content and "- read_file(path: string" in system.content
    assert "- submit(message?: string)" in system.content
    obs = pol.seen[1][-1]
    assert obs.role == "tool" and obs.tool_call_id == "call_0_0" and "return 1" in obs.content
    assert t.turns[0].tool_executions[0].result.ok and t.broken_calls == 0
    assert t.meta["complete"] is True and t.policy_id == "scripted"


def test_native_policy_gets_schemas_not_prompt_text(ctx):
    class Native(ScriptedPolicy):
        def generate(self, messages, tools, **kw):
            self.tools_seen = tools
            return super().generate(messages, tools, **kw)

    pol = Native([{"tool_calls": [{"name": "list_dir", "arguments": {"path": "pkg"}}]}], native_tools=True)
    t = run_agent(pol, "list", ctx)
    assert "<tools>" not in pol.seen[0][0].content
    assert {s["function"]["name"] for s in pol.tools_seen} >= {"read_file", "run_terminal", "submit"}
    assert t.messages[2].tool_calls[0].name == "list_dir"  # native calls go in tool_calls
    assert "a.py" in t.messages[3].content


def test_malformed_calls_are_observations_and_counted(ctx, ws):
    outputs = [
        call("read_file", path="pkg/a.py") + '<tool_call>{"name": "grep", "arguments": {"pattern": "x",}}</tool_call>'
        + call("no_such_tool", x=1) + call("read_file", nope=1) + call("semantic_search", query="q"),
        {"tool_calls": [{"id": "n1", "type": "function", "function": {"name": "grep", "arguments": "{bad"}}]},
        "Giving up.",
    ]
    pol = ScriptedPolicy(outputs)
    no_search = HarnessConfig(tools=tuple(n for n in HarnessConfig().tools if n != "semantic_search"))
    t = run_agent(pol, "go", ctx, no_search)
    assert t.stop_reason == "answer"
    first = t.turns[0]
    assert len(first.parse_errors) == 1 and "trailing comma" in first.parse_errors[0]
    results = [(x.call.name, x.result.ok) for x in first.tool_executions]
    assert results == [("read_file", True), ("no_such_tool", False), ("read_file", False), ("semantic_search", False)]
    assert "unknown tool 'semantic_search'" in first.tool_executions[3].result.error  # not enabled in this config
    assert first.broken_calls == 4
    assert t.turns[1].parse_errors and t.broken_calls == 5
    # the model saw every one of them
    seen = pol.seen[1]
    assert sum(1 for m in seen if m.role == "tool") == 4
    assert seen[-1].role == "user" and "trailing comma" in seen[-1].content
    assert "arguments string is not valid JSON" in pol.seen[2][-1].content


def test_submit_ends_and_skips_later_calls(ctx, ws):
    out = call("write_file", path="new.txt", content="x\n") + call("submit", message="done") + call("write_file", path="late.txt", content="y")
    t = run_agent(ScriptedPolicy([out, "never reached"]), "go", ctx)
    assert t.stop_reason == "submit" and len(t.turns) == 1
    assert (ws / "new.txt").read_text() == "x\n" and not (ws / "late.txt").exists()
    assert [x.result.ok for x in t.turns[0].tool_executions] == [True, True, False]


def test_submit_disabled_is_an_unknown_tool(ctx):
    t = run_agent(ScriptedPolicy([call("submit")]), "go", ctx, HarnessConfig(allow_submit=False))
    assert t.stop_reason == "answer" and not t.turns[0].tool_executions[0].result.ok


def test_max_steps(ctx):
    pol = ScriptedPolicy([call("list_dir", path=".")] * 10)
    t = run_agent(pol, "loop", ctx, HarnessConfig(max_steps=3))
    assert t.stop_reason == "max_steps" and len(t.turns) == 3


def test_token_counts_from_ids_and_context_limit(ctx):
    gen = Generation(text=call("list_dir", path="."), prompt_token_ids=tuple(range(60)), token_ids=(1, 2, 3, 4))
    t = run_agent(ScriptedPolicy([gen] * 5), "go", ctx, HarnessConfig(max_total_tokens=64))
    assert t.stop_reason == "max_tokens" and len(t.turns) == 1
    assert (t.prompt_tokens, t.completion_tokens) == (60, 4) and t.meta["token_counts"] == "ids"


def test_truncated_answer_is_max_tokens(ctx):
    t = run_agent(ScriptedPolicy([Generation(text="The answer is", finish_reason="length")]), "go", ctx)
    assert t.stop_reason == "max_tokens"


def test_time_limit(ctx):
    t = run_agent(ScriptedPolicy(["hi"]), "go", ctx, HarnessConfig(time_limit_s=0.0))
    assert t.stop_reason == "timeout" and t.turns == ()


def test_history_goes_between_system_and_request(ctx):
    hist = [Message("system", "old system"), Message("user", "earlier q"), Message("assistant", "earlier a")]
    pol = ScriptedPolicy(["ok"])
    run_agent(pol, "now", ctx, history=hist)
    assert [(m.role, m.content) for m in pol.seen[0][1:]] == [("user", "earlier q"), ("assistant", "earlier a"), ("user", "now")]
    assert pol.seen[0][0].content != "old system"


def test_diff_fn_result_and_failure_are_recorded(ctx):
    t = run_agent(ScriptedPolicy(["ok"]), "go", ctx, diff_fn=lambda: "diff --git a/x b/x\n")
    assert t.diff == "diff --git a/x b/x\n"

    def broken():
        raise OSError("disk gone")

    t = run_agent(ScriptedPolicy(["ok"]), "go", ctx, diff_fn=broken)
    assert t.diff == "" and "disk gone" in t.meta["diff_error"] and t.stop_reason == "answer"


def test_long_observations_are_clipped(ctx, ws):
    (ws / "big.txt").write_text("\n".join(f"line {i}" for i in range(3000)))
    pol = ScriptedPolicy([call("read_file", path="big.txt")])
    run_agent(pol, "go", ctx, HarnessConfig(max_observation_chars=500))
    obs = pol.seen[1][-1].content
    assert len(obs) < 600 and "characters cut" in obs


def test_config_validation(ctx):
    with pytest.raises(EtudeError, match="tool_format"):
        HarnessConfig(tool_format="xml")
    with pytest.raises(EtudeError, match="unknown tool"):
        run_agent(ScriptedPolicy([]), "go", ctx, HarnessConfig(tools=("read_file", "rm_rf")))


# ---------------------------------------------------------------- trajectory file


def test_trajectory_written_after_every_step(ctx, tmp_path):
    path = tmp_path / "t.jsonl"
    on_disk = []

    class Peek(ScriptedPolicy):
        def generate(self, messages, tools, **kw):
            rows = load_trajectories(path) if path.exists() else []
            on_disk.append((len(rows[-1]["turns"]), rows[-1]["meta"]["complete"]) if rows else None)
            return super().generate(messages, tools, **kw)

    t = run_agent(Peek([call("list_dir", path=".")] * 3 + ["done"]), "go", ctx, trajectory_path=path)
    assert on_disk == [None, (1, False), (2, False), (3, False)]
    rows = load_trajectories(path)
    assert len(rows) == 1 and rows[0] == json.loads(t.to_json()) and rows[0]["meta"]["complete"] is True


def test_policy_crash_keeps_earlier_turns(ctx, tmp_path):
    path = tmp_path / "t.jsonl"
    t = run_agent(ScriptedPolicy([call("list_dir", path="."), {"raise": "server exploded"}]), "go", ctx, trajectory_path=path)
    assert t.stop_reason == "error" and "server exploded" in t.meta["error"] and len(t.turns) == 1
    row = load_trajectories(path)[-1]
    assert row["stop_reason"] == "error" and len(row["turns"]) == 1


def test_interrupt_propagates_after_writing(ctx, tmp_path):
    path = tmp_path / "t.jsonl"

    class Interrupt(ScriptedPolicy):
        def generate(self, messages, tools, **kw):
            if len(self.seen) == 2:
                raise KeyboardInterrupt
            return super().generate(messages, tools, **kw)

    with pytest.raises(KeyboardInterrupt):
        run_agent(Interrupt([call("list_dir", path=".")] * 5), "go", ctx, trajectory_path=path)
    row = load_trajectories(path)[-1]
    assert len(row["turns"]) == 2 and row["meta"]["complete"] is False and row["stop_reason"] == "error"


def test_episodes_append_to_a_shared_file(ctx, tmp_path):
    path = tmp_path / "t.jsonl"
    ids = [run_agent(ScriptedPolicy([call("list_dir", path="."), "ok"]), "go", ctx, trajectory_path=path).episode_id for _ in range(3)]
    assert [r["episode_id"] for r in load_trajectories(path)] == ids


# ---------------------------------------------------------------- parallel execution


def _instrumented(monkeypatch, barrier_parties):
    """Wrap the real tool call: read-only calls must meet at a barrier (so they only pass if they
    run concurrently); record how many mutating calls ever ran at once."""
    real = loop_mod._call_tool
    barrier = threading.Barrier(barrier_parties, timeout=20)
    state = {"active": 0, "max_active_mutating": 0, "threads": set()}
    lock = threading.Lock()

    def wrapped(name, args, ctx):
        state["threads"].add(threading.current_thread().name)
        if name in ("read_file", "grep", "list_dir", "glob"):
            barrier.wait()
            return real(name, args, ctx)
        with lock:
            state["active"] += 1
            state["max_active_mutating"] = max(state["max_active_mutating"], state["active"])
        try:
            return real(name, args, ctx)
        finally:
            with lock:
                state["active"] -= 1

    monkeypatch.setattr(loop_mod, "_call_tool", wrapped)
    return state


def test_read_only_calls_run_concurrently_in_order(ctx, monkeypatch):
    state = _instrumented(monkeypatch, 3)
    out = call("read_file", path="pkg/a.py") + call("grep", pattern="def g") + call("list_dir", path="pkg")
    t = run_agent(ScriptedPolicy([out]), "go", ctx)
    ex = t.turns[0].tool_executions
    assert [x.result.ok for x in ex] == [True, True, True]  # a sequential run would break the barrier
    assert "return 1" in ex[0].result.output and "b.py" in ex[1].result.output and "a.py" in ex[2].result.output
    assert [x.call.id for x in ex] == ["call_0_0", "call_0_1", "call_0_2"]
    assert len(state["threads"]) == 3


def test_edits_run_alone_and_in_order(ctx, ws, monkeypatch):
    state = _instrumented(monkeypatch, 2)
    out = (call("read_file", path="pkg/a.py") + call("read_file", path="pkg/b.py")
           + call("edit_file", path="pkg/a.py", old_str="return 1", new_str="return 10")
           + call("edit_file", path="pkg/a.py", old_str="return 10", new_str="return 100"))
    t = run_agent(ScriptedPolicy([out]), "go", ctx, HarnessConfig(max_parallel=4))
    assert [x.result.ok for x in t.turns[0].tool_executions] == [True] * 4
    assert (ws / "pkg" / "a.py").read_text() == "def f():\n    return 100\n"  # second edit saw the first
    assert state["max_active_mutating"] == 1


def test_trajectory_file_loads_back_into_objects(ctx, tmp_path):
    from etude.harness.record import load_trajectory

    path = tmp_path / "t.jsonl"
    outputs = [call("read_file", path="pkg/a.py") + "<tool_call>{bad</tool_call>",
               {"tool_calls": [{"name": "list_dir", "arguments": {"path": "pkg"}}]},
               Generation(text="ok", prompt_token_ids=(1, 2), token_ids=(3,), logprobs=(-0.5,))]
    t = run_agent(ScriptedPolicy(outputs), "go", ctx, trajectory_path=path, meta={"session_id": "s"})
    back = load_trajectory(path)
    assert back == t and back.to_dict() == t.to_dict()
    assert back.broken_calls == 1 and back.turns[2].generation.logprobs == (-0.5,) and back.meta["session_id"] == "s"
    with pytest.raises(EtudeError, match="no episode nope"):
        load_trajectory(path, "nope")


def test_tool_prompt_json_lists_full_schemas(ctx):
    """The json style keeps every schema verbatim (for models trained on it); compact is the default."""
    pol = ScriptedPolicy(["It returns 1."])
    run_agent(pol, "What does f return?", ctx, HarnessConfig(tool_prompt="json"))
    assert '"name": "read_file"' in pol.seen[0][0].content
    with pytest.raises(EtudeError):
        HarnessConfig(tool_prompt="yaml")


def test_a_turn_that_repeats_an_earlier_one_is_told_so(ctx, ws):
    """Regression: a greedy small model repeats a failed call until the step limit (100 of 118
    held-out episodes of the LoRA-SFT SmolLM2 did). The repeat is now pointed out to it."""
    bad_edit = call("edit_file", path="pkg/a.py", old_str="no such text", new_str="x")
    tests = call("run_terminal", command="python -c \"import time; t = time.time(); print(f'1 failed in {t % 1:.2f}s')\"")
    pol = ScriptedPolicy([bad_edit, tests, bad_edit, tests, call("read_file", path="pkg/a.py"), "Done."])
    t = run_agent(pol, "go", ctx, HarnessConfig(repeat_notice=True))
    assert t.meta["repeated_turns"] == [2, 3]  # the edit again, and the same run again (timings aside)
    notices = [m.content for m in t.messages if m.role == "user" and "same as step" in m.content]
    assert notices == ["This step is the same as step 1, with the same result: nothing changed. "
                       "Repeating it will not help; do something different.",
                       "This step is the same as step 2, with the same result: nothing changed. "
                       "Repeating it will not help; do something different."]
    assert pol.seen[3][-1].content == notices[0]  # the model saw it right after the repeated results
    # An edit between two identical test runs changes the result: not a repeat.
    (ws / "pkg" / "b.py").write_text("x = 1\n")
    run_b = call("run_terminal", command="cat pkg/b.py")
    edit_b = call("edit_file", path="pkg/b.py", old_str="x = 1", new_str="x = 2")
    t2 = run_agent(ScriptedPolicy([run_b, edit_b, run_b, "Done."]), "go", ctx, HarnessConfig(repeat_notice=True))
    assert "repeated_turns" not in t2.meta


def test_stop_on_repeats_ends_an_episode_after_k_repeated_turns_in_a_row(ctx):
    """A model stuck on one call spends every remaining turn on it (the warm start did in 56 of 60
    held-out episodes); `stop_on_repeats` ends the episode instead, counting repeats in a row only."""
    grep = call("grep", pattern="def f")
    read = call("read_file", path="pkg/a.py")
    stuck = [grep, read, grep, read, grep, grep, "Done."]
    t = run_agent(ScriptedPolicy(stuck), "go", ctx, HarnessConfig(stop_on_repeats=2, max_steps=10))
    # turn 2 repeats turn 0, turn 3 turn 1 (two in a row: the rule fires after turn 3)
    assert t.stop_reason == "repeating" and len(t.turns) == 4 and t.meta["repeated_turns"] == [2, 3]
    t3 = run_agent(ScriptedPolicy(stuck), "go", ctx, HarnessConfig(stop_on_repeats=3, max_steps=10))
    assert t3.stop_reason == "repeating" and len(t3.turns) == 5  # turns 2, 3, 4 repeat
    off = run_agent(ScriptedPolicy(stuck), "go", ctx, HarnessConfig(max_steps=10))
    assert off.stop_reason == "answer" and len(off.turns) == 7 and off.meta["repeated_turns"] == [2, 3, 4, 5]
    # a new turn between two repeats starts the count again
    broken_run = [grep, grep, read, grep, call("read_file", path="pkg/b.py"), "Done."]
    t4 = run_agent(ScriptedPolicy(broken_run), "go", ctx, HarnessConfig(stop_on_repeats=2, max_steps=10))
    assert t4.stop_reason == "answer" and t4.meta["repeated_turns"] == [1, 3]
    with pytest.raises(EtudeError, match="stop_on_repeats"):
        HarnessConfig(stop_on_repeats=-1)


def test_the_repeat_notice_is_off_by_default_but_repeats_are_counted_and_it_joins_a_parse_error(ctx):
    broken = '<tool_call>{"name": "grep", "arguments": {"pattern": "x",}}</tool_call>'
    t = run_agent(ScriptedPolicy([broken, broken, "Done."]), "go", ctx, HarnessConfig(repeat_notice=True))
    last = [m.content for m in t.messages if m.role == "user"][-1]
    assert "trailing comma" in last and last.endswith("same as step 1, with the same result: nothing changed. "
                                                      "Repeating it will not help; do something different.")
    off = run_agent(ScriptedPolicy([broken, broken, "Done."]), "go", ctx)
    assert off.meta["repeated_turns"] == [1] and not any("same as step" in m.content for m in off.messages)
