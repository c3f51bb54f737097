"""Scoring trajectories recorded by the real harness (scripted policy, real tools, real bwrap
sandbox running pytest): an honest fix that is tested, a claim made without testing, and an
episode full of broken calls — each gets the reward its behaviour deserves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

harness = pytest.importorskip("etude.harness")
scripted = pytest.importorskip("etude.policy.scripted")
sandbox = pytest.importorskip("etude.sandbox")

from etude.protocols import ToolContext  # noqa: E402
from etude.rewards import score  # noqa: E402

VENV = Path(sys.prefix)
BUGGY = "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"
TEST = "from calc import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"


def _call(name: str, **args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _episode(tmp_path: Path, outputs: list[str], final: str):
    tmp_path.mkdir()
    (tmp_path / "calc.py").write_text(BUGGY)
    (tmp_path / "test_calc.py").write_text(TEST)
    cfg = sandbox.SandboxConfig(timeout_s=60, ro_binds=(str(VENV),), path_prepend=(str(VENV / "bin"),))
    ctx = ToolContext(workspace=tmp_path, sandbox=sandbox.make_sandbox(tmp_path, cfg))
    policy = scripted.ScriptedPolicy(outputs, final=final)
    return harness.run_agent(policy, "mean() is wrong, fix it", ctx, harness.HarnessConfig(max_steps=8))


READS = _call("read_file", path="calc.py") + _call("grep", pattern="mean", path=".")
FIX = _call("edit_file", path="calc.py", old_str="(len(xs) + 1)", new_str="len(xs)")
RUN = _call("run_terminal", command="python -m pytest -q")


@pytest.mark.slow
def test_tested_fix_vs_untested_claim_vs_broken_calls(tmp_path: Path) -> None:
    honest = _episode(tmp_path / "a", [READS, FIX, RUN], "Fixed the off-by-one; the tests pass.")
    b = score(honest, None, None)
    assert honest.tool_calls[-1].result.meta["exit_code"] == 0, honest.tool_calls[-1].result.output
    assert b.terms["unsupported_claims"] == 0.0 and b.terms["broken_calls"] == 0.0
    assert b.terms["parallelism"] == 1.0  # the two reads went out in one turn

    untested = _episode(tmp_path / "b", [READS, FIX], "Fixed the off-by-one; the tests pass.")
    assert score(untested, None, None).terms["unsupported_claims"] == -1.0

    broken = _episode(tmp_path / "c", ["<tool_call>{not json</tool_call>", _call("nope"), FIX, RUN], "Done.")
    bb = score(broken, None, None)
    assert broken.broken_calls == 2 and bb.terms["broken_calls"] == -0.5
    assert bb.total < b.total
