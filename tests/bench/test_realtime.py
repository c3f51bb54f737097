"""bench/realtime.py (issue 32 item 4): how a cycle's decision is counted (true / false promotion,
A/A, degraded rolled back or caught), that org B's snapshot sees B's changes and not org A's, that
the default puts the loop's server on the chosen engine with 16 sessions in flight, that the
users' requests are held-out bugs disjoint from the gate's, that its figures verify, and — slow —
that `--quick` runs the three real cycles, writes the result file, passes bench/verify.py and
leaves org B untouched."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.evals.results import write_result
from etude.loop import LoopConfig
from etude.loop.cycle import org_tasks
from etude.pipeline.split import split_by_function, touched_functions
from etude.provenance import provenance
from etude.serve import registry
from etude.store import open_store
from etude.tasks import load_tasks, save_tasks
from etude.types import Task
from tests.bench import BENCH_DIR, load_bench

rt = load_bench("realtime")
verify = load_bench("verify")
CONFIGS = BENCH_DIR.parent / "configs"


def _rep(decision: str, basis: str = "readout", reason: str = "") -> dict:
    return {"decision": decision, "basis": basis, "reason": reason, "cycle_dir": "/x/cycle-0001",
            "candidate": {"name": "acme-x"}, "wall_s": 12.5}


@pytest.mark.parametrize(("rep", "by"), [
    (_rep("rollback", reason="hack alarm: clarification_rate, edit_rate"), "alarm"),
    (_rep("rollback", reason="guardrail failed: latency_s"), "guardrail"),
    (_rep("rollback", reason="significantly worse: accept_rate lift -40.0% ..."), "readout"),
    (_rep("promote", reason="significantly better: accept_rate lift +30.0% ..."), "readout"),
    (_rep("rollback", reason="undecided after 2 round(s) (the max window): ..."), "window"),
    (_rep("rollback", reason="not promoted: eval gate inconclusive on 2 task(s) ..."), "gate"),
    (_rep("rollback", reason="sample ratio mismatch (srm_p 0.0001)"), "srm"),
    (_rep("rollback", basis="gate", reason="eval gate failed: resolved"), "gate"),
    (_rep("rollback", basis="gate-only", reason="gate-only decision (...)"), "gate-only"),
])
def test_what_decided_a_cycle_is_read_from_its_basis_and_reason(rep, by):
    assert rt.decided_by(rep) == by


def test_a_promotion_is_true_only_when_the_confirmation_shows_the_candidate_better():
    rec = lambda sc, rep, conf=None, checks=(True, True): rt.cycle_record(sc, rep, list(checks), conf)  # noqa: E731
    promote = _rep("promote", reason="significantly better: ...")
    true = rec("specialised", promote, {"production": 3, "candidate": 4})
    tie = rec("specialised", promote, {"production": 3, "candidate": 3})  # not worse, not shown better
    false = rec("specialised", promote, {"production": 3, "candidate": 2})
    assert (true["true_promotion"], true["false_promotion"], true["unconfirmed_promotion"]) == (1, 0, 0)
    assert (tie["true_promotion"], tie["false_promotion"], tie["unconfirmed_promotion"]) == (0, 0, 1)
    assert (false["true_promotion"], false["false_promotion"]) == (0, 1)
    rolled = rec("specialised", _rep("rollback", basis="gate-only", reason="gate-only ..."),
                 {"production": 0, "candidate": 5})
    assert (rolled["true_promotion"], rolled["false_promotion"], rolled["confirm_not_worse"]) == (0, 0, 1)
    # a degraded candidate promoted is false whatever it resolves; an A/A promotion is counted apart
    assert rec("degraded", promote)["false_promotion"] == 1
    aa = rec("aa", promote)
    assert (aa["aa_promoted"], aa["false_promotion"]) == (1, 0)
    caught = rec("degraded", _rep("rollback", reason="hack alarm: clarification_rate"))
    window = rec("degraded", _rep("rollback", reason="undecided after 2 round(s) ..."))
    assert (caught["degraded_rolled_back"], caught["degraded_caught"]) == (1, 1)
    assert (window["degraded_rolled_back"], window["degraded_caught"]) == (1, 0)
    assert rec("aa", promote, checks=(True, False, True))["b_untouched"] == 0


def test_org_bs_snapshot_sees_a_change_of_bs_arm_and_none_of_org_as(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'etude.db'}")
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    for org in ("acme", "globex"):
        (tmp_path / org).mkdir()
        (tmp_path / org / "adapter_config.json").write_text("{}")
        registry.register_checkpoint(store, f"{org}-own", str(tmp_path / org), org=org, version=1,
                                     meta={"base": "tiny"})
    registry.set_experiment(store, "globex-canary", [("control", "tiny", 0.5), ("canary", "globex-own", 0.5)],
                            org="globex")
    before = rt.org_state(store, "globex")
    assert {r[0] for r in before["routes"].values()} == {"tiny", "globex-own"}  # both of B's arms are reached
    registry.set_experiment(store, "acme-canary", [("control", "tiny", 0.5), ("canary", "acme-own", 0.5)], org="acme")
    registry.promote(store, "acme-own", "org A's promotion")
    assert rt.org_state(store, "globex") == before
    registry.set_experiment(store, "globex-canary", [("control", "tiny", 0.9), ("canary", "globex-own", 0.1)],
                            org="globex")
    assert rt.org_state(store, "globex") != before


def test_the_default_serves_the_loop_on_the_chosen_engine_with_16_sessions_in_flight(tmp_path):
    demo = LoopConfig.from_toml(CONFIGS / "loop_demo.toml")
    cfg = rt.org_config(demo, rt.DEFAULT, org="acme", base="smollm2", root=tmp_path, seed=3, users=16,
                        backend="vllm", concurrency=None)
    assert (cfg.org, cfg.specialise, cfg.model) == ("acme", True, "smollm2")
    assert cfg.server.backend == "vllm"  # what run_cycle starts `etude serve --backend` with
    assert cfg.traffic.concurrency >= 16 and cfg.traffic.users == 16  # a round's sessions all in flight
    assert cfg.traffic.executor == "threads"  # a local Ray would cap 2 cores at 8 sessions (0.25 CPU each)
    assert (cfg.eval.max_tasks, cfg.traffic.max_tasks) == (rt.DEFAULT.gate_tasks, rt.DEFAULT.user_tasks)
    assert rt.org_config(demo, rt.DEFAULT, org="acme", base="smollm2", root=tmp_path, seed=3, users=16,
                         backend="hf", concurrency=24).traffic.concurrency == 24
    # the demo's own config is left as it is; --quick keeps the tiny config's engine and concurrency
    assert (demo.traffic.concurrency, demo.server.backend) == (2, "hf")
    tiny = LoopConfig.from_toml(CONFIGS / "loop_tiny.toml")
    q = rt.org_config(tiny, rt.QUICK, org="acme", base="tiny", root=tmp_path, seed=0, users=4, backend="hf",
                      concurrency=None)
    assert (q.server.backend, q.traffic.concurrency, q.traffic.executor) == (
        "hf", tiny.traffic.concurrency, tiny.traffic.executor)


def _specialise_run(root: Path, n_functions: int = 50) -> tuple[Path, dict]:
    """A finished specialise run's files the cycles read: its function split of level-1 tasks
    (each names its function), tasks/heldout.jsonl, split.json, report.json."""
    tasks = [Task(instance_id=f"fn{f}-{k}", repo="acme/lib", base_commit="x", patch=f"diff --git a/m.py b/m.py\n{f}{k}",
                  test_patch="", problem_statement="", meta={"function": f"fn{f}", "file": "m.py"})
             for f in range(n_functions) for k in range(3)]
    touched = {t.instance_id: touched_functions(t, None) for t in tasks}
    sp = split_by_function(tasks, touched, heldout_fraction=0.4, seed=0, heldout_per_function=3)
    run = root / "specialise"
    save_tasks(sp.heldout, run / "tasks" / "heldout.jsonl")
    save_tasks(sp.train, run / "tasks" / "train.jsonl")
    save_tasks(sp.select, run / "tasks" / "select.jsonl")
    split = sp.to_dict(0) | {"drills": {"tasks": [], "n_tasks": 0}}
    (run / "split.json").write_text(json.dumps(split))
    (run / "report.json").write_text(json.dumps({"org": "acme", "base": "tiny", "heldout": {"tasks": len(sp.heldout)},
                                                 "general": {"no_regression": True}}))
    return run, {"split": split, "touched": touched, "train": [*sp.train, *sp.select], "select": list(sp.select)}


def test_users_requests_are_held_out_bugs_disjoint_from_the_gate_and_the_confirmation(tmp_path, capsys):
    run, made = _specialise_run(tmp_path)
    cfg = rt.org_config(LoopConfig.from_toml(CONFIGS / "loop_demo.toml"), rt.DEFAULT, org="acme", base="tiny",
                        root=tmp_path / "loop", seed=3, users=16, backend="hf", concurrency=None)
    (tmp_path / "loop").mkdir()
    store = open_store(cfg.db_url())
    registry.register_checkpoint(store, "tiny", "tiny", state="production")
    picks = []
    for i, prefix in enumerate(("acme-aa", "acme-degraded")):  # each cycle's candidate in turn
        adapter = tmp_path / prefix
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text(json.dumps({"i": i}))
        rt.register_candidate(store, "acme", adapter, tmp_path / "snapshots", prefix=prefix, base="tiny", run=run,
                              what=prefix)
        users, gate = org_tasks(cfg)  # what the cycle with that candidate sends and gates on
        picks.append(([t.instance_id for t in users], [t.instance_id for t in gate]))
        counts = rt.check_requests(run, users, gate)
        assert 1 <= counts["requests"] <= rt.DEFAULT.user_tasks and 1 <= counts["gate"] <= rt.DEFAULT.gate_tasks
    (u, g), held = picks[0], {t.instance_id for t in load_tasks(run / "tasks" / "heldout.jsonl")}
    assert picks[1] == picks[0]  # every cycle sends and gates on the same tasks
    # the held-out side is sealed (stop 45): requests are train-side tasks, the gate the select slice
    assert not set(u) & set(g) and not (set(u) | set(g)) & held
    assert set(g) <= {t.instance_id for t in made["select"]}
    assert rt.confirm_slice_size(len(held), rt.DEFAULT) == len(held) >= 1
    # a split where a request is also a held-out task is refused in one line
    split = made["split"]
    split["heldout"]["tasks"].append(u[0])
    (run / "split.json").write_text(json.dumps(split))
    with pytest.raises(EtudeError, match="held-out side"):
        rt.check_requests(run, *org_tasks(cfg))


def _records() -> list[dict]:
    cycles = [rt.cycle_record("aa", _rep("rollback", reason="undecided after 2 round(s)"), [True] * 4, None),
              rt.cycle_record("degraded", _rep("rollback", reason="hack alarm: edit_rate"), [True] * 3, None),
              rt.cycle_record("specialised", _rep("rollback", basis="gate-only", reason="gate-only ..."), [True] * 2,
                              {"production": 1, "candidate": 1})]
    stages = [{"record": "stage", "scenario": sc, "stage": st, "status": "done", "seconds": 1.0 + i}
              for i, sc in enumerate(rt.SCENARIOS) for st in ("collect", "eval")]
    traffic = [{"record": "traffic", "scenario": "aa", "phase": p, "round": 0, "sessions": 4, "seconds": 60.0 + i,
                "sessions_per_min": 240.0 / (60.0 + i), "concurrency": 16, "executor": "threads",
                "server_backend": "vllm", "in_flight": 3.0 + i} for i, p in enumerate(("collect", "canary"))]
    ab = [{"record": "ab", "scenario": "aa", "user_id": f"u{i}", "arm": "treatment" if i % 2 else "control",
           "metric": m, "numerator": (i % 3) + 1, "denominator": 4, "ts": float(i)}
          for i in range(8) for m in ("accept_rate", "latency_s")]
    users = [{"record": "canary_user", "scenario": "aa", "user": r["user_id"],
              "arm": "canary" if r["arm"] == "treatment" else "control", "interactions": 4}
             for r in ab if r["metric"] == "latency_s"]
    confirm = [{"record": "confirm", "scenario": "specialised", "arm": f"confirm-{a}", "task": f"t{i}",
                "resolved": int(i == 0)} for a in ("production", "candidate") for i in range(3)]
    return cycles + stages + traffic + ab + users + confirm


def test_the_figures_verify_and_count_what_the_cycle_records_say(tmp_path, capsys):
    recs = _records()
    figs = rt.figures_of(recs, {"aa": {"alpha": 0.05, "weights": [0.5, 0.5], "power": 0.8}})
    doc = write_result(tmp_path / "realtime.json", figs, recs, provenance(argv=["bench/realtime.py"]))
    f = doc["figures"]
    assert (f["true_promotions"]["k"], f["false_promotions"]["k"], f["aa_promoted"]["k"]) == (0, 0, 0)
    assert (f["degraded_rolled_back"]["k"], f["degraded_caught_by_readout"]["k"]) == (1, 1)
    assert (f["org_b_untouched"]["k"], f["org_b_untouched"]["n"]) == (3, 3)
    assert f["users_per_arm.aa.control"]["n"] == 4 and f["users_per_arm.aa.canary"]["n"] == 4
    assert f["lift.aa.accept_rate"]["users_control"] == 4 and "lift.aa.latency_s" in f
    assert f["cycle_s.collect"]["n"] == 3 and f["cycle_s.collect"]["mean"] == pytest.approx(2.0)
    assert f["sessions_per_min"]["n"] == 2 and f["confirm.candidate_vs_production"]["gain"] == 0
    assert f["sessions_in_flight"]["mean"] == pytest.approx(3.5)
    assert "cycle_s.canary" not in f  # no cycle ran it: no figure rather than an empty one
    assert verify.main(["--results", str(tmp_path)]) == 0


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    out, results = tmp_path / "out", tmp_path / "results"
    run = tmp_path / "old-run"
    (run / "adapter").mkdir(parents=True)
    (run / "adapter" / "adapter_config.json").write_text("{}")
    (run / "tasks").mkdir()
    (run / "tasks" / "heldout.jsonl").write_text("")
    (run / "report.json").write_text(json.dumps({"org": "acme", "base": "tiny"}))
    (run / "split.json").write_text("{}")
    good = tmp_path / "good-run"
    (good / "adapter").mkdir(parents=True)
    (good / "adapter" / "adapter_config.json").write_text("{}")
    (good / "tasks").mkdir()
    (good / "tasks" / "heldout.jsonl").write_text("")
    (good / "report.json").write_text(json.dumps({"org": "acme", "base": "tiny", "heldout": {"tasks": 60},
                                                  "general": {"no_regression": True}}))
    (good / "split.json").write_text(json.dumps({"train": {"tasks": []}, "heldout": {"tasks": []}}))
    for args, says in ((["--adapter", str(tmp_path / "none")], "not a LoRA adapter directory"),
                       (["--adapter", str(run / "adapter")], "not a specialise report (missing 'heldout')"),
                       (["--adapter", str(good / "adapter")], "not a specialise split (missing 'select')"),
                       (["--quick", "--users", "1"], "--users must be at least 2"),
                       (["--quick", "--concurrency", "0"], "--concurrency must be at least 1")):
        assert rt.main([*args, "--out", str(out), "--results", str(results)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], lines
    assert not out.exists() and not results.exists()


def check_quick_result(results: Path) -> None:
    """What a `--quick` run must leave in RESULTS (also run by hand on a run's folder)."""
    doc = json.loads((results / "realtime.json").read_text())
    assert (results / "realtime.records.jsonl").is_file()
    assert verify.main(["--results", str(results)]) == 0
    f, meta = doc["figures"], doc["meta"]
    assert list(meta["cycles"]) == list(rt.SCENARIOS)
    # org B's arm: untouched by each of the three cycles, checked before, after every round and after
    assert (f["org_b_untouched"]["k"], f["org_b_untouched"]["n"]) == (3, 3)
    assert all(all(c["org_b_checks"]) and len(c["org_b_checks"]) >= 3 for c in meta["cycles"].values())
    recs = [json.loads(x) for x in (results / "realtime.records.jsonl").read_text().splitlines()]
    assert {r["scenario"]: r["decision"] for r in recs if r["record"] == "cycle"}.keys() == set(rt.SCENARIOS)
    assert f["true_promotions"]["n"] == 1 and f["false_promotions"]["n"] == 3 and f["aa_promoted"]["n"] == 1
    assert f["degraded_rolled_back"]["n"] == 1
    # the confirmation ran on held-out tasks neither the users nor the gate saw
    conf = meta["confirmation"]
    used = {t for c in meta["cycles"].values() for t in c["user_tasks"] + c["gate_tasks"]}
    assert conf["tasks"] and not set(conf["tasks"]) & used
    assert f["confirm.candidate_vs_production"]["n"] == len(conf["tasks"])
    assert f["sessions_per_min"]["n"] >= 3 and "cycle_s.collect" in f and "cycle_s.eval" in f
    # --quick keeps the tiny config's transformers server; every cycle's requests were checked held out
    assert meta["traffic"]["server_backend"] == "hf" and "sessions_in_flight" in f
    assert all(c["requests_split"]["requests"] == len(c["user_tasks"]) for c in meta["cycles"].values())


@pytest.mark.slow
@pytest.mark.timeout(3600)  # --quick took 25 minutes here on a machine shared with another benchmark
def test_quick_runs_three_real_cycles_and_leaves_org_b_untouched(tmp_path):
    results = tmp_path / "results"
    r = subprocess.run([sys.executable, str(BENCH_DIR / "realtime.py"), "--quick", "--quiet", "--out",
                        str(tmp_path / "out"), "--results", str(results)], capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    check_quick_result(results)
