"""`etude sandbox exec` (typer/rich/stdlib only at top level; the sandbox is imported inside)."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

sandbox_app = typer.Typer(help="Run commands isolated (bubblewrap) in a workspace.", no_args_is_help=True)


@sandbox_app.command(
    "exec", context_settings={"allow_interspersed_args": False}, no_args_is_help=True
)
def exec_cmd(
    cmd: list[str] = typer.Argument(..., help="The command and its arguments (after --)."),
    workspace: Path = typer.Option(..., "--workspace", "-w", help="Directory mounted read-write at /workspace."),
    timeout: float = typer.Option(60.0, "--timeout", help="Wall-clock seconds; 124 and every process killed on expiry."),
    memory_mb: int = typer.Option(2048, "--memory-mb", help="Memory cap in MiB (0: none)."),
    max_procs: int = typer.Option(256, "--max-procs", help="Live processes/threads cap (pids cgroup)."),
    ro_bind: list[str] = typer.Option([], "--ro-bind", help="Host path bound read-only at the same path (repeatable)."),
    path_prepend: list[str] = typer.Option([], "--path-prepend", help="Directory put first on PATH inside (repeatable)."),
    venv: Path | None = typer.Option(None, "--venv", help="A virtual environment to bind read-only and put on PATH."),
    unsandboxed: bool = typer.Option(False, "--unsandboxed", help="Run on the host WITHOUT isolation (no bwrap)."),
) -> None:
    """Run CMD isolated with the workspace at /workspace; exit with CMD's status (124 on timeout)."""
    from etude.sandbox import SandboxConfig, run_passthrough

    binds, prepend = list(ro_bind), list(path_prepend)
    if venv is not None:
        binds.append(str(venv.absolute()))
        prepend.insert(0, str(venv.absolute() / "bin"))
    cfg = SandboxConfig(
        backend="unsandboxed" if unsandboxed else "bwrap",
        timeout_s=timeout,
        memory_mb=memory_mb or None,
        max_procs=max_procs or None,
        ro_binds=tuple(binds),
        path_prepend=tuple(prepend),
    )
    _validate(timeout, memory_mb)
    sys.stdout.flush()
    code = run_passthrough(cmd, workspace=workspace, config=cfg)
    raise typer.Exit(code)


def _validate(timeout: float, memory_mb: int) -> None:
    from etude.errors import EtudeError

    if timeout <= 0:
        raise EtudeError(f"--timeout must be positive, got {timeout}")
    if memory_mb < 0:
        raise EtudeError(f"--memory-mb must be >= 0, got {memory_mb}")


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
