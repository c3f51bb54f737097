"""One episode: a task, a fresh workspace at base, the harness running the policy, and grading
of the agent's diff in a second clean workspace. The workspace, sandbox and tool context come from
the one episode builder (etude.harness.episode); this module adds what a task decides: its
repository, its test venv, its command cap and its request.

The agent sees the task's problem statement and the repository at base (old tests; the task's
hidden `test_patch` is not there). Its commands run in the sandbox with the task's test venv, so
`python -m pytest` works for it as it does at grading. Its workspace is deleted after the diff is
taken; grading never reads it. Every command of the episode is capped at the task's timeout
(at most 120 s): run_terminal gives a model that asks for more the cap and says so. What this
does not do: score the episode (etude.rewards does that from the returned trajectory and outcome).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from etude.envs.grade import grade
from etude.harness import HarnessConfig
from etude.harness.episode import AgentEpisode, open_episode
from etude.protocols import Policy, ToolsConfig
from etude.tasks.repo import prepare_repo, task_env
from etude.tasks.runner import task_sandbox_config
from etude.types import Outcome, Task, Trajectory, Turn

MAX_COMMAND_S = 120.0  # no command of an agent's episode runs longer, whatever the task allows
# How the agent is told to run a task's tests. `-o addopts=` drops the package's own pytest options,
# which often name plugins the task's environment does not have (parse's `--cov=...` makes a bare
# `python -m pytest` exit with a usage error); the grader runs the same way (tasks.runner).
TEST_COMMAND = "python -m pytest -o addopts="
# The agent's terminal is 80 columns wide, as a terminal is by default. Grading runs pytest at 300
# (tasks.runner) so that its short summary keeps whole messages; at 300 the agent saw every pytest
# separator line padded to 300 characters, about 900 characters of a 2,000-character observation.
AGENT_COLUMNS = "80"


def task_request(task: Task) -> str:
    """What the agent is asked: the task's problem statement and how to run its tests. Training,
    evaluation and scripted users send the same text (no gap between them)."""
    return (
        f"{task.problem_statement.strip()}\n\n"
        "The repository is checked out at /workspace (your tools' paths are relative to it). "
        f"Run its tests with `{TEST_COMMAND}`. Change the library code, not the tests, then submit."
    )


def command_limit_s(task: Task) -> float:
    """The hard cap on every command of the task's episode: its timeout, at most 120 s."""
    return min(task.timeout_s, MAX_COMMAND_S)


def tools_config(task: Task, base: ToolsConfig | None = None) -> ToolsConfig:
    """The agent's tool limits in the task's episode: `base` (default ToolsConfig()) with
    run_terminal's timeout (default and the most a model may ask for) at most
    `command_limit_s(task)`; a model asking for more gets the cap, and the observation says so."""
    base = base or ToolsConfig()
    cap = min(command_limit_s(task), base.terminal_max_timeout_s)
    return dataclasses.replace(base, terminal_timeout_s=min(base.terminal_timeout_s, cap), terminal_max_timeout_s=cap)


def task_harness_config(task: Task, harness_config: HarnessConfig | None = None) -> HarnessConfig:
    """`harness_config` (default HarnessConfig()) with its tool limits capped for `task`."""
    cfg = harness_config or HarnessConfig()
    return cfg.replace(tools_config=tools_config(task, cfg.tools_config))


@contextmanager
def open_task_episode(task: Task) -> Iterator[AgentEpisode]:
    """The episode builder on the task: a workspace of its repository at base and a session
    sandbox with its test venv, every command capped at `command_limit_s(task)`, and a terminal
    `AGENT_COLUMNS` wide."""
    template, venv = prepare_repo(task), task_env(task)
    sandbox = task_sandbox_config(task, venv, timeout_s=command_limit_s(task))
    sandbox = dataclasses.replace(sandbox, env={**sandbox.env, "COLUMNS": AGENT_COLUMNS})
    with open_episode(template, sandbox) as ep:
        yield ep


def run_episode(
    task: Task,
    policy: Policy,
    harness_config: HarnessConfig | None = None,
    *,
    trajectory_path: str | Path | None = None,
    on_turn: Callable[[Turn], None] | None = None,
) -> tuple[Trajectory, Outcome]:
    """Run `policy` on `task` and grade the result in a clean copy (fresh sandbox per command).
    `on_turn` is run_agent's: called after each turn; what it raises ends the episode, ungraded."""
    cfg = task_harness_config(task, harness_config)
    with open_task_episode(task) as ep:
        traj = ep.run(policy, task_request(task), cfg, task_id=task.instance_id, trajectory_path=trajectory_path,
                      on_turn=on_turn)
        diff = traj.diff or ep.diff()
    graded = grade(task, diff)
    meta = {**traj.meta, "outcome": graded.outcome.to_dict(), "ignored_paths": list(graded.ignored_paths)}
    return dataclasses.replace(traj, diff=diff, meta=meta), graded.outcome
