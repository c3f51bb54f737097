"""Start one command, feed stdin, capture bounded output, enforce the wall clock, kill the tree.

The command is over when its launcher exits (under bwrap that is after the PID namespace, and so
every process in it, is gone). Whatever is still alive then (possible only for the unsandboxed
backend) is killed: nothing a command starts outlives it. On timeout the whole tree is killed and
the status is 124.

Safe to call from many threads at once: every call has its own pipes, selector, pidfd and
cgroup, and `subprocess.Popen` forks in C with `close_fds=True` (no preexec_fn, which is unsafe
with threads).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from etude.protocols import ExecResult
from etude.sandbox.capture import BoundedBuffer
from etude.sandbox.limits import Cgroup

TIMEOUT_STATUS = 124
_DRAIN_S = 2.0  # how long to collect output still in the pipes once the command is over
_CHUNK = 65536
_EXIT = object()  # selector tag of the pidfd
_STDIN = object()


@dataclass
class _Io:
    proc: subprocess.Popen
    out: BoundedBuffer
    err: BoundedBuffer
    pending: memoryview | None  # stdin bytes not yet written


def spawn_and_wait(
    argv: Sequence[str],
    *,
    timeout_s: float,
    stdin: str | None,
    max_output_bytes: int,
    cgroup: Cgroup,
    env: dict[str, str],
    cwd: Path | None = None,
) -> ExecResult:
    """Run `argv` (already wrapped: sh with cgroups + ulimits, then bwrap) and return what it did."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        close_fds=True,
        start_new_session=True,
    )
    io = _Io(proc, BoundedBuffer(max_output_bytes), BoundedBuffer(max_output_bytes), None)
    if stdin is not None:
        io.pending = memoryview(stdin.encode())
    try:
        timed_out = _pump(io, start + timeout_s, watch_exit=True) == "deadline"
        kill_tree(proc, cgroup)  # a timeout, or leftovers of an unsandboxed command
        _pump(io, time.monotonic() + _DRAIN_S, watch_exit=False)
        code = _status(proc.wait())
    finally:
        _close(proc)
        if proc.poll() is None:
            kill_tree(proc, cgroup)
            proc.wait()
    return _result(io, code, timed_out, timeout_s, cgroup, time.monotonic() - start)


def _result(io: _Io, code: int, timed_out: bool, timeout_s: float, cg: Cgroup, wall: float) -> ExecResult:
    stderr = io.err.text()
    # The model must learn why its command died: say it in the output it sees.
    if timed_out:
        stderr += f"\n[sandbox: timed out after {timeout_s:g} s; every process was killed]\n"
    elif cg.memory_oom_killed():
        stderr += "\n[sandbox: memory limit exceeded; a process was killed]\n"
    return ExecResult(
        returncode=TIMEOUT_STATUS if timed_out else code,
        stdout=io.out.text(),
        stderr=stderr,
        timed_out=timed_out,
        wall_s=wall,
        truncated=io.out.truncated or io.err.truncated,
    )


def _pump(io: _Io, deadline: float, *, watch_exit: bool) -> str:
    """Move bytes until both pipes close ("eof"), the launcher exits ("exit") or the deadline."""
    sel = selectors.DefaultSelector()
    pidfd = _pidfd(io.proc.pid) if watch_exit else None
    try:
        _register(sel, io, pidfd)
        # NOTE: with a pidfd we wait for the exit even after EOF: a command may close its
        # stdout/stderr and keep running, and must not be killed for that.
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return "deadline"
            for key, _ in sel.select(timeout=left):
                if key.data is _EXIT:
                    return "exit"
                if key.data is _STDIN:
                    _write_some(io, sel)
                elif chunk := os.read(key.fd, _CHUNK):
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
        if watch_exit:  # no pidfd (not Linux): wait for the launcher itself
            try:
                io.proc.wait(timeout=max(deadline - time.monotonic(), 0.001))
            except subprocess.TimeoutExpired:
                return "deadline"
        return "eof"
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)


def _register(sel: selectors.BaseSelector, io: _Io, pidfd: int | None) -> None:
    p = io.proc
    for f, buf in ((p.stdout, io.out), (p.stderr, io.err)):
        if f is not None and not f.closed:
            sel.register(f, selectors.EVENT_READ, buf)
    if p.stdin is not None and not p.stdin.closed:
        if io.pending:
            os.set_blocking(p.stdin.fileno(), False)
            sel.register(p.stdin, selectors.EVENT_WRITE, _STDIN)
        else:
            _safe_close(p.stdin)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, _EXIT)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when `pid` exits (Linux >= 5.3); None elsewhere."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _write_some(io: _Io, sel: selectors.BaseSelector) -> None:
    stdin = io.proc.stdin
    assert stdin is not None and io.pending is not None
    try:
        n = os.write(stdin.fileno(), io.pending[:_CHUNK])
        io.pending = io.pending[n:]
    except BlockingIOError:
        return
    except OSError:  # the command closed its stdin (EPIPE): the rest is dropped
        io.pending = None
    if not io.pending:
        sel.unregister(stdin)
        _safe_close(stdin)


def _status(code: int) -> int:
    # A launcher killed by a signal reads like a shell would report it (bwrap already does this
    # for the sandboxed command itself).
    return 128 - code if code < 0 else code


def kill_tree(proc: subprocess.Popen, cgroup: Cgroup) -> None:
    """SIGKILL the launcher's process group, then every member of the command's cgroup.

    Under bwrap the PID namespace alone is enough (its init dies -> the kernel kills every process
    in it, setsid ones too); the cgroup sweep also covers the unsandboxed backend."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    cgroup.kill_all()


def _safe_close(f) -> None:  # noqa: ANN001
    try:
        f.close()
    except OSError:
        pass


def _close(proc: subprocess.Popen) -> None:
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            _safe_close(f)
