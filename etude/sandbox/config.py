"""`SandboxConfig`: every knob of one sandboxed command, documented where it is declared."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from etude.errors import EtudeError

Backend = Literal["bwrap", "unsandboxed"]


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and mounts for commands run by `etude.sandbox.run` / `make_sandbox`."""

    backend: Backend = "bwrap"
    """"bwrap" (isolated) or "unsandboxed" (runs on the host, NOT isolated; explicit and loud)."""
    timeout_s: float = 60.0
    """Wall-clock limit per command; on expiry the whole process tree is killed and the status is 124."""
    memory_mb: int | None = 2048
    """Memory cap: a memory cgroup (RSS + tmpfs) when writable, and RLIMIT_AS per process. None: no cap."""
    address_space_mb: int | None = None
    """RLIMIT_AS per process; None means `memory_mb`, 0 means no RLIMIT_AS (cgroup only)."""
    cpu_s: int | None = 600
    """RLIMIT_CPU per process (seconds of CPU time). None: no cap."""
    file_size_mb: int | None = 512
    """RLIMIT_FSIZE: largest file a process may write."""
    open_files: int | None = 1024
    """RLIMIT_NOFILE per process."""
    max_procs: int | None = 256
    """Processes/threads alive at once: pids cgroup when writable, else RLIMIT_NPROC (non-root launcher)."""
    tmp_mb: int | None = 512
    """Size of the private tmpfs at /tmp (HOME); its pages also count against the memory cgroup."""
    workspace_disk_mb: int | None = 1024
    """Disk cap of the episode's workspace: its writable layer is an ext4 filesystem of this many
    MiB in a sparse image file on the workspace root's disk (loop-mounted; writes past it get
    ENOSPC; the host's disk loses at most this much; no tmpfs memory). What to pass as
    `Workspace.create(template, disk_mb=...)`, whose default is the same 1 GiB. Fails closed:
    where the cap cannot be set up (not root, no loop device, no mkfs.ext4) creating the
    workspace is an error. None: run uncapped, explicitly (no attempt, no warning); the
    process-wide alternative is ETUDE_ALLOW_UNCAPPED_DISK=1 (cap where possible, else uncapped
    with a warning). See etude/sandbox/workspace.py."""
    max_output_bytes: int = 1_000_000
    """Per stream (stdout, stderr): capture keeps the head and the tail, drops the middle."""
    ro_binds: tuple[str, ...] = ()
    """Host paths bound read-only at the same path inside (e.g. a virtual environment)."""
    path_prepend: tuple[str, ...] = ()
    """Directories put in front of PATH inside (e.g. the venv's bin)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables inside (the rest of the environment is cleared)."""
    bind_interpreter: bool = True
    """Bind the host interpreter prefix (sys.base_prefix) read-only and put its bin on PATH."""
    session: bool = False
    """`make_sandbox` only: one long-lived bwrap for all commands (fast start-up; /tmp persists,
    commands run one at a time). `run` always starts a fresh sandbox. See etude/sandbox/session.py."""
    uid: int = 1000
    """User id inside the sandbox (mapped to the launcher's uid on the host)."""
    gid: int = 1000
    """Group id inside the sandbox."""

    def with_venv(self, venv: str | Path) -> SandboxConfig:
        """This config with a virtual environment bound read-only and its bin first on PATH, so
        `python -m pytest` inside runs that environment's pytest (a task's test venv, or ours)."""
        venv = Path(venv)
        return replace(self, ro_binds=(*self.ro_binds, str(venv)), path_prepend=(str(venv / "bin"), *self.path_prepend))

    def for_tools(self) -> SandboxConfig:
        """This config as a session sandbox where one is possible (bwrap with the interpreter
        bound): what an agent's terminal uses within one episode. Graders keep `run`."""
        return replace(self, session=self.backend == "bwrap" and self.bind_interpreter)


def validate(cfg: SandboxConfig) -> None:
    """Refuse a config bwrap or the kernel would reject with an obscure message."""
    for name in ("memory_mb", "address_space_mb", "cpu_s", "file_size_mb", "open_files", "max_procs", "tmp_mb"):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise EtudeError(f"sandbox: {name} must be a non-negative integer or None, got {value!r}")
    if cfg.max_output_bytes <= 0:
        raise EtudeError(f"sandbox: max_output_bytes must be positive, got {cfg.max_output_bytes}")
    for key, val in cfg.env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(val):
            raise EtudeError(f"sandbox: invalid environment variable {key!r}")
