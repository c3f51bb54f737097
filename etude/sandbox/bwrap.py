"""The bubblewrap command line (the hardened line from NOTES.md plus our binds).

Inside: a fresh root with read-only /usr (and /lib, /bin, ... as symlinks into it), a private /proc,
a minimal /dev, an empty size-capped tmpfs /tmp, a synthetic /etc (passwd, group, hosts) and a few
harmless host files, the host interpreter prefix and `ro_binds` read-only, the workspace read-write
at /workspace; the root itself is remounted read-only.
Every namespace is unshared (user, pid, net, ipc, uts, cgroup, mount): no network but a private
loopback; uid/gid 1000; no capabilities; a new session (no TIOCSTI into the caller's terminal);
bwrap dies with its parent. Nothing of the host outside these binds is visible.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

from etude.errors import EtudeError
from etude.sandbox.config import SandboxConfig

# Host files that hold no secrets and that common tools want (dynamic loader cache, Debian
# alternatives symlinks such as /usr/bin/awk -> /etc/alternatives/awk, time zone).
_ETC_PASSTHROUGH = ("/etc/ld.so.cache", "/etc/alternatives", "/etc/localtime", "/etc/mime.types")


@functools.cache
def bwrap_exe() -> str:
    exe = shutil.which("bwrap")
    if exe is None:
        raise EtudeError(
            "bubblewrap (bwrap) not found: install it (apt install bubblewrap) or pass "
            "backend='unsandboxed' / --unsandboxed explicitly (NOT isolated)"
        )
    return exe


@functools.cache
def _synthetic_etc(uid: int, gid: int) -> Path:
    """A private /etc: passwd/group/hosts naming only the sandbox user, and empty mount points
    for the harmless host files bound over them (one directory bind instead of one per file)."""
    d = Path(tempfile.mkdtemp(prefix=f"etude-etc-{os.getpid()}-"))
    atexit.register(shutil.rmtree, d, True)
    (d / "passwd").write_text(f"root:x:0:0:root:/root:/bin/sh\nagent:x:{uid}:{gid}:agent:/tmp:/bin/sh\n")
    (d / "group").write_text(f"root:x:0:\nagent:x:{gid}:\n")
    (d / "hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
    (d / "nsswitch.conf").write_text("passwd: files\ngroup: files\nhosts: files\n")
    for f in d.iterdir():
        f.chmod(0o444)
    for host in _present_etc_files():
        name = host.removeprefix("/etc/")
        (d / name).mkdir() if os.path.isdir(host) else (d / name).touch(0o444)
    return d


@functools.cache
def _present_etc_files() -> tuple[str, ...]:
    return tuple(p for p in _ETC_PASSTHROUGH if os.path.exists(p))


def interpreter_prefix() -> str:
    """Where the host Python lives (a venv made from it works once this is bound)."""
    return os.path.realpath(sys.base_prefix)


def inside_path(cfg: SandboxConfig) -> str:
    parts = list(cfg.path_prepend)
    if cfg.bind_interpreter:
        parts.append(os.path.join(interpreter_prefix(), "bin"))
    parts += ["/usr/local/bin", "/usr/bin", "/bin"]
    return ":".join(parts)


def ro_bind_paths(cfg: SandboxConfig) -> list[str]:
    paths = [interpreter_prefix()] if cfg.bind_interpreter else []
    for p in cfg.ro_binds:
        if not os.path.exists(p):
            raise EtudeError(f"sandbox ro_bind path does not exist: {p}")
        paths.append(os.path.abspath(p))
    return paths


def _fs_args(cfg: SandboxConfig) -> list[str]:
    a = ["--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "lib32", "libx32", "bin", "sbin"):
        if os.path.exists(f"/usr/{name}"):
            a += ["--symlink", f"usr/{name}", f"/{name}"]
    a += ["--proc", "/proc", "--dev", "/dev"]
    if cfg.tmp_mb:
        a += ["--size", str(cfg.tmp_mb * 1024 * 1024)]
    a += ["--tmpfs", "/tmp"]
    a += ["--ro-bind", str(_synthetic_etc(cfg.uid, cfg.gid)), "/etc"]
    for p in _present_etc_files():
        a += ["--ro-bind-try", p, p]
    for p in ro_bind_paths(cfg):
        a += ["--ro-bind", p, p]
    return a


def _env_args(cfg: SandboxConfig) -> list[str]:
    env = {"PATH": inside_path(cfg), "HOME": "/tmp", "LANG": "C.UTF-8", "TMPDIR": "/tmp", "USER": "agent"}
    env.update(cfg.env)
    a = ["--clearenv"]
    for k, v in env.items():
        a += ["--setenv", k, v]
    return a


def bwrap_argv(argv: list[str], workspace: Path, cfg: SandboxConfig) -> list[str]:
    """The full bwrap invocation running `argv` with `workspace` at /workspace."""
    head = [bwrap_exe(), "--unshare-all", "--unshare-user", "--uid", str(cfg.uid), "--gid", str(cfg.gid)]
    head += ["--cap-drop", "ALL", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    # NOTE: --remount-ro / comes after every mount point exists: the sandbox root (a tmpfs bwrap
    # made) becomes read-only, so only /workspace and /tmp are writable inside.
    tail = ["--bind", str(workspace), "/workspace", "--remount-ro", "/", "--chdir", "/workspace"]
    return head + _fs_args(cfg) + tail + _env_args(cfg) + ["--", *argv]
