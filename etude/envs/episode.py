"""One episode: a task, a fresh workspace at base, the harness running the policy, and grading
of the agent's diff in a second clean workspace.

The agent sees the task's problem statement and the repository at base (old tests; the task's
hidden `test_patch` is not there). Its commands run in the sandbox with the task's test venv, so
`python -m pytest` works for it as it does at grading. Its workspace is deleted after the diff is
taken; grading never reads it. Every command of the episode is capped at the task's timeout
(at most 120 s): run_terminal gives a model that asks for more the cap and says so. What this
does not do: score the episode (etude.rewards does that from the returned trajectory and outcome).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from etude.envs.grade import grade
from etude.harness import HarnessConfig, run_agent
from etude.protocols import Policy, ToolContext
from etude.sandbox import Workspace, make_sandbox
from etude.tasks.repo import prepare_repo, task_env
from etude.tasks.runner import sandbox_config
from etude.tools.base import ToolsConfig
from etude.types import Outcome, Task, Trajectory

MAX_COMMAND_S = 120.0  # no command of an agent's episode runs longer, whatever the task allows


def _request(task: Task) -> str:
    return (
        f"{task.problem_statement.strip()}\n\n"
        "The repository is checked out at /workspace (your tools' paths are relative to it). "
        "Run its tests with `python -m pytest`. Change the library code, not the tests, then submit."
    )


def command_limit_s(task: Task) -> float:
    """The hard cap on every command of the task's episode: its timeout, at most 120 s."""
    return min(task.timeout_s, MAX_COMMAND_S)


def tools_config(task: Task) -> ToolsConfig:
    """The agent's tool limits in the task's episode: run_terminal's timeout (default and the
    most a model may ask for) never exceeds `command_limit_s(task)`; a model asking for more
    gets the cap, and the observation says so."""
    cap = command_limit_s(task)
    return ToolsConfig(terminal_timeout_s=min(ToolsConfig.terminal_timeout_s, cap), terminal_max_timeout_s=cap)


def run_episode(
    task: Task,
    policy: Policy,
    harness_config: Any = None,
    *,
    trajectory_path: str | Path | None = None,
) -> tuple[Trajectory, Outcome]:
    """Run `policy` on `task` and grade the result. `harness_config` is a harness.HarnessConfig."""
    cfg = harness_config or HarnessConfig()
    template, venv = prepare_repo(task), task_env(task)
    # The agent's commands share one session sandbox per episode (a few ms each); grading below
    # runs in a clean copy with a fresh sandbox per command.
    cap = command_limit_s(task)
    tools_cfg = sandbox_config(task, venv, timeout_s=cap).for_tools()
    with Workspace.create(template) as ws, make_sandbox(ws.path, tools_cfg) as sandbox:
        ctx = ToolContext(workspace=ws.path, sandbox=sandbox, extra={"task_id": task.instance_id, "template": ws.template,
                                                                     "tools_config": tools_config(task)})
        traj = run_agent(policy, _request(task), ctx, cfg, task_id=task.instance_id,
                         trajectory_path=trajectory_path, diff_fn=ws.diff)  # fmt: skip
        diff = traj.diff or ws.diff()
    graded = grade(task, diff)
    meta = {**traj.meta, "outcome": graded.outcome.to_dict(), "ignored_paths": list(graded.ignored_paths)}
    return dataclasses.replace(traj, diff=diff, meta=meta), graded.outcome
