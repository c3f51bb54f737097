"""The README's five-minute tour, run as written: each offline command of it exits 0 and prints
what the README says it does (issue 16: claims equal code). The commands that need the network
(`etude tasks mine/synth`), a model server or minutes of training are covered by their own
components' end-to-end tests and are not repeated here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
TOUR = ROOT / "README.md"


def _etude(*args: str, stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "etude.cli", *args], input=stdin, capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def test_the_tour_lists_the_commands_tested_here() -> None:
    text = TOUR.read_text()
    for cmd in ("etude sandbox exec --workspace /tmp/ws --timeout 5", "etude tool grep --workspace .",
                "| etude parse", "etude agent --example", "etude ab analyze --events docs/examples/events.csv"):
        assert cmd in text, f"the README tour no longer shows {cmd!r}: update this test with it"


def test_sandbox_exec(tmp_path: Path) -> None:
    # like /tmp/ws on a fresh machine: the workspace does not exist yet (created, mkdir -p)
    res = _etude("sandbox", "exec", "--workspace", str(tmp_path / "ws"), "--timeout", "5", "--", "python", "-c",
                 "print('hello from the sandbox')")
    assert res.returncode == 0 and "hello from the sandbox" in res.stdout, res.stderr


def test_tool_grep() -> None:
    res = _etude("tool", "grep", "--workspace", ".", "--args", '{"pattern": "def run_agent", "glob": "*.py"}')
    assert res.returncode == 0 and "etude/harness/loop.py" in res.stdout, res.stderr


def test_parse() -> None:
    line = '<tool_call>{"name": "read_file", "arguments": {"path": "README.md"}}</tool_call>'
    res = _etude("parse", stdin=line + "\n")
    assert res.returncode == 0 and "read_file" in res.stdout and "README.md" in res.stdout, res.stderr


def test_agent_example(tmp_path: Path) -> None:
    res = _etude("agent", "--example", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert re.search(r"patch: \d+ file", res.stdout + res.stderr)


def test_ab_analyze_on_the_checked_in_example(tmp_path: Path) -> None:
    res = _etude("ab", "analyze", "--events", "docs/examples/events.csv", "--out", str(tmp_path / "readout.json"))
    assert res.returncode == 0 and "accepted: control" in res.stdout, res.stderr
    assert (tmp_path / "readout.json").is_file()
