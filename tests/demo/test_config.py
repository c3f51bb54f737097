"""`etude demo --config FILE.toml`: DemoConfig from TOML through etude.configfile (keys and types
checked), on top of the defaults or of --quick's settings, with the flags given on the command
line over the file; a bad file is one line on stderr and exit 2, before anything runs."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

import etude.demo.run as demo_run
from etude.cli import app
from etude.demo.config import QUICK, DemoConfig, load_demo_config


def test_a_good_file_loads_over_the_base(tmp_path):
    f = tmp_path / "demo.toml"
    f.write_text('eval_tasks = 12\norg = "globex"\nworkers = 4\n')
    cfg = load_demo_config(f)
    assert (cfg.eval_tasks, cfg.org, cfg.workers, cfg.model) == (12, "globex", 4, DemoConfig().model)
    q = load_demo_config(f, QUICK, {"model": "smollm2"})
    assert (q.eval_tasks, q.org, q.sft_tasks, q.model) == (12, "globex", QUICK.sft_tasks, "smollm2")


def test_flags_given_override_the_file(tmp_path, monkeypatch):
    f = tmp_path / "demo.toml"
    f.write_text(f'eval_tasks = 12\nout = "{tmp_path / "from-file"}"\nbackend = "hf"\n')
    seen = []
    monkeypatch.setattr(demo_run, "run_demo", seen.append)
    r = CliRunner().invoke(app, ["demo", "--quick", "--config", str(f), "--model", "tiny", "--record"])
    assert r.exit_code == 0, r.output
    cfg = seen[0]
    assert (cfg.eval_tasks, cfg.out, cfg.backend, cfg.model, cfg.record) == (12, str(tmp_path / "from-file"), "hf",
                                                                              "tiny", True)
    assert cfg.sft_tasks == QUICK.sft_tasks  # --quick's, the file does not set it
    r = CliRunner().invoke(app, ["demo", "--config", str(f), "--out", str(tmp_path / "flag")])
    assert r.exit_code == 0, r.output
    assert (seen[1].out, seen[1].eval_tasks, seen[1].model) == (str(tmp_path / "flag"), 12, DemoConfig().model)
    r = CliRunner().invoke(app, ["demo", "--quick"])  # no file: as before
    assert r.exit_code == 0, r.output
    assert seen[2].out == "runs/demo-quick" and seen[2].model == "tiny"


@pytest.mark.parametrize("body, says", [
    ("eval_taks = 3\n", "unknown key(s) in the top level: eval_taks (known: "),
    ("spec_minutes = \"long\"\n", "spec_minutes must be a number, not str ('long')"),
])
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, body, says):
    f = tmp_path / "bad.toml"
    f.write_text(body)
    r = subprocess.run([sys.executable, "-m", "etude.cli", "demo", "--config", str(f), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and says in lines[0] and str(f) in lines[0], r.stderr
    assert not (tmp_path / "out").exists()
