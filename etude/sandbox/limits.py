"""Resource limits for one command: cgroup v1 (pids, memory) when writable, and rlimits.

What this guarantees: when the pids/memory cgroup hierarchies are writable (root launcher, cgroup v1
mounted, as on this host), every process the command starts is in a fresh cgroup that caps the number
of live processes and the memory, and `Cgroup.kill_all()` finds and kills every one of them, `setsid`
or not. Rlimits (address space, CPU seconds, file size, open files, no core files) are per process,
soft = hard, set by the launcher shell's `ulimit` builtins (prlimit(1) where the shell differs), and
apply to the launcher chain too (sh -> bwrap), which stays far below them.

What it does not: with no writable cgroup and a root launcher there is no process cap (RLIMIT_NPROC
does not bind uid 0); the memory cap is then RLIMIT_AS only, per process. cgroup v2 is not used (this
host's v2 hierarchy has no memory/pids controllers); see docs/sandbox.md.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from etude.sandbox.config import SandboxConfig

_MB = 1024 * 1024


@functools.cache
def _v1_mounts() -> dict[str, Path]:
    """controller -> mount point of each cgroup v1 hierarchy (from /proc/self/mountinfo)."""
    mounts: dict[str, Path] = {}
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return mounts
    for line in lines:
        left, _, right = line.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(rparts) < 3 or rparts[0] != "cgroup":
            continue
        for opt in rparts[2].split(","):
            if opt in ("pids", "memory"):
                mounts[opt] = Path(parts[4])
    return mounts


@functools.cache
def _own_cgroup(controller: str) -> str:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            if controller in ctrls.split(","):
                return path
    except OSError:
        pass
    return "/"


_probe_lock = threading.Lock()
_usable: dict[str, Path | None] = {}


def controller_base(controller: str) -> Path | None:
    """The directory under which we may create child cgroups for `controller`, or None."""
    with _probe_lock:
        if controller not in _usable:
            _usable[controller] = _probe(controller)
        return _usable[controller]


def _probe(controller: str) -> Path | None:
    mount = _v1_mounts().get(controller)
    if mount is None or os.environ.get("ETUDE_SANDBOX_NO_CGROUP"):
        return None
    base = mount / _own_cgroup(controller).lstrip("/")
    probe = base / f"etude-probe-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError:
        return None
    _sweep_stale(base)
    return base


def _sweep_stale(base: Path) -> None:
    """Remove cgroups left by etude processes that died without cleaning up (SIGKILL, crash)."""
    for d in base.glob("etude-*-*"):
        try:
            owner = int(d.name.split("-")[1])
            os.kill(owner, 0)
            continue  # owner alive: not ours to touch
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue
        Cgroup(dirs=[d]).destroy()


@dataclass
class Cgroup:
    """A fresh cgroup per command, in every usable controller (pids, memory)."""

    dirs: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, cfg: SandboxConfig) -> Cgroup:
        cg = cls()
        name = f"etude-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        for ctrl, limits in (("pids", _pids_limits(cfg)), ("memory", _memory_limits(cfg))):
            base = controller_base(ctrl)
            if base is None or not limits:
                continue
            d = base / name
            try:
                d.mkdir()
                cg.dirs.append(d)
                for fname, value in limits:
                    (d / fname).write_text(value)
            except OSError:
                # NOTE: a controller that refuses a write (e.g. memsw absent) must not break the run.
                continue
        return cg

    @property
    def controllers(self) -> list[str]:
        return [_ctrl_of(d) for d in self.dirs]

    def enter_script(self) -> str:
        """Shell prefix that moves the shell (about to exec the command) into every cgroup."""
        return "".join(f"echo $$ > {shlex.quote(str(d / 'cgroup.procs'))} && " for d in self.dirs)

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in self.dirs:
            try:
                out.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return out

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every member until none is left (fork bombs respawn). True when empty."""
        end, pause = time.monotonic() + deadline_s, 0.0002
        while time.monotonic() < end:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            # NOTE: right after a normal exit one task is usually still leaving (about 1 ms);
            # a short, growing pause avoids charging every command a fixed sleep.
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        return not self.pids()

    def destroy(self) -> None:
        """Kill anything left and remove the cgroup directories."""
        if self.pids():
            self.kill_all()
        for d in self.dirs:
            pause = 0.0002
            for _ in range(100):  # a dying task still pins the cgroup for a moment
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(pause)
                    pause = min(pause * 2, 0.02)
        self.dirs.clear()

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in the memory cgroup so far."""
        for d in self.dirs:
            try:
                text = (d / "memory.oom_control").read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, val = line.partition(" ")
                if key == "oom_kill" and val.strip().isdigit():
                    return int(val)
        return 0

    def memory_oom_killed(self) -> bool:
        """True when the kernel OOM-killed something in the memory cgroup (limit hit)."""
        return self.oom_kills() > 0


def _ctrl_of(d: Path) -> str:
    return "memory" if (d / "memory.limit_in_bytes").exists() else "pids"


def _pids_limits(cfg: SandboxConfig) -> list[tuple[str, str]]:
    return [("pids.max", str(cfg.max_procs))] if cfg.max_procs else []


def _memory_limits(cfg: SandboxConfig) -> list[tuple[str, str]]:
    if not cfg.memory_mb:
        return []
    b = str(cfg.memory_mb * _MB)
    # memsw after limit_in_bytes: the kernel requires memsw >= mem at every step; no swap escape.
    return [("memory.limit_in_bytes", b), ("memory.memsw.limit_in_bytes", b)]


def rlimits(cfg: SandboxConfig, *, cgroup_has_pids: bool) -> dict[str, int]:
    """The rlimits to set, by prlimit(1) resource name, in bytes / seconds / counts."""
    lim = {"core": 0}
    as_mb = cfg.memory_mb if cfg.address_space_mb is None else cfg.address_space_mb
    if as_mb:
        lim["as"] = as_mb * _MB
    if cfg.cpu_s:
        lim["cpu"] = int(cfg.cpu_s)
    if cfg.file_size_mb:
        lim["fsize"] = cfg.file_size_mb * _MB
    if cfg.open_files:
        lim["nofile"] = cfg.open_files
    if cfg.max_procs and not cgroup_has_pids and os.geteuid() != 0:
        # NOTE: RLIMIT_NPROC counts every process of the launcher's uid, not just ours; only a
        # fallback. For uid 0 the kernel ignores it, so we do not pretend.
        lim["nproc"] = cfg.max_procs
    return lim


# dash/POSIX `ulimit` flags and units (fsize in 512-byte blocks, as in KiB), verified by _probe_ulimit.
_ULIMIT = {
    "core": ("-c", 512),
    "as": ("-v", 1024),
    "cpu": ("-t", 1),
    "fsize": ("-f", 512),
    "nofile": ("-n", 1),
    "nproc": ("-p", 1),
}


@functools.cache
def _ulimit_works() -> bool:
    """Does /bin/sh's `ulimit` set soft and hard limits in the units above? (dash, bash as sh)."""
    want = {"core": 0, "as": 4000 * _MB, "cpu": 100, "fsize": _MB, "nofile": 100}
    script = " && ".join(_ulimit_cmds(want)) + " && cat /proc/self/limits"
    try:
        out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    rows = {
        "core": "Max core file size",
        "as": "Max address space",
        "cpu": "Max cpu time",
        "fsize": "Max file size",
        "nofile": "Max open files",
    }
    for key, label in rows.items():
        line = next((ln for ln in out.splitlines() if ln.startswith(label)), "")
        if line[len(label) :].split()[:2] != [str(want[key])] * 2:
            return False
    return True


def _ulimit_cmds(lim: dict[str, int]) -> list[str]:
    return [f"ulimit {_ULIMIT[k][0]} {v // _ULIMIT[k][1]}" for k, v in lim.items()]


def launcher_prefix(cfg: SandboxConfig, cg: Cgroup) -> list[str]:
    """argv to put before the command (or bwrap): joins the cgroups, sets the rlimits, then execs.

    One /bin/sh does both with builtins (no extra exec); prlimit(1) is the fallback where the
    shell's `ulimit` differs. The shell execs, so the command keeps its pid and is counted in the
    cgroups from its first instruction: no window in which it could fork uncounted."""
    lim = rlimits(cfg, cgroup_has_pids="pids" in cg.controllers)
    prefix: list[str] = []
    steps = [cg.enter_script().removesuffix(" && ")] if cg.dirs else []
    if _ulimit_works():
        steps += _ulimit_cmds(lim)
    elif (exe := shutil.which("prlimit", path="/usr/bin:/bin")) is not None:
        prefix = [exe, *(f"--{k}={v}" for k, v in lim.items()), "--"]
    if not steps:
        return prefix
    return ["/bin/sh", "-c", " && ".join(steps) + ' && exec "$@"', "sh", *prefix]
