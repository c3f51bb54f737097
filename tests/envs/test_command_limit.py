"""The task's timeout is a hard cap on every command of its episode (issue 16): the tool limits
an episode hands run_terminal never exceed it, whatever the model asks."""

from __future__ import annotations

from pathlib import Path

from etude.envs.episode import MAX_COMMAND_S, command_limit_s, tools_config
from etude.protocols import ExecResult, ToolContext
from etude.tools import run_tool
from etude.types import Task


def _task(timeout_s: float) -> Task:
    return Task(instance_id="t", repo="r", base_commit="b", patch="", test_patch="", problem_statement="p",
                timeout_s=timeout_s)


class _Recorder:
    def __init__(self, workspace: Path) -> None:
        self.workspace, self.timeouts = workspace, []

    def exec(self, argv, *, timeout_s=None, stdin=None):  # noqa: ANN001
        self.timeouts.append(timeout_s)
        return ExecResult(returncode=0, stdout="", stderr="")


def test_the_cap_is_the_tasks_timeout_at_most_120_s() -> None:
    assert command_limit_s(_task(7)) == 7 and command_limit_s(_task(900)) == MAX_COMMAND_S == 120
    cfg = tools_config(_task(7))
    assert cfg.terminal_max_timeout_s == 7 and cfg.terminal_timeout_s == 7
    assert tools_config(_task(900)).terminal_timeout_s == 60  # the default stays when under the cap


def test_a_model_asking_for_600_s_gets_the_tasks_cap(tmp_path: Path) -> None:
    sb = _Recorder(tmp_path)
    ctx = ToolContext(workspace=tmp_path, sandbox=sb, config=tools_config(_task(9)))
    res = run_tool("run_terminal", {"command": "sleep 1000", "timeout_s": 600}, ctx)
    assert sb.timeouts == [9.0] and res.meta["timeout_capped"] and "capped at 9 s" in res.output
