"""bench/stuck.py: replaying `stop_on_repeats` on a finished evaluation finds where the rule would
have ended each episode and whether anything was edited after that turn."""

import json

from tests.bench import load_bench

st = load_bench("stuck")


def _turn(name, ok=True):
    return {"tool_executions": [{"call": {"name": name, "arguments": {}}, "result": {"ok": ok}}]}


def test_replay_finds_the_cut_and_an_edit_after_it(tmp_path):
    run = tmp_path / "eval-general-base"
    (run / "trajectories").mkdir(parents=True)
    episodes = {  # task -> (turn tool names, meta.repeated_turns, resolved)
        "looped": (["grep", "read_file", "grep", "read_file", "grep", "grep"], [2, 3, 4, 5], 0),
        "late-edit": (["grep", "grep", "grep", "edit_file"], [1, 2], 1),
        "refused-edit": (["grep", "grep", "grep", "edit_file!"], [1, 2], 0),
        "apart": (["grep", "grep", "read_file", "grep"], [1, 3], 0),
    }
    results = []
    for task, (names, rep, resolved) in episodes.items():
        turns = [_turn(n.rstrip("!"), ok=not n.endswith("!")) for n in names]
        traj = {"task_id": task, "turns": turns, "meta": {"repeated_turns": rep}}
        # a trajectory file is rewritten after every turn: the last line is the whole episode
        (run / "trajectories" / f"{task}-0.jsonl").write_text(json.dumps({"task_id": task}) + "\n" + json.dumps(traj) + "\n")
        results.append({"instance_id": task, "sample": 0, "status": "ok", "resolved": resolved})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    recs = {r["task"]: r for r in st.replay_records(run, 2)}
    assert (recs["looped"]["cut"], recs["looped"]["saved"], recs["looped"]["edit_after_cut"]) == (3, 2, 0)
    assert (recs["late-edit"]["cut"], recs["late-edit"]["edit_after_cut"], recs["late-edit"]["resolved_cut"]) == (2, 1, 1)
    assert recs["refused-edit"]["edit_after_cut"] == 0  # a refused edit changed nothing
    assert (recs["apart"]["cut"], recs["apart"]["stopped"], recs["apart"]["saved"]) == (-1, 0, 0)
    assert {r["arm"] for r in recs.values()} == {f"replay:{tmp_path.name}/eval-general-base"}
    assert {r["task"]: r["cut"] for r in st.replay_records(run, 3)}["looped"] == 4
