"""run_terminal: through a given sandbox (a recording fake) and through the real bwrap sandbox."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from etude.protocols import ExecResult, ToolContext
from etude.tools import run_tool
from etude.tools.base import ToolsConfig


@dataclass
class FakeSandbox:
    """Records each call and answers with a fixed ExecResult."""

    workspace: Path
    result: ExecResult
    calls: list[tuple[list[str], float | None, str | None]] = field(default_factory=list)

    def exec(self, argv: Sequence[str], *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        self.calls.append((list(argv), timeout_s, stdin))
        return self.result


def fake(ws: Path, **kw) -> tuple[FakeSandbox, ToolContext]:
    sb = FakeSandbox(ws, ExecResult(**{"returncode": 0, "stdout": "", "stderr": "", **kw}))
    return sb, ToolContext(workspace=ws, sandbox=sb)


def test_runs_bash_c_with_timeout_and_empty_stdin(ws: Path) -> None:
    sb, ctx = fake(ws, stdout="hi\n")
    res = run_tool("run_terminal", {"command": "echo hi", "timeout_s": 5}, ctx)
    assert res.ok and res.output == "hi\n[exit code 0]"
    assert sb.calls == [(["bash", "-c", "echo hi"], 5.0, "")]
    run_tool("run_terminal", {"command": "true"}, ctx)
    assert sb.calls[-1][1] == 60.0  # the default


def test_timeout_above_config_max_is_clamped(ws: Path) -> None:
    sb, ctx = fake(ws)
    ctx.config = ToolsConfig(terminal_max_timeout_s=10)
    run_tool("run_terminal", {"command": "true", "timeout_s": 300}, ctx)
    assert sb.calls[-1][1] == 10.0
    assert not run_tool("run_terminal", {"command": "true", "timeout_s": 9999}, ctx).ok  # schema maximum
    assert not run_tool("run_terminal", {"command": ""}, ctx).ok


def test_asking_past_the_cap_gets_the_cap_and_the_observation_says_so(ws: Path) -> None:
    sb, ctx = fake(ws, stdout="ok\n")
    ctx.config = ToolsConfig(terminal_timeout_s=3, terminal_max_timeout_s=5)
    res = run_tool("run_terminal", {"command": "make test", "timeout_s": 600}, ctx)
    assert sb.calls[-1][1] == 5.0
    assert res.ok and res.output.startswith("[timeout_s 600 is above this episode's limit: capped at 5 s]\n")
    assert res.meta["timeout_s"] == 5.0 and res.meta["timeout_capped"] is True
    res = run_tool("run_terminal", {"command": "make test", "timeout_s": 4}, ctx)
    assert sb.calls[-1][1] == 4.0 and not res.meta["timeout_capped"] and not res.output.startswith("[timeout_s")


def test_nonzero_exit_is_ok_with_exit_code(ws: Path) -> None:
    _, ctx = fake(ws, returncode=1, stdout="F\n", stderr="AssertionError\n")
    res = run_tool("run_terminal", {"command": "pytest"}, ctx)
    assert res.ok and res.meta["exit_code"] == 1
    assert res.output == "F\n[stderr]\nAssertionError\n[exit code 1]"


def test_timeout_is_not_ok_and_keeps_partial_output(ws: Path) -> None:
    _, ctx = fake(ws, returncode=124, stdout="started\n", timed_out=True)
    res = run_tool("run_terminal", {"command": "sleep 99", "timeout_s": 2}, ctx)
    assert not res.ok and res.meta["error_kind"] == "timeout" and res.meta["timed_out"]
    assert "timed out after 2 s" in res.error and res.output.startswith("started")


def test_long_output_keeps_head_and_tail(ws: Path) -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    _, ctx = fake(ws, returncode=1, stdout=text)
    ctx.config = ToolsConfig(terminal_max_output_chars=1000)
    res = run_tool("run_terminal", {"command": "x"}, ctx)
    assert res.meta["truncated"] and len(res.output) < 1100
    assert res.output.startswith("line 0\nline 1\n") and res.output.endswith("line 4999\n[exit code 1]")
    assert "characters truncated from the middle" in res.output


def test_broken_sandbox_is_an_observation(ws: Path) -> None:
    class Broken:
        workspace = ws

        def exec(self, argv, *, timeout_s=None, stdin=None):
            raise OSError("bwrap: no permission")

    res = run_tool("run_terminal", {"command": "ls"}, ToolContext(workspace=ws, sandbox=Broken()))
    assert not res.ok and res.meta["error_kind"] == "sandbox_error" and "bwrap: no permission" in res.error


# The real sandbox (bubblewrap), made by the tool itself since the context has none.


@pytest.fixture
def real_ctx(ws: Path) -> ToolContext:
    from etude.sandbox.bwrap import bwrap_exe

    try:
        bwrap_exe()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"bubblewrap unavailable: {e}")
    return ToolContext(workspace=ws)


def test_real_sandbox_runs_in_workspace_and_writes_land(real_ctx: ToolContext, ws: Path) -> None:
    res = run_tool("run_terminal", {"command": "pwd; cat README.md | head -1; echo made > out.txt; exit 4"}, real_ctx)
    assert res.ok and res.meta["exit_code"] == 4
    assert res.output == "/workspace\n# demo\n[exit code 4]"
    assert (ws / "out.txt").read_text() == "made\n"


def test_real_sandbox_hides_the_host_and_times_out(real_ctx: ToolContext, outside: Path) -> None:
    res = run_tool("run_terminal", {"command": f"cat {outside}/secret.txt; cat outdir/secret.txt"}, real_ctx)
    assert res.ok and "TOP SECRET" not in res.output and res.meta["exit_code"] != 0
    res = run_tool("run_terminal", {"command": "echo before; sleep 30", "timeout_s": 1}, real_ctx)
    assert not res.ok and res.meta["timed_out"] and res.meta["exit_code"] == 124
    assert res.output.startswith("before")
