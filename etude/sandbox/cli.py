"""`etude sandbox exec` (typer/rich/stdlib only at top level; the sandbox is imported inside)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from etude.errors import EtudeError
from etude.sandbox import SandboxConfig, run_passthrough
from etude.sandbox.workspace import Workspace

sandbox_app = typer.Typer(help="Run commands isolated (bubblewrap) in a workspace.", no_args_is_help=True)


@sandbox_app.callback()
def _group() -> None:
    """Run commands isolated (bubblewrap) in a workspace."""
    # NOTE: a callback keeps this a command group, so `exec` stays a subcommand even when the
    # app runs on its own (`python -m etude.sandbox.cli exec ...`).


@sandbox_app.command("exec", context_settings={"allow_interspersed_args": False}, no_args_is_help=True)
def exec_cmd(
    cmd: Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")],
    workspace: Annotated[Path, typer.Option(
        "--workspace", "-w",
        help="Directory mounted read-write at /workspace; created (with its parents, like mkdir -p) if missing.")],
    timeout: Annotated[
        float, typer.Option(help="Wall-clock seconds; on expiry every process is killed, exit 124.")
    ] = 60.0,
    memory_mb: Annotated[int, typer.Option(help="Memory cap in MiB (0: none).")] = 2048,
    max_procs: Annotated[int, typer.Option(help="Cap on live processes/threads (0: none).")] = 256,
    ro_bind: Annotated[
        list[str] | None, typer.Option(help="Host path bound read-only at the same path (repeatable).")
    ] = None,
    path_prepend: Annotated[
        list[str] | None, typer.Option(help="Directory put first on PATH inside (repeatable).")
    ] = None,
    venv: Annotated[Path | None, typer.Option(help="A virtual environment to bind read-only and put on PATH.")] = None,
    unsandboxed: Annotated[
        bool, typer.Option(help="Run on the host WITHOUT any isolation (machines without bwrap).")
    ] = False,
    disk_mb: Annotated[int, typer.Option(
        "--disk-mb",
        help="Cap on what the command may write, as episodes have: it runs in a copy of the workspace on an "
             "ext4 image of this many MiB (writes past it fail with 'No space left'), and what it leaves is "
             "copied back to the workspace when it ends. 0: the workspace itself, mounted uncapped.")] = 1024,
) -> None:
    """Run CMD isolated with the workspace at /workspace; exit with CMD's status (124 on timeout)."""
    binds, prepend = list(ro_bind or ()), list(path_prepend or ())
    if venv is not None:
        binds.append(str(venv.absolute()))
        prepend.insert(0, str(venv.absolute() / "bin"))
    _validate(timeout, memory_mb)
    if disk_mb < 0:
        raise EtudeError(f"--disk-mb must be >= 0, got {disk_mb}")
    _ensure_workspace(workspace)
    cfg = SandboxConfig(
        backend="unsandboxed" if unsandboxed else "bwrap",
        timeout_s=timeout,
        memory_mb=memory_mb or None,
        max_procs=max_procs or None,
        ro_binds=tuple(binds),
        path_prepend=tuple(prepend),
    )
    sys.stdout.flush()
    if not disk_mb or unsandboxed:
        raise typer.Exit(run_passthrough(cmd, workspace=workspace, config=cfg))
    with Workspace.create(workspace, kind="copy", disk_mb=disk_mb) as ws:
        try:
            code = run_passthrough(cmd, workspace=ws.path, config=cfg)
        finally:
            sync_back(ws.path, workspace)  # what the command left, whatever its status
    raise typer.Exit(code)


def sync_back(src: Path, dst: Path) -> None:
    """Make `dst` hold what `src` holds: files and links copied where they differ, new folders
    made, what `src` no longer has removed. Paths are compared as they are (no link followed)."""
    import filecmp
    import os
    import shutil

    def entries(root: Path) -> dict[str, str]:
        out = {}
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                rel = p.relative_to(root).as_posix()
                out[rel] = "link" if p.is_symlink() else "dir" if p.is_dir() else "file"
            dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
        return out

    have, want = entries(dst), entries(src)
    for rel in sorted((r for r in have if r not in want or have[r] != want[r]), key=len, reverse=True):
        p = dst / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif p.exists() or p.is_symlink():
            p.unlink()
    for rel in sorted(want, key=len):
        a, b = src / rel, dst / rel
        if want[rel] == "dir":
            b.mkdir(exist_ok=True)
        elif want[rel] == "link":
            if not (b.is_symlink() and os.readlink(b) == os.readlink(a)):
                if b.is_symlink() or b.exists():
                    b.unlink()
                os.symlink(os.readlink(a), b)
        elif not b.exists() or not filecmp.cmp(a, b, shallow=False):
            shutil.copy2(a, b)


def _validate(timeout: float, memory_mb: int) -> None:
    if timeout <= 0:
        raise EtudeError(f"--timeout must be positive, got {timeout}")
    if memory_mb < 0:
        raise EtudeError(f"--memory-mb must be >= 0, got {memory_mb}")


def _ensure_workspace(workspace: Path) -> None:
    """mkdir -p semantics: a missing workspace is created; an existing file there is an error."""
    if workspace.exists() and not workspace.is_dir():
        raise EtudeError(f"sandbox: workspace is not a directory: {workspace}")
    try:
        workspace.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EtudeError(f"sandbox: cannot create workspace {workspace}: {e.strerror or e}") from None


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")


def main() -> None:
    """`python -m etude.sandbox.cli exec ...`: the same command without loading every component's
    CLI (the full `etude` app imports them all, which is slow on a busy machine)."""
    try:
        sandbox_app()
    except EtudeError as e:
        print(f"etude: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
