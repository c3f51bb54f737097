"""The learning path's wiring (etude.pipeline.learning) with small fakes for the engines
(evaluation, SFT, RL) and the curriculum, so it runs in seconds: bench/agent_learning.py runs the
stages in order with one on-disk layout and writes its result through write_result (verified as
bench/verify.py does); a rerun reads every stage back; a larger RL budget redoes RL and what reads
it only; the demo's stages 2-4 are the same stages, under the demo's names. Regression for issue
33, where the bench ran its own copy of the demo's base -> SFT -> eval pipeline."""

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

import etude.demo.run as demo_run
import etude.pipeline.learning as learning
from etude.demo.run import Demo, DemoConfig
from etude.evals.results import check_result
from etude.pipeline.learning import SLICE, TASKS, run_warm_start
from etude.tasks import load_tasks, save_tasks
from etude.types import Task
from tests.bench import load_bench

ROOT = Path(__file__).resolve().parents[2]
SFT_CONFIG, RL_CONFIG = ROOT / "configs" / "agent_sft.toml", ROOT / "configs" / "agent_rl.toml"
PATCH = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n def f(x):\n-    return x\n+    return -x\n"
SOLVES = {"tiny-base": 0, "final": 3, "ckpt": 5}  # a model resolves the tasks numbered below this


def _task(iid: str) -> Task:
    return Task(instance_id=iid, repo="pkg", base_commit="", patch=PATCH, test_patch="", problem_statement="fix f",
                source={"package": iid.rsplit("-", 1)[0]})


class Engines:
    """Fakes of run_eval, run_sft and train that write what the real ones write (the parts the
    pipeline and the bench read) and count their calls per output folder."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.eval_cfgs: dict[str, object] = {}

    def run_eval(self, suite, model, out, cfg, use=None, fresh_for_new_weights=False):
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.calls[out.name] += 1
        self.eval_cfgs[out.name] = cfg
        tasks = load_tasks(suite)
        k = SOLVES[Path(model).name]
        res = [int(t.instance_id.rsplit("-", 1)[1]) < k for t in tasks]
        with (out / "results.jsonl").open("w") as f:
            for t, r in zip(tasks, res, strict=True):
                f.write(json.dumps({"instance_id": t.instance_id, "sample": 0, "status": "ok", "resolved": r,
                                    "diff": "d" if r else "", "reward": {"total": float(r)},
                                    "efficiency": {"calls_well_formed": 1, "tokens": 100, "stop_reason": "submit"}})
                        + "\n")
        (out / "run.json").write_text(json.dumps({"model": model, "config": cfg.to_dict()}))
        n, s = len(tasks), sum(res)
        summary = {"tasks": n, "errors": 0, "correctness": {"resolved_rate": {"mean": s / n, "ci_low": 0.0,
                                                                               "ci_high": 1.0}},
                   "behaviour": {"valid_call_rate": {"mean": 1.0}, "tokens_per_resolved": 100 * n / max(1, s)},
                   "efficiency": {"stop_reasons": {"submit": n}}, "reward": {"mean": s / n}}
        (out / "summary.json").write_text(json.dumps(summary))
        return summary

    def run_sft(self, cfg, out):
        out = Path(out)
        (out / "final").mkdir(parents=True, exist_ok=True)
        self.calls["sft"] += 1
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 2.0}) + "\n")
        res = {"final": str(out / "final"), "steps": 1, "trajectories": {"expert": 2}, "train_tokens": 50,
               "loss_tokens": 20, "last": {"loss": 2.0}}
        (out / "summary.json").write_text(json.dumps(res))
        return res

    def train(self, cfg, out):
        out = Path(out)
        (out / "ckpt").mkdir(parents=True, exist_ok=True)
        self.calls["rl"] += 1
        self.calls[f"rl steps={cfg.steps}"] += 1
        (out / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "reward": 0.5, "samples": 8,
                                                       "step_s": 1.5}) + "\n")
        return {"checkpoint": str(out / "ckpt")}


def _curriculum(split, level=1, seed=0, max_tasks=None, progress=None, use=None):
    return [_task(f"{split}-{i}") for i in range(8 if split == "test" else 4)][:max_tasks]


@pytest.fixture
def engines(monkeypatch):
    e = Engines()
    for name in ("run_eval", "run_sft", "train"):
        monkeypatch.setattr(learning, name, getattr(e, name))
    monkeypatch.setattr(learning, "in_child", lambda fn, *a, **k: fn(*a, **k))  # the fakes count in this process
    monkeypatch.setattr(learning, "builtin_curriculum", _curriculum)
    monkeypatch.setattr(learning, "build", lambda specs, level, n: [_task(f"munch-{i}") for i in range(3)])
    return e


def _bench(monkeypatch, tmp_path, *extra):
    mod = load_bench("agent_learning")
    monkeypatch.setattr(mod, "builtin_curriculum", _curriculum)
    out = tmp_path / "results" / "agent_learning.json"
    monkeypatch.setattr(sys, "argv", ["agent_learning.py", "--work", str(tmp_path / "work"), "--out", str(out),
                                      "--model", "tiny-base", "--sft-config", str(SFT_CONFIG),
                                      "--rl-config", str(RL_CONFIG), "--rl-steps", "2", "--no-split", "nosplitpkg==1.0",
                                      "--no-split-max", "3", *extra])
    mod.main()
    return json.loads(out.read_text()), out


def test_agent_learning_runs_the_pipeline_and_writes_a_verifiable_result(tmp_path, monkeypatch, engines):
    doc, out = _bench(monkeypatch, tmp_path)
    work = tmp_path / "work"
    for p in (SLICE, "nosplit.jsonl", "state.json", "eval-base", "sft/final", "eval-sft", "rl/ckpt", "eval-rl",
              "nosplit-base", "nosplit-sft", "nosplit-rl"):
        assert (work / p).exists(), p
    assert engines.calls == Counter({"eval-base": 1, "sft": 1, "eval-sft": 1, "rl": 1, "rl steps=2": 1, "eval-rl": 1,
                                     "nosplit-base": 1, "nosplit-sft": 1, "nosplit-rl": 1})
    assert engines.eval_cfgs["eval-base"].executor == "threads" and engines.eval_cfgs["eval-base"].harness.temperature == 0

    assert check_result(out) == []  # provenance, records and every figure recomputed, as bench/verify.py does
    assert doc["provenance"]["git_commit"] and doc["records"]["count"] == 3 * 8 + 3 * 3
    f = doc["figures"]
    assert (f["heldout.sft_vs_base"]["a_k"], f["heldout.sft_vs_base"]["b_k"], f["heldout.sft_vs_base"]["n"]) == (0, 3, 8)
    assert (f["heldout.rl_vs_sft"]["b_only"], f["no_split.sft_vs_base"]["b_k"]) == (2, 3)
    assert f["heldout.sft_vs_base.tool_use"]["gain"] == 0.0
    m = doc["meta"]
    assert m["comparisons"]["sft_vs_base"]["gain_points"] == 3 / 8 == f["heldout.sft_vs_base"]["gain"]
    assert set(m["stages"]) == {"base", "sft", "rl"} and m["stages"]["rl"]["train"]["steps"] == 1
    assert m["no_split"]["rl_vs_sft"]["gain_points"] == 0.0 and m["no_split"]["packages"] == ["nosplitpkg==1.0"]
    assert {"curriculum_s", "base_eval_s", "sft_s", "sft_eval_s", "rl_s", "rl_eval_s", "no_split_rl_eval_s",
            "total_s"} <= set(m["wall_s"])
    assert m["held_out_tasks"] == 8 and m["harness"]["temperature"] == 0.0
    assert (out.parent / "agent_learning" / "resolved.png").is_file()

    # the same run again: every stage is read back, no engine runs
    before = Counter(engines.calls)
    _bench(monkeypatch, tmp_path)
    assert engines.calls == before
    # a larger RL budget: RL and what reads its checkpoint run again, nothing before it
    doc2, out2 = _bench(monkeypatch, tmp_path, "--rl-steps", "3")
    assert engines.calls["rl steps=3"] == 1 and engines.calls["eval-rl"] == engines.calls["nosplit-rl"] == 2
    assert engines.calls["sft"] == engines.calls["eval-base"] == engines.calls["eval-sft"] == 1
    assert check_result(out2) == []
    # --analyse-only runs nothing and writes a verifiable result from the evaluations on disk
    before = Counter(engines.calls)
    doc3, out3 = _bench(monkeypatch, tmp_path, "--analyse-only")
    assert engines.calls == before and check_result(out3) == []
    assert doc3["figures"]["heldout.rl_vs_sft"]["gain"] == doc2["figures"]["heldout.rl_vs_sft"]["gain"] == 2 / 8


def test_a_bad_no_split_package_is_one_line_before_anything_runs(tmp_path, monkeypatch, engines, capsys):
    with pytest.raises(SystemExit) as e:
        _bench(monkeypatch, tmp_path, "--no-split", "isodate==0.7.2")
    assert "no_split names packages of the built-in split" in str(e.value.code)
    assert not (tmp_path / "work").exists() and not engines.calls


def test_the_demo_runs_the_same_warm_start_stages(tmp_path, monkeypatch, engines):
    monkeypatch.setattr(demo_run, "compare", lambda a, b, cfg, use: {"gate": "inconclusive"})  # the gate has its own tests
    demo = Demo(DemoConfig(backend="hf", out=str(tmp_path / "demo"), model="tiny-base", agent_config=str(SFT_CONFIG)))
    save_tasks([_task(f"test-{i}") for i in range(6)], demo.out / SLICE)
    demo.stage(TASKS, lambda: ({}, "six tasks"))
    sft = run_warm_start(demo.runner, demo.out, "tiny-base", demo.sft, demo.eval_setup())
    state = json.loads((demo.out / "demo_state.json").read_text())
    assert list(state["stages"]) == ["1. tasks", "2. base evaluation", "3. general warm start (SFT)",
                                     "4. warm-start evaluation"]
    assert sft["final"] == str(demo.out / "sft" / "final")
    cfg = engines.eval_cfgs["eval-sft"]  # the demo's evaluations: on Ray, with reports, as before
    assert (cfg.executor, cfg.report, cfg.bootstrap, cfg.workers) == ("ray", True, 500, 8)
    res, summary = demo.compare()
    assert res["heldout"]["sft"]["resolved"] == 3 and res["heldout"]["base"]["resolved"] == 0
    assert res["heldout"]["sft_vs_base"]["gain"] == 0.5 and "sft 6/6" in summary
