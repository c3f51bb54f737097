"""The one episode builder (etude.harness.episode): the workspace gets the sandbox config's disk
quota, the tools get the harness config's limits, and a follow-up runs in the same workspace.
Regression for issue 16, where three callers each assembled their own Workspace + sandbox +
ToolContext (none passed `workspace_disk_mb`, and tool limits travelled in `ToolContext.extra`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from etude.errors import EtudeError
from etude.harness import HarnessConfig
from etude.harness.episode import open_episode
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import ToolsConfig
from etude.sandbox import SandboxConfig


def _call(name: str, **args: object) -> str:
    return f'<tool_call>{json.dumps({"name": name, "arguments": args})}</tool_call>'


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "a.py").write_text("x = 1\n")
    return tmp_path / "repo"


def test_the_workspace_gets_the_sandbox_configs_disk_quota(repo: Path) -> None:
    with open_episode(repo, SandboxConfig(backend="unsandboxed", workspace_disk_mb=None)) as ep:
        assert ep.workspace.disk_mb is None and (ep.path / "a.py").read_text() == "x = 1\n"
    with open_episode(repo, SandboxConfig(backend="unsandboxed", workspace_disk_mb=32)) as ep:
        # 32 where this process may mount a tmpfs (root on Linux); None (and a warning) elsewhere
        assert ep.workspace.disk_mb in (32, None)


def test_tools_get_the_harness_configs_limits_and_the_follow_up_shares_the_workspace(repo: Path) -> None:
    cfg = HarnessConfig(max_steps=2, tools_config=ToolsConfig(terminal_max_timeout_s=3))
    policy = ScriptedPolicy([_call("run_terminal", command="echo hi > b.txt", timeout_s=60)])
    with open_episode(repo, SandboxConfig(backend="unsandboxed")) as ep:
        first = ep.run(policy, "go", cfg)
        obs = first.turns[0].tool_executions[0].result
        assert obs.meta["timeout_s"] == 3 and obs.meta["timeout_capped"] and "capped at 3 s" in obs.output
        assert "b.txt" in first.diff
        policy2 = ScriptedPolicy([_call("read_file", path="b.txt")])
        follow = ep.run(policy2, "again", cfg.replace(max_steps=1), history=first.messages)
        assert "hi" in follow.turns[0].tool_executions[0].result.output
    assert first.config["tools_config"]["terminal_max_timeout_s"] == 3  # the trajectory records the limits


def test_a_toml_table_gives_the_tool_limits_and_a_bad_key_is_named() -> None:
    assert HarnessConfig(tools_config={"grep_timeout_s": 5}).tools_config.grep_timeout_s == 5
    with pytest.raises(EtudeError, match="unknown key.*grep_timeout"):
        HarnessConfig(tools_config={"grep_timeout": 5})
