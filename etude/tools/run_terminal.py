"""run_terminal: a shell command in the sandbox, cwd /workspace, with a timeout.

The command runs as `bash -c COMMAND` through `ctx.sandbox` when the context has one, else
through a fresh `etude.sandbox.make_sandbox(ctx.workspace, SandboxConfig())` (bubblewrap: no
network, only the workspace writable); a caller that wants other limits or mounts passes its own
sandbox (the episode builder, etude.harness.session, always does). I use `bash -c`, not `-lc`: a login shell would read profile files
that may reset PATH and hide the bound virtual environment.

A command that exits non-zero is ok=True (it ran; the exit code is in the output and in
`meta["exit_code"]`). A timeout is ok=False with a clear error, and the partial output is kept.
stdin is empty, so a command waiting for input gets EOF rather than hanging until the timeout.
The timeout the model asks for (`timeout_s`, default `terminal_timeout_s`) is capped at
`ToolsConfig.terminal_max_timeout_s` (an episode sets it to its task's limit); when it was
cut, the observation's first line says so and `meta["timeout_capped"]` is true.
Output keeps its head and tail and drops the middle past `terminal_max_output_chars`.
"""

from __future__ import annotations

from typing import Any

from etude.protocols import ExecResult, Sandbox, ToolContext
from etude.sandbox import SandboxConfig, make_sandbox
from etude.tools.base import BaseTool, ToolError, config_of, function_schema, truncate_middle
from etude.tools.paths import workspace_root
from etude.types import ToolResult


class RunTerminal(BaseTool):
    name = "run_terminal"
    schema = function_schema(
        "run_terminal",
        "Run a bash command in the workspace (cwd /workspace, no network, no input). Returns stdout, "
        "stderr and the exit code. Use it to run tests, scripts and git.",
        {
            "command": {"type": "string", "minLength": 1, "description": "bash command line"},
            "timeout_s": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": 600,
                "description": "seconds before the command is killed (default 60)",
            },
        },
        ["command"],
    )

    def _run(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        cfg = config_of(ctx)
        asked = float(args.get("timeout_s") or cfg.terminal_timeout_s)
        timeout = min(asked, cfg.terminal_max_timeout_s)  # a hard cap: the model cannot ask past it
        try:
            sandbox = ctx.sandbox or _default_sandbox(ctx)
            res = sandbox.exec(["bash", "-c", args["command"]], timeout_s=timeout, stdin="")
        except Exception as e:  # noqa: BLE001 - a broken sandbox is an observation, not a crash
            raise ToolError(
                f"the sandbox could not run the command: {type(e).__name__}: {e}", kind="sandbox_error"
            ) from None
        output, cut = truncate_middle(_render(res), cfg.terminal_max_output_chars)
        if asked > timeout:
            output = f"[timeout_s {asked:g} is above this episode's limit: capped at {timeout:g} s]\n" + output
        meta = {
            "exit_code": res.returncode,
            "timeout_s": timeout,
            "timeout_capped": asked > timeout,
            "timed_out": res.timed_out,
            "wall_s": round(res.wall_s, 3),
            "truncated": bool(cut) or res.truncated,
            "stdout_chars": len(res.stdout),
            "stderr_chars": len(res.stderr),
        }
        if res.timed_out:
            error = f"command timed out after {timeout:g} s and was killed (every process); partial output shown"
            return ToolResult(ok=False, output=output, error=error, meta={"error_kind": "timeout", **meta})
        return ToolResult(ok=True, output=output, meta=meta)


def _default_sandbox(ctx: ToolContext) -> Sandbox:
    return make_sandbox(workspace_root(ctx.workspace), SandboxConfig())


def _render(res: ExecResult) -> str:
    parts = []
    if res.stdout:
        parts.append(res.stdout.rstrip("\n"))
    if res.stderr:
        parts.append("[stderr]\n" + res.stderr.rstrip("\n"))
    if not parts:
        parts.append("[no output]")
    status = "timed out" if res.timed_out else f"exit code {res.returncode}"
    return "\n".join(parts) + f"\n[{status}]"


TOOL = RunTerminal()
