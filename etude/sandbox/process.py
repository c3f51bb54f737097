"""Start one command, feed stdin, capture bounded output, enforce the wall clock, kill the tree.

Safe to call from many threads at once: every call has its own pipes, selector and cgroup, and
`subprocess.Popen` forks in C with `close_fds=True` (no preexec_fn, which is unsafe with threads).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from etude.protocols import ExecResult
from etude.sandbox.capture import BoundedBuffer
from etude.sandbox.limits import Cgroup

TIMEOUT_STATUS = 124
_DRAIN_AFTER_KILL_S = 2.0
_CHUNK = 65536


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
    """Run `argv` (already wrapped in sh/prlimit/bwrap) and return what it did."""
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
    out, err = BoundedBuffer(max_output_bytes), BoundedBuffer(max_output_bytes)
    try:
        timed_out = _pump(proc, stdin, out, err, start + timeout_s)
        if timed_out:
            kill_tree(proc, cgroup)
            _pump(proc, None, out, err, time.monotonic() + _DRAIN_AFTER_KILL_S)
        code = _reap(proc, cgroup)
    finally:
        _close(proc)
        if proc.poll() is None:
            kill_tree(proc, cgroup)
            proc.wait()
    return ExecResult(
        returncode=TIMEOUT_STATUS if timed_out else code,
        stdout=out.text(),
        stderr=err.text(),
        timed_out=timed_out,
        wall_s=time.monotonic() - start,
        truncated=out.truncated or err.truncated,
    )


def _pump(proc: subprocess.Popen, stdin: str | None, out: BoundedBuffer, err: BoundedBuffer, deadline: float) -> bool:
    """Move bytes until both output pipes close. True when the deadline passed first."""
    sel = selectors.DefaultSelector()
    try:
        for f, buf in ((proc.stdout, out), (proc.stderr, err)):
            if f is not None and not f.closed:
                sel.register(f, selectors.EVENT_READ, buf)
        pending = memoryview(stdin.encode()) if stdin is not None and proc.stdin else None
        if proc.stdin is not None and not proc.stdin.closed:
            if pending:
                os.set_blocking(proc.stdin.fileno(), False)
                sel.register(proc.stdin, selectors.EVENT_WRITE, None)
            else:
                _safe_close(proc.stdin)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(timeout=left):
                if key.data is None:
                    pending = _write_some(proc, sel, pending)
                    continue
                chunk = os.read(key.fd, _CHUNK)
                if chunk:
                    key.data.feed(chunk)
                else:
                    sel.unregister(key.fileobj)
        return False
    finally:
        sel.close()


def _write_some(proc: subprocess.Popen, sel: selectors.BaseSelector, pending: memoryview | None) -> memoryview | None:
    assert proc.stdin is not None
    try:
        n = os.write(proc.stdin.fileno(), pending[:_CHUNK]) if pending else 0
        pending = pending[n:] if pending else None
    except (BrokenPipeError, BlockingIOError) as e:
        if isinstance(e, BlockingIOError):
            return pending
        pending = None
    if not pending:
        sel.unregister(proc.stdin)
        _safe_close(proc.stdin)
    return pending


def _reap(proc: subprocess.Popen, cgroup: Cgroup) -> int:
    """Wait for the launcher; sweep the cgroup so nothing outlives the command."""
    code = proc.wait()
    cgroup.kill_all()
    # A command killed by a signal reads like a shell would report it (bwrap already does this
    # for the sandboxed command; this covers the launcher itself being killed).
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
