"""LoopConfig from TOML: the shipped config loads, typos are one-line errors (exit 2 from the CLI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.loop import LoopConfig

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_tiny_config_loads() -> None:
    cfg = LoopConfig.from_toml(ROOT / "configs" / "loop_tiny.toml")
    assert cfg.model == "tiny" and cfg.traffic.kind == "scripted" and cfg.traffic.executor == "ray"
    assert cfg.canary.weights == (0.5, 0.5) and cfg.canary.guardrails[0].metric == "dissatisfied_rate"
    assert {a.metric for a in cfg.alarms.rules} == {"tool_error_rate", "clarification_rate", "edit_rate", "answer_length"}


@pytest.mark.parametrize("text, message", [
    ("[train]\nstepz = 3\n", "unknown key(s) in [train]: stepz"),
    ("[bogus]\nx = 1\n", "unknown table(s) in loop config: bogus"),
    ("[canary]\nprimary = \"nope\"\n", "unknown metric(s) nope"),
    ("[canary]\nweights = [1.0]\n", "weights must be two positive numbers"),
    ("[traffic]\nkind = \"command\"\n", "needs a command"),
    ("[traffic]\nexecutor = \"dask\"\n", "executor must be ray or threads, not 'dask'"),
    ("[alarms]\nrules = [{ metric = \"x\", colour = 1 }]\n", "unknown key(s) in [alarms.rules]: colour"),
    ("[server]\nbackend = \"tensorrt\"\n", "[server] backend must be one of hf, vllm, not 'tensorrt'"),
    ("[server]\nmax_batch = 0\n", "[server] max_batch must be >= 1"),
    ("[server]\nbakend = \"vllm\"\n", "unknown key(s) in [server]: bakend"),
    ("[distill]\nweights = { repeatd_calls = 1.0 }\n", "[distill] weights: unknown reward term(s) repeatd_calls"),
    ("[distill]\nweights = { repeated_calls = \"high\" }\n", "distill.weights.weights values must be numbers"),
    ("[traffic.harness]\nmax_stepz = 3\n", "unknown key(s) in [traffic.harness]: max_stepz"),
])
def test_bad_config_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "c.toml"
    p.write_text(text)
    with pytest.raises(EtudeError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        LoopConfig.from_toml(p)


def test_cli_bad_config_exits_2_without_traceback(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("[train]\nsteps = \"many\"\nstepz = 1\n")
    res = subprocess.run([sys.executable, "-m", "etude.cli", "loop", "--config", str(p)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith(f"etude: error: {p}: unknown key(s) in [train]: stepz")
    assert "Traceback" not in res.stderr
    missing = subprocess.run([sys.executable, "-m", "etude.cli", "loop", "--config", str(tmp_path / "none.toml")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "cannot read loop config" in missing.stderr


def test_server_table_picks_the_loop_servers_engine(tmp_path: Path) -> None:
    from etude.loop.server import serve_argv

    p = tmp_path / "c.toml"
    p.write_text('[loop]\nmodel = "smollm2"\n[server]\nbackend = "vllm"\n')
    cfg = LoopConfig.from_toml(p)
    assert (cfg.server.backend, cfg.for_org("acme").server.backend, LoopConfig().server.backend) == ("vllm", "vllm", "hf")
    argv = serve_argv("sqlite:///x.db", 8001, model=cfg.model, backend=cfg.server.backend, max_batch=cfg.server.max_batch)
    assert argv[argv.index("--backend") + 1] == "vllm" and "--max-batch" not in argv  # vLLM has no batcher cap
    hf = serve_argv("sqlite:///x.db", 8001, max_batch=32)
    assert "--backend" not in hf and hf[hf.index("--max-batch") + 1] == "32"


def test_eval_table_verify_edits_reaches_the_gate_harness(tmp_path: Path) -> None:
    from etude.loop.cycle import gate_eval_config

    p = tmp_path / "c.toml"
    p.write_text("[eval]\nverify_edits = 4\nmax_steps = 8\n")
    cfg = LoopConfig.from_toml(p)
    h = gate_eval_config(cfg).harness
    assert (h.verify_edits, h.max_steps) == (4, 8) and gate_eval_config(LoopConfig()).harness.verify_edits == 0
    p.write_text('[eval]\nverify_edits = "many"\n')
    with pytest.raises(EtudeError, match="verify_edits"):
        LoopConfig.from_toml(p)


def test_eval_harness_table_is_the_gates_harness(tmp_path: Path) -> None:
    from etude.loop.cycle import gate_eval_config

    p = tmp_path / "c.toml"
    p.write_text('[eval]\nverify_edits = 8\n[eval.harness]\nmax_steps = 8\nmax_tokens_per_turn = 160\n'
                 'tools = ["read_file", "edit_file", "grep", "run_terminal"]\ntemperature = 0.0\n')
    cfg = LoopConfig.from_toml(p)
    h = gate_eval_config(cfg.for_org("acme")).harness
    assert (h.max_steps, h.max_tokens_per_turn, h.temperature, h.verify_edits) == (8, 160, 0.0, 8)
    assert h.tools == ("read_file", "edit_file", "grep", "run_terminal")
    p.write_text("[eval.harness]\nmax_stepz = 8\n")
    with pytest.raises(EtudeError, match="max_stepz"):
        LoopConfig.from_toml(p)


def test_eval_backend_is_the_gates_engine_and_part_of_its_cache_key(tmp_path: Path) -> None:
    from etude.loop.cycle import _eval_key, gate_eval_config

    p = tmp_path / "c.toml"
    p.write_text('[eval]\nbackend = "vllm"\n')
    cfg = LoopConfig.from_toml(p)
    assert gate_eval_config(cfg).backend == "vllm" and gate_eval_config(LoopConfig()).backend == "hf"
    def key(c: LoopConfig) -> str:
        return _eval_key(gate_eval_config(c), c.eval.suite)

    assert key(cfg) != key(LoopConfig())  # production evaluated on another engine is not reused
    p.write_text("[eval]\nverify_edits = 8\n")
    assert key(LoopConfig.from_toml(p)) != key(LoopConfig())  # nor under another harness
    p.write_text('[eval]\nbackend = "tpu"\n')
    with pytest.raises(EtudeError, match=r"\[eval\] backend"):
        LoopConfig.from_toml(p)


def test_behaviour_config_runs_productions_harness_and_weights_the_behaviour_first(tmp_path: Path) -> None:
    cfg = LoopConfig.from_toml(ROOT / "configs" / "loop_behaviour.toml")
    h = cfg.traffic.harness
    assert h is not None and h.tools == ("read_file", "edit_file", "grep", "run_terminal", "semantic_search")
    assert cfg.traffic.sampling_temperature() == h.temperature == 0.7
    w = cfg.distill.reward_config().weights
    assert w["repeated_calls"] == 1.0 and w["broken_calls"] == 2.0 and w["followup"] == 0.5  # merged over the defaults
    assert cfg.canary.primary == "repeat_rate" and not cfg.canary.primary_higher_is_better
    # filtered behaviour cloning, a per-call guardrail and the noise measured on the collect window
    assert cfg.train.negative_weight == 0.0 and cfg.canary.user_cv_from == "collect" and cfg.canary.user_cv is None
    assert cfg.canary.aa_check_splits == 200
    assert {"broken_call_rate", "tool_error_rate"} <= {g.metric for g in cfg.canary.guardrails}
    assert LoopConfig().distill.reward_config() is None  # no table: the rewards' defaults
    # without [traffic.harness] the users' sampling temperature is [traffic] temperature
    p = tmp_path / "c.toml"
    p.write_text("[traffic]\ntemperature = 0.3\n")
    assert LoopConfig.from_toml(p).traffic.sampling_temperature() == 0.3


def test_cli_candidate_must_be_a_model_directory(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "etude.cli", "loop", "--config", str(ROOT / "configs" / "loop_tiny.toml"),
                        "--candidate", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr and "not a model directory" in r.stderr
