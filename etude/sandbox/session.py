"""Session sandboxes: one long-lived bwrap per workspace, commands run inside it one at a time.

`run` pays for fresh namespaces on every command (tens of ms on a loaded machine); a session
pays once, then each command costs about a fork and an exec inside (`SandboxConfig(session=True)`
in `make_sandbox`). Same isolation as `run` (the same bwrap line), the same per-command
rlimits, wall-clock timeout (124) and "nothing outlives a command" rule, enforced by the
in-sandbox supervisor (`_supervisor.py`) with `kill(-1, SIGKILL)`.

Differs from `run`, and does not guarantee:
- `/tmp` (and HOME) persist across the commands of one session; the pids and memory cgroups
  cap the whole session, not each command; RLIMIT_CPU also counts the supervisor's own CPU
  seconds (a few ms per command), so a session lives for at most `cpu_s` of supervisor time.
- Commands of one session run one at a time (a lock), never in parallel.
- A command shares the sandbox (and uid) with its supervisor. The supervisor makes itself
  non-dumpable, so a command cannot ptrace it, read its memory or open its pipes via /proc; it
  can still signal it (kill, stop), which tears the session down. Replies are checked anyway
  (size cap, shape, a random per-request id). Still, the tool-facing session is not where
  grading happens: graders use `run`, a fresh sandbox per command.
- bwrap's `--die-with-parent` is tied to the *thread* that forked it, so sessions are forked by
  one long-lived spawner thread: a session outlives the thread that asked for it, and ends
  with the process.
- If the supervisor dies or stops answering (OOM-killed, killed or stopped by a command; no
  answer within timeout + 3 s), the session is torn down (every process killed), that command gets status 124/137 with a note, and
  the next command starts a fresh session (a clean /tmp).
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import selectors
import struct
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.protocols import ExecResult
from etude.sandbox.bwrap import bwrap_argv, interpreter_prefix
from etude.sandbox.config import SandboxConfig, validate
from etude.sandbox.limits import Cgroup, launcher_prefix
from etude.sandbox.process import TIMEOUT_STATUS, kill_tree

_SUPERVISOR = (Path(__file__).parent / "_supervisor.py").read_text()
_GRACE_S = 3.0  # the supervisor enforces the timeout; we only step in if it does not answer
_START_S = 30.0


_LATE = "no answer in time"


class _Dead(Exception):
    """The supervisor stopped answering."""


class _Spawner:
    """Forks session launchers from one daemon thread that lives as long as the process.

    NOTE: PR_SET_PDEATHSIG (bwrap --die-with-parent) fires when the forking *thread* exits; a
    session started from a short-lived worker thread would otherwise die with that thread."""

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="etude-sandbox-spawner", daemon=True)
                self._thread.start()
        fut: Future[subprocess.Popen] = Future()
        self._jobs.put((fut, argv, kw))
        return fut.result()

    def _loop(self) -> None:
        while True:
            fut, argv, kw = self._jobs.get()
            try:
                fut.set_result(subprocess.Popen(argv, **kw))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)


_SPAWNER = _Spawner()


class _Session:
    """One bwrap + supervisor; owns its process, pipes and cgroup."""

    def __init__(self, workspace: Path, cfg: SandboxConfig) -> None:
        self.cg = Cgroup.create(cfg)
        # NOTE: the rlimits are set once on the launcher, as for `run`, and every command inherits
        # them (soft = hard, so none can raise them). Setting them per command would need a
        # preexec_fn, i.e. a full fork of the supervisor instead of a vfork: slower.
        py = os.path.join(interpreter_prefix(), "bin", "python3")
        argv = launcher_prefix(cfg, self.cg) + bwrap_argv([py, "-I", "-S", "-c", _SUPERVISOR], workspace, cfg)
        self.log = tempfile.TemporaryFile()
        self.proc = _SPAWNER.popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            close_fds=True,
            start_new_session=True,
        )
        try:
            self.recv(time.monotonic() + _START_S)
        except _Dead:
            detail = self.log_tail()
            self.close()
            raise EtudeError(f"session sandbox did not start: {detail or 'no output'}") from None

    def send(self, obj: dict, deadline: float) -> None:
        """One request, written without ever blocking past `deadline` (a command can SIGSTOP
        its supervisor, which then stops reading)."""
        body = json.dumps(obj).encode()
        data = memoryview(struct.pack(">I", len(body)) + body)
        assert self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        os.set_blocking(fd, False)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while data:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise _Dead(_LATE)
                try:
                    data = data[os.write(fd, data[:65536]) :]
                except BlockingIOError:
                    continue
                except OSError as e:
                    raise _Dead("supervisor exited") from e

    def recv(self, deadline: float, max_bytes: int = 1 << 20) -> dict:
        """One reply. NOTE: the supervisor shares the sandbox with the command, which can take it
        over: its replies are untrusted input, so size and shape are checked."""
        n = struct.unpack(">I", self._read(4, deadline))[0]
        if n > max_bytes:
            raise _Dead(f"reply of {n} bytes exceeds {max_bytes}")
        try:
            reply = json.loads(self._read(n, deadline))
        except ValueError as e:
            raise _Dead("malformed reply") from e
        if not isinstance(reply, dict):
            raise _Dead("malformed reply")
        return reply

    def _read(self, n: int, deadline: float) -> bytes:
        assert self.proc.stdout is not None
        fd, data = self.proc.stdout.fileno(), bytearray()
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while len(data) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(timeout=left):
                    raise _Dead(_LATE)
                chunk = os.read(fd, n - len(data))
                if not chunk:
                    raise _Dead("supervisor exited")
                data += chunk
        return bytes(data)

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-500:].decode("utf-8", "replace").strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            kill_tree(self.proc, self.cg)
            self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.log.close()
        self.cg.destroy()


class SessionSandbox:
    """`protocols.Sandbox` backed by one long-lived bwrap (see the module docstring)."""

    def __init__(self, workspace: Path, config: SandboxConfig) -> None:
        if config.backend != "bwrap" or not config.bind_interpreter:
            raise EtudeError("session sandboxes need backend='bwrap' and bind_interpreter=True")
        validate(config)
        if not Path(workspace).is_dir():
            raise EtudeError(f"sandbox: workspace is not a directory: {workspace}")
        self.workspace, self.config = Path(workspace).resolve(), config
        self._lock = threading.Lock()
        self._session: _Session | None = _Session(self.workspace, config)
        self._finalizer = weakref.finalize(self, _close_quietly, self._session)

    def exec(self, argv: Sequence[str], *, timeout_s: float | None = None, stdin: str | None = None) -> ExecResult:
        if not argv:
            raise EtudeError("sandbox: empty command")
        limit = self.config.timeout_s if timeout_s is None else timeout_s
        if limit <= 0:
            raise EtudeError(f"sandbox: timeout must be positive, got {limit}")
        with self._lock:
            return self._exec_locked([str(a) for a in argv], limit, stdin)

    def _exec_locked(self, argv: list[str], limit: float, stdin: str | None) -> ExecResult:
        if self._session is None or self._session.proc.poll() is not None:
            self._restart()
        s = self._session
        assert s is not None
        cfg = self.config
        rid = secrets.token_hex(8)
        req = {"id": rid, "argv": argv, "stdin": stdin, "timeout": limit, "max_output": cfg.max_output_bytes}
        oom_before, t0 = s.cg.oom_kills(), time.monotonic()
        cap = 4 * cfg.max_output_bytes + 65536  # two streams, JSON escaping, the marker lines
        try:
            s.send(req, t0 + limit + _GRACE_S)
            r = s.recv(t0 + limit + _GRACE_S, max_bytes=cap)
            if r.get("id") != rid:
                raise _Dead("reply for another request")  # forged, or the stream lost its framing
            return _result(r, limit, s.cg.oom_kills() > oom_before, time.monotonic() - t0)
        except _Dead as e:
            return self._died(s, limit, t0, oom_before, str(e))

    def _died(self, s: _Session, limit: float, t0: float, oom_before: int, why: str) -> ExecResult:
        """The supervisor is gone or lying: tear the session down; the next command gets a new one."""
        oom = s.cg.oom_kills() > oom_before
        s.close()
        self._session = None
        timed_out = why == _LATE
        if oom:
            note = "memory limit exceeded"
        elif timed_out:
            note = f"timed out after {limit:g} s"
        else:
            note = f"the session's supervisor failed ({why})"
        note = f"[sandbox: {note}; every process was killed and the session restarted]\n"
        code = TIMEOUT_STATUS if timed_out else 137
        return ExecResult(code, "", note, timed_out, time.monotonic() - t0)

    def _restart(self) -> None:
        if self._session is not None:
            self._session.close()
        self._session = _Session(self.workspace, self.config)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_quietly, self._session)

    def close(self) -> None:
        """Stop the session: every process in it is killed, its cgroups removed (idempotent)."""
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None
            self._finalizer.detach()

    def __enter__(self) -> SessionSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _result(r: dict, limit: float, oom: bool, wall: float) -> ExecResult:
    try:
        timed_out, code = bool(r["timed_out"]), int(r["rc"])
        stdout, stderr, truncated = str(r["stdout"]), str(r["stderr"]), bool(r["truncated"])
    except (KeyError, TypeError, ValueError) as e:
        raise _Dead("malformed reply") from e
    if timed_out:
        stderr += f"\n[sandbox: timed out after {limit:g} s; every process was killed]\n"
    elif oom:
        stderr += "\n[sandbox: memory limit exceeded; a process was killed]\n"
    return ExecResult(TIMEOUT_STATUS if timed_out else code, stdout, stderr, timed_out, wall, truncated)


def _close_quietly(session: _Session) -> None:
    try:
        session.close()
    except Exception:  # noqa: BLE001 - interpreter shutdown: best effort, bwrap dies with us anyway
        pass
