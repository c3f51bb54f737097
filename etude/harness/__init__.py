"""The agent harness: prompt, parser, agent loop and trajectory files (see docs/harness.md).

The same code runs in training (etude.envs) and in production (etude.serve, `etude agent`); it
does not know which one it is in.
"""

from etude.harness.config import DEFAULT_TOOLS, READ_ONLY_TOOLS, HarnessConfig
from etude.harness.loop import run_agent
from etude.harness.prompt import (
    DEFAULT_SYSTEM_PROMPT,
    SUBMIT,
    SUBMIT_SCHEMA,
    build_messages,
    render_tool_calls_text,
    render_tools_prompt,
    system_prompt,
)
from etude.harness.record import TrajectoryWriter, load_trajectories, load_trajectory, trajectory_from_dict
from etude.toolcalls import FORMATS, parse_hermes, parse_openai_tool_calls, parse_output, to_json_dict

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TOOLS",
    "FORMATS",
    "READ_ONLY_TOOLS",
    "SUBMIT",
    "SUBMIT_SCHEMA",
    "HarnessConfig",
    "TrajectoryWriter",
    "build_messages",
    "load_trajectories",
    "load_trajectory",
    "parse_hermes",
    "parse_openai_tool_calls",
    "parse_output",
    "render_tool_calls_text",
    "render_tools_prompt",
    "run_agent",
    "system_prompt",
    "to_json_dict",
    "trajectory_from_dict",
]
