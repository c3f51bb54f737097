"""End to end: a few real steps with the tiny model, real envs (the pyfunc one runs the sandbox),
checkpoints, resume after kill -9, and staleness accounting on Ray."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from etude.envs.families import ENVS, ArithEnv, Problem, PyFuncEnv
from etude.errors import EtudeError
from etude.policy.local import LocalPolicy
from etude.train import TrainConfig, load_config, train
from etude.train.config import EnvConfig
from etude.train.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]


class LettersEnv(ArithEnv):
    """A test family with a dense reward even a random model earns: the share of a-z letters."""

    name = "letters"

    def check(self, problem: Problem, text: str):
        frac = sum("a" <= c <= "z" for c in text) / max(1, len(text))
        return frac, {"letters": frac}, frac > 0.5


def _tiny(**kw) -> TrainConfig:
    base = dict(model="tiny", steps=2, prompts_per_step=2, group_size=3, max_new_tokens=8, lr=1e-2,
                checkpoint_every=1, eval_problems=2, env=EnvConfig(name="arith", num_train=16, num_test=4))
    base.update(kw)
    return TrainConfig(**base)


def _train_records(out: Path) -> list[dict]:
    return [r for r in read_metrics(out) if r["kind"] == "train"]


def test_pyfunc_env_scores_answers_in_the_sandbox():
    env = PyFuncEnv()
    p = next(x for x in env.problems("train") if x.id.endswith("-add"))
    good = env.check(p, "```python\ndef add(a, b):\n    return a + b\n```")
    half = env.check(p, "def add(a, b):\n    return 3")
    bad = env.check(p, "def add(a, b): return open('/etc/shadow').read()")
    assert good == (1.0, {"tests": 1.0, "format": 1.0}, True)
    assert half[0] == pytest.approx(1 / 3) and half[1]["format"] == 0.0 and not half[2]
    assert bad[0] == 0.0


def test_pyfunc_marker_cannot_be_forged_by_printing():
    env = PyFuncEnv()
    p = env.problems("train")[0]
    assert env.check(p, "print('ETUDE x 3 3')")[0] == 0.0


@pytest.mark.slow
def test_tiny_training_in_the_sandbox_writes_metrics_and_a_servable_checkpoint(tmp_path):
    cfg = _tiny(env=EnvConfig(name="pyfunc", num_test=2), max_new_tokens=12)
    res = train(cfg, tmp_path, progress=False)
    recs = _train_records(tmp_path)
    assert [r["step"] for r in recs] == [1, 2] and [r["batch_id"] for r in recs] == [0, 1]
    assert [r["policy_version"] for r in recs] == [0, 1] and all(r["staleness"] == 0 for r in recs)
    for r in recs:  # behaviour = sampler = trainer, so importance ratios are 1
        assert r["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
        assert {"reward", "reward/tests", "reward/format", "resolved", "clip_frac", "kl", "gen_tokens_per_s"} <= set(r)
    state = json.loads((Path(res["checkpoint"]) / "state.json").read_text())
    assert state["consumed"] == [0, 1] and state["step"] == 2 and state["config"]["env"]["name"] == "pyfunc"
    assert (Path(res["checkpoint"]) / "optimizer.safetensors").is_file()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    pol = LocalPolicy.from_pretrained(res["checkpoint"])  # a checkpoint is a model directory
    assert pol.generate_ids([[1, 2, 3]], max_tokens=2)[0].token_ids


@pytest.mark.slow
def test_a_dense_reward_moves_the_weights(tmp_path, monkeypatch):
    monkeypatch.setitem(ENVS, "letters", LettersEnv)
    from etude.policy.models import load_model

    before = {k: v.clone() for k, v in load_model("tiny")[0].state_dict().items()}
    res = train(_tiny(env=EnvConfig(name="letters", num_train=16, num_test=2)), tmp_path, progress=False)
    after = LocalPolicy.from_pretrained(res["checkpoint"]).model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)
    assert all(r["grad_norm"] > 0 for r in _train_records(tmp_path))


@pytest.mark.slow
def test_lora_trains_only_the_adapter(tmp_path):
    cfg = TrainConfig.from_dict({**_tiny(steps=1).to_dict(), "lora": {"enabled": True, "r": 4, "alpha": 8}})
    res = train(cfg, tmp_path, progress=False)
    ck = Path(res["checkpoint"])
    assert (ck / "adapter_model.safetensors").is_file() and not (ck / "model.safetensors").exists()


def test_bad_config_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('model = "tiny"\nstepz = 3\n')
    with pytest.raises(EtudeError, match="unknown key.*stepz"):
        load_config(bad)
    with pytest.raises(EtudeError, match="baseline"):
        TrainConfig(group_size=1)
    r = subprocess.run([sys.executable, "-m", "etude.cli", "train", "--config", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2 and "stepz" in r.stderr and "Traceback" not in r.stderr


def test_shipped_configs_load():
    assert load_config(ROOT / "configs" / "tiny.toml").model == "tiny"
    assert load_config(ROOT / "configs" / "smollm.toml").model == "smollm2"


@pytest.mark.slow
def test_resume_after_kill_9_repeats_and_skips_no_batch(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "etude.cli", "train", "--config", str(ROOT / "configs" / "tiny.toml"), "--out", str(out),
           "--set", "steps=6", "--set", "checkpoint_every=2", "--set", "prompts_per_step=2", "--set", "group_size=2",
           "--set", "max_new_tokens=6", "--set", "env.name=\"arith\"", "--set", "eval_problems=1",
           "--set", "step_delay_s=1.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 240
    while time.time() < deadline and not (latest.is_file() and latest.read_text().strip() == "step-000002"):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.read_text().strip() == "step-000002"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["resumed_from"].endswith("step-000002")
    state = json.loads((out / "checkpoints" / "step-000006" / "state.json").read_text())
    assert state["consumed"] == [0, 1, 2, 3, 4, 5]
    recs = _train_records(out)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6] and [r["batch_id"] for r in recs] == list(range(6))


@pytest.mark.slow
def test_ray_rollouts_respect_max_staleness_and_record_versions(tmp_path):
    cfg = TrainConfig.from_dict({**_tiny(steps=4).to_dict(), "use_ray": True, "max_staleness": 1,
                                 "ray": {"num_workers": 2, "num_cpus": 2, "worker_threads": 1}})
    try:
        train(cfg, tmp_path, progress=False)
    finally:
        import ray

        ray.shutdown()
    recs = _train_records(tmp_path)
    assert [r["batch_id"] for r in recs] == [0, 1, 2, 3]
    # batch 1 is dispatched at version 0 next to batch 0, then each batch k at version k-1
    assert [r["policy_version"] for r in recs] == [0, 0, 1, 2]
    assert [r["staleness"] for r in recs] == [0, 1, 1, 1]
    assert {r["worker"] for r in recs} <= {"ray-0", "ray-1"}


@pytest.mark.slow
@pytest.mark.parametrize("use_ray", [False, True])
def test_multi_turn_repository_tasks_feed_the_same_learner(tmp_path, use_ray):
    """Real tasks from the built-in suite, run through the harness in the sandbox and graded, in
    process or on a Ray rollout actor (configs/agent_rl.toml's way)."""
    from etude.tasks import builtin_suite, save_tasks

    tasks = builtin_suite("train", max_tasks=2, use="train")
    if len(tasks) < 2:
        pytest.skip("built-in suite unavailable")
    save_tasks(tasks, tmp_path / "tasks.jsonl")
    cfg = TrainConfig.from_dict({**_tiny(steps=1, prompts_per_step=1, group_size=2, max_new_tokens=16).to_dict(),
                                 "env": {"name": "tasks", "tasks_file": str(tmp_path / "tasks.jsonl"),
                                         "num_test": 1, "max_steps": 2}, "eval_problems": 1,
                                 "use_ray": use_ray, "ray": {"num_workers": 1, "worker_threads": 1}})
    res = train(cfg, tmp_path / "run", progress=False)
    (rec,) = _train_records(tmp_path / "run")
    assert rec["worker"] == ("ray-0" if use_ray else "local")
    assert rec["samples"] == 2 and rec["gen_tokens"] > 0 and rec["staleness"] == 0
    assert rec["resolved"] == 0.0  # a random model fixes nothing; the point is the path ran
    assert json.loads((Path(res["checkpoint"]) / "state.json").read_text())["consumed"] == [0]


def test_agent_rl_config_rolls_out_on_one_ray_actor():
    from etude.train import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "agent_rl.toml")
    assert cfg.use_ray and cfg.ray.num_workers == 1 and cfg.max_staleness == 0 and cfg.env.name == "tasks"


def test_vllm_rollouts_leave_ray_unless_told_otherwise():
    from etude.train import load_config
    from etude.train.config import with_rollout_backend

    path = Path(__file__).resolve().parents[2] / "configs" / "agent_rl.toml"
    cfg = load_config(path, with_rollout_backend({}, "vllm"))
    assert cfg.rollout_backend == "vllm" and not cfg.use_ray
    hf = load_config(path, with_rollout_backend({}, "hf"))
    assert hf.rollout_backend == "hf" and hf.use_ray  # the config's own choice stands
    assert with_rollout_backend({"use_ray": True}, "vllm")["use_ray"] is True  # --set wins


def test_unreachable_ray_address_is_one_line(tmp_path):
    from etude.errors import EtudeError

    cfg = TrainConfig.from_dict({**_tiny(steps=1).to_dict(), "use_ray": True, "ray": {"address": "127.0.0.1:1"}})
    with pytest.raises(EtudeError, match="no Ray cluster answers at 127.0.0.1:1"):
        train(cfg, tmp_path, progress=False)


@pytest.mark.slow
def test_resuming_under_a_changed_config_keeps_the_earlier_one_and_refuses_another_model(tmp_path, capsys):
    """Regression: a resume rewrote config.json, so nothing recorded what trained the steps before
    it; and a resume with another base model loaded the old checkpoint into it."""
    out = tmp_path / "run"
    train(_tiny(steps=1), out, progress=False)
    train(_tiny(steps=2, lr=5e-3), out, progress=False)
    err = capsys.readouterr().err
    assert "resuming" in err and "at step 1" in err and "lr: 0.01 -> 0.005" in err and "steps: 1 -> 2" in err
    assert json.loads((out / "config.before-step-1.json").read_text())["lr"] == 1e-2
    assert json.loads((out / "config.json").read_text())["lr"] == 5e-3
    with pytest.raises(EtudeError, match="trained with model = 'tiny'.*--fresh"):
        train(_tiny(steps=3, model="smollm2"), out, progress=False)
    assert json.loads((out / "config.json").read_text())["steps"] == 2  # the refusal touched nothing
    capsys.readouterr()
    train(_tiny(steps=2, lr=5e-3), out, progress=False)  # the same config again: nothing to say or keep
    assert "changed config" not in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("config*.json")) == ["config.before-step-1.json", "config.json"]
