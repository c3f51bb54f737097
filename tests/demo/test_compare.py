"""The demo's held-out comparison: resolved and tool use, per task, paired across stages."""

import json

from etude.demo.run import Demo, DemoConfig
from etude.evals.records import resolved_by_task, tool_use_by_task


def _run(path, rows):
    path.mkdir(parents=True)
    with (path / "results.jsonl").open("w") as f:
        for iid, resolved, calls, status in rows:
            f.write(json.dumps({"instance_id": iid, "sample": 0, "status": status, "resolved": resolved,
                                "efficiency": {"calls_well_formed": calls}}) + "\n")


def test_tool_use_counts_episodes_with_a_well_formed_call(tmp_path):
    _run(tmp_path / "r", [("a", False, 0, "ok"), ("b", False, 3, "ok"), ("c", True, 2, "error")])
    assert tool_use_by_task(tmp_path / "r") == {"a": 0, "b": 1, "c": 0}
    assert resolved_by_task(tmp_path / "r") == {"a": 0, "b": 0, "c": 0}


def test_compare_pairs_resolved_and_tool_use(tmp_path, monkeypatch):
    import etude.demo.run as run

    monkeypatch.setattr(run, "compare", lambda a, b, cfg, use: {"gate": "inconclusive"})  # the gate has its own tests
    demo = Demo(DemoConfig(backend="hf", out=str(tmp_path)))
    ids = [f"t{i}" for i in range(12)]
    _run(tmp_path / "eval-base", [(i, False, 0, "ok") for i in ids])
    _run(tmp_path / "eval-sft", [(i, i in ("t0", "t1"), 4, "ok") for i in ids])
    res, summary = demo.compare()
    held = res["heldout"]
    assert held["base"]["tool_use"]["episodes"] == 0 and held["sft"]["tool_use"]["episodes"] == 12
    assert held["sft"]["resolved"] == 2 and held["sft_vs_base"]["mcnemar_p"] == 0.5
    assert held["sft_vs_base"]["tool_use_mcnemar_p"] < 0.001 and held["sft_vs_base"]["tool_use_gain"] == 1.0
    assert "sft 12/12" in summary and "base 0/12" in summary
