"""The sandbox: copy-on-write workspaces and isolated, limited command execution.

What it guarantees (backend "bwrap", bubblewrap 0.8, Linux; checked by tests/sandbox/):
- The command sees a fresh root: read-only /usr (+ /lib, /bin symlinks), the host interpreter
  prefix and `ro_binds` read-only, the workspace read-write at /workspace, an empty tmpfs /tmp, a
  synthetic /etc. Host /etc/shadow, /root, host /tmp, home directories are not visible.
- Nothing outside /workspace (and the private /tmp) is writable; all capabilities are dropped, so
  read-only mounts cannot be remounted.
- No network: a private network namespace with only its own loopback; the host's loopback
  listeners are unreachable. Separate PID, IPC, UTS, cgroup and user namespaces; uid/gid 1000.
- Wall-clock timeout per command: the whole tree is killed (setsid children and fork bombs too;
  the PID namespace dies with its init, and the command's cgroup is swept) and the status is 124.
- Limits: memory (memory cgroup when writable + RLIMIT_AS), live processes (pids cgroup when
  writable), CPU seconds, file size, open files (rlimits); output capture bounded per stream.
- `run` is safe to call from many threads at once.
- `make_sandbox(ws, SandboxConfig(session=True))`: one long-lived bwrap for many commands, the
  same isolation and per-command kill rule, a few ms per command; /tmp persists across its
  commands, which run one at a time; never used for grading (see session.py).

What it does not guarantee:
- It is not a VM: it shares the host kernel, so a kernel exploit escapes it.
- Without writable cgroups and with a root launcher there is no process cap and memory is capped
  per process only (RLIMIT_AS); see docs/sandbox.md.
- Disk: /tmp (tmp_mb, a tmpfs: memory) and each workspace's writable layer are size-capped:
  writes past the cap get ENOSPC. The workspace's layer is an ext4 filesystem of
  `Workspace.create(disk_mb=...)` MiB (default 1 GiB, `workspace_disk_mb`) in a sparse image
  file on the workspace root's disk, loop-mounted by the launcher: disk, not memory. That needs
  a root launcher on Linux with loop devices and mkfs.ext4; elsewhere `Workspace.create` fails
  closed (EtudeError saying why) unless running uncapped was asked for (`disk_mb=None`, or
  ETUDE_ALLOW_UNCAPPED_DISK=1 / `allow_uncapped=True`, which warn on stderr).
- The "unsandboxed" backend isolates nothing; it exists for machines without bwrap and is never
  chosen automatically.
"""

from etude.protocols import ExecResult
from etude.sandbox.config import SandboxConfig
from etude.sandbox.runner import BwrapSandbox, make_sandbox, run, run_passthrough
from etude.sandbox.session import SessionSandbox
from etude.sandbox.workspace import Workspace

__all__ = [
    "SandboxConfig",
    "run",
    "run_passthrough",
    "make_sandbox",
    "BwrapSandbox",
    "SessionSandbox",
    "Workspace",
    "ExecResult",
]
