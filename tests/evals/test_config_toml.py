"""`etude eval --config FILE.toml`: EvalConfig from TOML through etude.configfile (keys and types
checked, [harness] and [reward] tables as their components' configs), the flags given on the
command line over the file; a bad file is one line on stderr and exit 2, before anything runs."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import etude.evals.cli as eval_cli
from etude.cli import app
from etude.evals import EvalConfig

GOOD = """
workers = 3
executor = "threads"
samples = 2
ruff_select = ["E9"]
[harness]
max_steps = 7
tools = ["read_file", "edit_file"]
[reward]
step_budget = 12
"""


def test_a_good_file_loads_with_its_tables(tmp_path):
    f = tmp_path / "eval.toml"
    f.write_text(GOOD)
    cfg = EvalConfig.from_toml(f)
    assert (cfg.workers, cfg.executor, cfg.samples, cfg.ruff_select) == (3, "threads", 2, ("E9",))
    assert cfg.harness_config().max_steps == 7 and cfg.harness_config().tools == ("read_file", "edit_file")
    assert cfg.reward_config().step_budget == 12
    assert EvalConfig.from_toml(f, {"harness.max_steps": 9}).harness_config().max_steps == 9


def test_flags_given_override_the_file_and_defaults_do_not(tmp_path, monkeypatch):
    f = tmp_path / "eval.toml"
    f.write_text(GOOD)
    seen = {}
    monkeypatch.setattr(eval_cli, "run_eval", lambda suite, model, out, cfg, use: seen.setdefault("cfg", cfg) and {})
    r = CliRunner().invoke(app, ["eval", "--suite", "builtin:eval", "--model", "noop", "--out", str(tmp_path / "o"),
                                 "--config", str(f), "--workers", "5"])
    assert r.exit_code == 0, r.output
    cfg = seen["cfg"]
    # --workers was given: it wins; --executor, --samples, --max-steps were not: the file's stand
    assert (cfg.workers, cfg.executor, cfg.samples, cfg.harness_config().max_steps) == (5, "threads", 2, 7)


@pytest.mark.parametrize("body, says", [
    ("workers = 2\nwrokers = 3\n", "unknown key(s) in the top level: wrokers (known: "),
    ("workers = \"many\"\n", "workers must be an integer, not str ('many')"),
    ("[harness]\nmax_steps = 1.5\n", "harness.max_steps must be an integer, not float (1.5)"),
    ("harness = 3\n", "[harness] must be a table, not int (3)"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, body, says):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    r = subprocess.run([sys.executable, "-m", "etude.cli", "eval", "--suite", "builtin:eval", "--model", "noop",
                        "--out", str(tmp_path / "out"), "--config", str(f)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and says in lines[0] and str(f) in lines[0], r.stderr
    assert not (tmp_path / "out").exists()
