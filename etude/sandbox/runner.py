"""`run`, `make_sandbox` and the two backends (bwrap; explicit, loud "unsandboxed")."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from etude.errors import EtudeError
from etude.protocols import ExecResult
from etude.sandbox.bwrap import bwrap_argv, bwrap_exe, inside_path, ro_bind_paths
from etude.sandbox.config import SandboxConfig, validate
from etude.sandbox.limits import Cgroup, launcher_prefix
from etude.sandbox.process import TIMEOUT_STATUS, kill_tree, spawn_and_wait
from etude.sandbox.session import SessionSandbox

_LAUNCHER_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_warned = threading.Event()


def _check(argv: Sequence[str], workspace: Path, cfg: SandboxConfig) -> Path:
    if not argv:
        raise EtudeError("sandbox: empty command")
    if cfg.backend not in ("bwrap", "unsandboxed"):
        raise EtudeError(f"sandbox: unknown backend {cfg.backend!r} (use 'bwrap' or 'unsandboxed')")
    ws = Path(workspace)
    if not ws.is_dir():
        raise EtudeError(f"sandbox: workspace is not a directory: {ws}")
    validate(cfg)
    return ws.resolve()


def _warn_unsandboxed() -> None:
    if not _warned.is_set():
        _warned.set()
        print(
            "etude: WARNING: sandbox backend 'unsandboxed': commands run on the host with your "
            "privileges, NO isolation (no filesystem, network or process separation)",
            file=sys.stderr,
        )


def _command(
    argv: Sequence[str], ws: Path, cfg: SandboxConfig, cg: Cgroup
) -> tuple[list[str], dict[str, str], Path | None]:
    """The launcher argv (sh: cgroups + ulimits -> bwrap -> CMD), its environment and cwd."""
    if cfg.backend == "bwrap":
        inner, env, cwd = bwrap_argv(list(argv), ws, cfg), dict(_LAUNCHER_ENV), None
    else:
        _warn_unsandboxed()
        # HOME outside the workspace, so caches a tool writes there do not show up in diff().
        home = tempfile.gettempdir()
        env = {"PATH": inside_path(cfg), "HOME": home, "LANG": "C.UTF-8", "ETUDE_UNSANDBOXED": "1", **cfg.env}
        inner, cwd = list(argv), ws
    return launcher_prefix(cfg, cg) + inner, env, cwd


def run(
    argv: Sequence[str],
    *,
    workspace: Path,
    config: SandboxConfig | None = None,
    timeout_s: float | None = None,
    stdin: str | None = None,
) -> ExecResult:
    """Run `argv` isolated with `workspace` at /workspace; returns status (124 on timeout) and output."""
    cfg = config or SandboxConfig()
    ws = _check(argv, workspace, cfg)
    limit = cfg.timeout_s if timeout_s is None else timeout_s
    if limit <= 0:
        raise EtudeError(f"sandbox: timeout must be positive, got {limit}")
    cg = Cgroup.create(cfg)
    try:
        full, env, cwd = _command(argv, ws, cfg, cg)
        return spawn_and_wait(
            full, timeout_s=limit, stdin=stdin, max_output_bytes=cfg.max_output_bytes, cgroup=cg, env=env, cwd=cwd
        )
    finally:
        cg.destroy()


def run_passthrough(argv: Sequence[str], *, workspace: Path, config: SandboxConfig | None = None) -> int:
    """Like `run`, but CMD's stdin/stdout/stderr are ours (for `etude sandbox exec`). Returns the status."""
    cfg = config or SandboxConfig()
    ws = _check(argv, workspace, cfg)
    cg = Cgroup.create(cfg)
    try:
        full, env, cwd = _command(argv, ws, cfg, cg)
        proc = subprocess.Popen(full, env=env, cwd=cwd, close_fds=True, start_new_session=True)
        try:
            code = proc.wait(timeout=cfg.timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc, cg)
            proc.wait()
            print(f"etude: sandbox: timed out after {cfg.timeout_s:g} s; every process was killed", file=sys.stderr)
            return TIMEOUT_STATUS
        except KeyboardInterrupt:
            kill_tree(proc, cg)
            proc.wait()
            raise
        cg.kill_all()
        return 128 - code if code < 0 else code
    finally:
        cg.destroy()


@dataclass
class BwrapSandbox:
    """`protocols.Sandbox` over `run`: one workspace, one config, many commands (thread-safe)."""

    workspace: Path
    config: SandboxConfig = field(default_factory=SandboxConfig)

    def exec(self, argv: Sequence[str], *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        return run(argv, workspace=self.workspace, config=self.config, timeout_s=timeout_s, stdin=stdin)

    def close(self) -> None:
        """Nothing to release (each command had its own sandbox); here so callers can treat both
        kinds alike."""

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_sandbox(workspace: Path, config: SandboxConfig | None = None) -> BwrapSandbox | SessionSandbox:
    """A `protocols.Sandbox` for `workspace`. Fails now (clear error) if the backend is unusable."""
    cfg = config or SandboxConfig()
    ws = Path(workspace)
    if not ws.is_dir():
        raise EtudeError(f"sandbox: workspace is not a directory: {ws}")
    validate(cfg)
    if cfg.backend == "bwrap":
        bwrap_exe()
        ro_bind_paths(cfg)
    elif cfg.backend == "unsandboxed":
        _warn_unsandboxed()
    else:
        raise EtudeError(f"sandbox: unknown backend {cfg.backend!r} (use 'bwrap' or 'unsandboxed')")
    if cfg.session:
        return SessionSandbox(ws.resolve(), cfg)
    return BwrapSandbox(workspace=ws.resolve(), config=cfg)


__all__ = ["run", "run_passthrough", "make_sandbox", "BwrapSandbox"]
