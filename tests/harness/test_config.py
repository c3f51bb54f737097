"""`HarnessConfig.from_table` goes through the config library (etude.configfile): unknown keys and
wrong types are one EtudeError naming the key, for every command that reads a harness table
(`etude eval --agent-config`, `etude sft`'s `[harness]`, `etude train`'s `[env.harness]`); from the
CLI that is one line on stderr and exit 2. Regression for issue 33 item 5, where a wrong type
(`max_steps = "8"`) got through from_table and failed later, or not at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import etude.evals.cli as eval_cli
from etude.cli import app
from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.protocols import ToolsConfig


def test_from_table_checks_types_and_keys_and_names_the_table() -> None:
    with pytest.raises(EtudeError, match=r"^env\.harness\.max_steps must be an integer, not str \('8'\)$"):
        HarnessConfig.from_table({"max_steps": "8"}, "env.harness")
    with pytest.raises(EtudeError, match=r"^harness\.tools must be a list, not str \('grep'\)$"):
        HarnessConfig.from_table({"tools": "grep"})
    with pytest.raises(EtudeError, match=r"^harness\.parallel_tools must be true or false, not int \(1\)$"):
        HarnessConfig.from_table({"parallel_tools": 1})
    with pytest.raises(EtudeError, match=r"^harness\.tools_config\.grep_timeout_s must be a number, not str"):
        HarnessConfig.from_table({"tools_config": {"grep_timeout_s": "5"}})
    with pytest.raises(EtudeError, match=r"^unknown key\(s\) in \[harness\]: max_step \(known: .*max_steps"):
        HarnessConfig.from_table({"max_step": 8})
    with pytest.raises(EtudeError, match=r"^unknown key\(s\) in \[harness\.tools_config\]: grep_timeout \(known: "):
        HarnessConfig.from_table({"tools_config": {"grep_timeout": 5}})
    with pytest.raises(EtudeError, match=r"^\[harness\] must be a table, not int$"):
        HarnessConfig.from_table(3)


def test_a_correct_table_loads_with_ints_for_floats_and_lists_for_tuples() -> None:
    hc = HarnessConfig.from_table({"max_steps": 8, "temperature": 1, "time_limit_s": 60, "system_prompt": None,
                                   "tools": ["read_file", "grep"], "tools_config": {"grep_timeout_s": 5}})
    assert (hc.max_steps, hc.temperature, hc.time_limit_s, hc.tools) == (8, 1, 60, ("read_file", "grep"))
    assert hc.tools_config == ToolsConfig(grep_timeout_s=5)
    assert HarnessConfig.from_table({}) == HarnessConfig()
    # what a trajectory stores (to_dict) reads back equal through the same door
    assert HarnessConfig.from_table(hc.to_dict()) == hc


def test_agent_config_is_loaded_through_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "agent.toml"
    f.write_text('model = "smollm2"\n[harness]\nmax_steps = 8\ntemperature = 1\ntools = ["read_file", "grep"]\n')
    seen = {}
    monkeypatch.setattr(eval_cli, "run_eval", lambda suite, model, out, cfg, use: seen.setdefault("cfg", cfg) and {})
    r = CliRunner().invoke(app, ["eval", "--suite", "builtin:eval", "--model", "noop", "--out", str(tmp_path / "o"),
                                 "--agent-config", str(f)])
    assert r.exit_code == 0, r.output
    assert seen["cfg"].harness == HarnessConfig(max_steps=8, temperature=1.0, tools=("read_file", "grep"))


BAD = {
    "eval --agent-config": ('[harness]\nmax_steps = "8"\n', "harness.max_steps must be an integer, not str ('8')"),
    "eval --agent-config tools_config": ('[harness.tools_config]\nterminal_timeout_s = "x"\n',
                                         "harness.tools_config.terminal_timeout_s must be a number, not str ('x')"),
    "sft": ('[harness]\ntemperature = "hot"\n', "harness.temperature must be a number, not str ('hot')"),
    "train": ('[env]\nname = "tasks"\n[env.harness]\ntools = "grep"\n', "env.harness.tools must be a list, not str ('grep')"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_wrong_harness_type_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    body, says = BAD[name]
    f = tmp_path / "bad.toml"
    f.write_text(body)
    out = tmp_path / "out"
    args = {"sft": ["sft", "--config", str(f), "--out", str(out)],
            "train": ["train", "--config", str(f), "--out", str(out)]}.get(
        name, ["eval", "--suite", "builtin:eval", "--model", "noop", "--out", str(out), "--agent-config", str(f)])
    r = subprocess.run([sys.executable, "-m", "etude.cli", *args], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and says in lines[0] and str(f) in lines[0], r.stderr
    assert not out.exists()
