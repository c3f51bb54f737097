"""`etude specialise` with bad input: one line on stderr, exit 2, nothing written."""

import subprocess
import sys

import pytest


def _spec(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "etude.cli", "specialise", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


@pytest.fixture
def home(tmp_path, monkeypatch):
    import os

    env = {**os.environ, "ETUDE_HOME": str(tmp_path / "home"), "ETUDE_CACHE": str(tmp_path / "cache")}
    return env


@pytest.mark.parametrize("args, says", [
    (["--org", "bad org!", "--repos", "click==8.1.7"], "not a slug"),
    (["--org", "acme", "--repos", "{tmp}/not-a-dir"], "neither NAME==VERSION nor a directory"),
    (["--org", "acme", "--repos", "{tmp}/plain"], "not a git repository"),
    (["--org", "acme", "--repos", "itsdangerous==2.2.0"], "sealed test split"),
    (["--org", "acme", "--repos", "click==8.1.7", "--base", "{tmp}/plain"], "is not a model directory"),
    (["--org", "acme", "--repos", "click==8.1.7", "--minutes", "0"], "--minutes must be positive"),
    (["--org", "acme", "--repos", "no-such-package-etude-xyz==0.0.1"], "no-such-package-etude-xyz"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, home, args, says):
    (tmp_path / "plain").mkdir()
    out = tmp_path / "out"
    r = _spec(*[a.replace("{tmp}", str(tmp_path)) for a in args], "--out", str(out), cwd=tmp_path, env=home)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and says in lines[0], r.stderr
    assert not (tmp_path / "home").exists()  # no store, no registry
    assert not list((tmp_path / "cache").rglob("*.jsonl")) if (tmp_path / "cache").exists() else True


def test_until_names_a_stage(tmp_path):
    from etude.errors import EtudeError
    from etude.pipeline.specialise import STAGES, SpecialiseConfig, run_specialise

    cfg = SpecialiseConfig(org="acme", repos=("click==8.1.7",), out=str(tmp_path / "out"), base="tiny")
    with pytest.raises(EtudeError, match="no stage 'sft'; the stages are: 1. tasks"):
        run_specialise(cfg, until="sft")
    assert not (tmp_path / "out").exists() and "3. SFT (LoRA)" in STAGES


def test_the_cli_budget_default_is_the_configs():
    """`etude specialise --minutes` states its default beside SpecialiseConfig's (the CLI does not
    import the pipeline at start-up): the two must not drift apart."""
    import typer

    from etude.cli import app
    from etude.pipeline.specialise import SpecialiseConfig
    from etude.pipeline.specialise_time import TimeSpecialiseConfig

    cmd = typer.main.get_command(app).commands["specialise"]
    minutes = next(p for p in cmd.params if p.name == "minutes")
    assert minutes.default is None  # the config's own default applies, by split
    assert f"default {SpecialiseConfig.minutes:g}, with --until {TimeSpecialiseConfig.minutes:g}" in minutes.help
