"""The one episode builder: a copy-on-write workspace of a folder, one session sandbox for the
agent's commands, the tool context, and `run_agent`.

Every agent episode in etude is built here: RL environments, SFT data and evaluation
(`etude.envs.run_episode`, a task's repository and test venv), scripted users
(`etude.loop.users`, the same, driving the served model over HTTP) and `etude agent`
(`etude.harness.agent.run_on_repo`, the user's repository and our venv). They differ in the
folder, the `SandboxConfig` and the `HarnessConfig` they pass, nothing else.

    with open_episode(template, sandbox_config) as ep:
        traj = ep.run(policy, request, harness_config)
        patch = ep.diff()

The workspace's writable layer is capped at `sandbox_config.workspace_disk_mb` (ENOSPC past it);
the sandbox is a session sandbox where the config allows (`SandboxConfig.for_tools`), so it is
for the agent's tools only: grading runs the tests in a clean copy with a fresh sandbox per
command (etude.envs.grade). The tools get `harness_config.tools_config` as their limits.
Not guaranteed: the template must not change while the episode runs (the workspace reads
through to it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etude.harness.config import HarnessConfig
from etude.harness.loop import run_agent
from etude.protocols import Policy, Sandbox, ToolContext
from etude.sandbox import SandboxConfig, Workspace, make_sandbox
from etude.types import Trajectory


@dataclass(frozen=True)
class AgentEpisode:
    """An open episode: its workspace and its sandbox. `run` may be called more than once (a
    follow-up request in the same workspace continues from `history`)."""

    workspace: Workspace
    sandbox: Sandbox

    @property
    def path(self) -> Path:
        """The workspace on the host (the agent sees it at /workspace)."""
        return self.workspace.path

    def context(self, config: HarnessConfig) -> ToolContext:
        return ToolContext(workspace=self.workspace.path, sandbox=self.sandbox, config=config.tools_config,
                           template=self.workspace.template)

    def run(self, policy: Policy, request: str, config: HarnessConfig, **kw: Any) -> Trajectory:
        """`run_agent` in this workspace; `kw` are run_agent's (task_id, trajectory_path, history,
        on_turn, meta). The trajectory's diff is the workspace's diff when the episode ends."""
        return run_agent(policy, request, self.context(config), config, diff_fn=self.workspace.diff, **kw)

    def diff(self) -> str:
        return self.workspace.diff()


@contextmanager
def open_episode(template: str | Path, sandbox: SandboxConfig) -> Iterator[AgentEpisode]:
    """A fresh workspace of `template` (disk capped at `sandbox.workspace_disk_mb`) and a sandbox
    for the agent's commands; both are removed on exit."""
    with Workspace.create(template, disk_mb=sandbox.workspace_disk_mb) as ws, \
            make_sandbox(ws.path, sandbox.for_tools()) as sb:
        yield AgentEpisode(ws, sb)
