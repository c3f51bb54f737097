"""Session sandboxes (`SandboxConfig(session=True)`): same isolation and limits as `run`, one bwrap."""

from __future__ import annotations

import os
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from etude.errors import EtudeError
from etude.protocols import Sandbox
from etude.sandbox import SandboxConfig, make_sandbox
from etude.sandbox.limits import controller_base
from etude.sandbox.session import SessionSandbox, _Dead, _Session


def alive(marker: str) -> bool:
    return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


@pytest.fixture
def sb(ws: Path, cfg: SandboxConfig) -> Iterator[SessionSandbox]:
    s = make_sandbox(
        ws, SandboxConfig(session=True, timeout_s=20, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    )
    assert isinstance(s, SessionSandbox) and isinstance(s, Sandbox)
    yield s
    s.close()


def test_commands_status_output_stdin_and_writes(sb: SessionSandbox, ws: Path) -> None:
    r = sb.exec(["sh", "-c", "echo out; echo err >&2; pwd > where; exit 4"])
    assert (r.returncode, r.stdout, r.stderr) == (4, "out\n", "err\n")
    assert (ws / "where").read_text() == "/workspace\n"
    assert sb.exec(["wc", "-c"], stdin="y" * 300_000).stdout.strip() == "300000"
    assert sb.exec(["no-such-command"]).returncode == 127


def test_same_isolation_as_run(sb: SessionSandbox, ws: Path) -> None:
    r = sb.exec(["sh", "-c", "id -u; cat /etc/shadow; touch /usr/x; touch /workspace/../y; cat /proc/net/dev"])
    assert r.stdout.startswith("1000\n")
    assert "No such file" in r.stderr and r.stderr.count("Read-only file system") == 2
    assert not (ws.parent / "y").exists()
    assert [ln.split(":")[0].strip() for ln in r.stdout.splitlines()[3:]] == ["lo"]


def test_nothing_outlives_a_command_and_timeout_is_124(sb: SessionSandbox) -> None:
    r = sb.exec(["sh", "-c", "setsid sleep 271.1 > /dev/null 2>&1 & echo bg"])
    assert (r.returncode, r.stdout) == (0, "bg\n") and not alive("271.1")
    r = sb.exec(["sh", "-c", "setsid sleep 271.2 & (sleep 271.2 &); sleep 271.2"], timeout_s=0.5)
    assert (r.returncode, r.timed_out) == (124, True) and "timed out after 0.5 s" in r.stderr
    assert not alive("271.2")
    assert sb.exec(["echo", "still here"]).stdout == "still here\n"  # the session survived


def test_tmp_persists_within_a_session_only(sb: SessionSandbox, ws: Path, cfg: SandboxConfig) -> None:
    sb.exec(["sh", "-c", "echo kept > /tmp/state"])
    assert sb.exec(["cat", "/tmp/state"]).stdout == "kept\n"
    with make_sandbox(ws, SandboxConfig(session=True)) as other:
        assert other.exec(["cat", "/tmp/state"]).returncode != 0


@pytest.mark.skipif(controller_base("pids") is None, reason="pids cgroup not writable here")
def test_fork_bomb_then_the_session_still_works(ws: Path) -> None:
    with make_sandbox(ws, SandboxConfig(session=True, max_procs=32, timeout_s=3)) as s:
        r = s.exec(["sh", "-c", ": bomb-5e2a; f() { f | f & }; f; sleep 30"])
        assert "Cannot fork" in r.stderr or "Resource temporarily unavailable" in r.stderr
        assert not alive("bomb-5e2a")
        assert s.exec(["echo", "ok"]).stdout == "ok\n"


def test_memory_bomb_then_the_session_still_works(ws: Path, cfg: SandboxConfig) -> None:
    small = SandboxConfig(session=True, memory_mb=256, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    with make_sandbox(ws, small) as s:
        r = s.exec(["python", "-c", "x = []\nwhile True:\n    x.append(b'x' * 10_000_000)\n"])
        assert r.returncode != 0 and ("MemoryError" in r.stderr or "memory limit" in r.stderr)
        assert s.exec(["echo", "ok"]).stdout == "ok\n"


def test_a_command_that_kills_its_supervisor_gets_a_fresh_session(sb: SessionSandbox) -> None:
    sb.exec(["sh", "-c", "echo x > /tmp/mark"])
    r = sb.exec(["sh", "-c", "kill -9 $PPID; sleep 5"])
    assert r.returncode == 137 and "supervisor failed" in r.stderr
    assert sb.exec(["cat", "/tmp/mark"]).returncode != 0  # a new session: a clean /tmp
    assert sb.exec(["echo", "ok"]).stdout == "ok\n"


def test_a_command_cannot_reach_its_supervisor_through_proc(sb: SessionSandbox) -> None:
    """The supervisor is non-dumpable: its pipes, memory and environment are out of reach."""
    forged = "import os, struct; b = b'{}'; os.write(1, struct.pack('>I', len(b)) + b)"
    (Path(sb.workspace) / "forge.py").write_text(forged)
    r = sb.exec(["sh", "-c", "python forge.py > /proc/$PPID/fd/1; cat /proc/$PPID/environ; head -c1 /proc/$PPID/mem"])
    assert r.stderr.count("Permission denied") == 3, r.stderr
    assert sb.exec(["echo", "ok"]).stdout == "ok\n"  # the same session, unharmed


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (struct.pack(">I", 2**31) + b"{", "exceeds"),
        (struct.pack(">I", 5) + b"[1,2]", "malformed"),
        (struct.pack(">I", 3) + b"{x}", "malformed"),
    ],
)
def test_host_checks_every_reply(frame: bytes, why: str) -> None:
    """Defence in depth: should a command ever get hold of the reply pipe, what it writes is
    size-capped and shape-checked (and ids are checked in exec)."""
    r, w = os.pipe()
    os.write(w, frame)
    os.close(w)
    s = _Session.__new__(_Session)
    s.proc = SimpleNamespace(stdout=os.fdopen(r, "rb"))  # type: ignore[assignment]
    with pytest.raises(_Dead, match=why):
        s.recv(time.monotonic() + 2, max_bytes=1 << 20)


def test_close_kills_everything_and_is_idempotent(ws: Path) -> None:
    s = make_sandbox(ws, SandboxConfig(session=True))
    pid = s._session.proc.pid  # type: ignore[union-attr]
    s.close()
    s.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_session_needs_bwrap_and_the_interpreter(ws: Path) -> None:
    with pytest.raises(EtudeError):
        SessionSandbox(ws, SandboxConfig(session=True, bind_interpreter=False))


def test_a_stopped_supervisor_does_not_hang_the_host(sb: SessionSandbox) -> None:
    """Regression guard: a command can SIGSTOP its supervisor; the host must give up in time."""
    r = sb.exec(["sh", "-c", "kill -STOP $PPID"], timeout_s=0.5)
    assert r.returncode == 124 and "session restarted" in r.stderr
    r = sb.exec(["wc", "-c"], stdin="z" * 1_000_000)  # a big request to the fresh session
    assert r.stdout.strip() == "1000000"


def test_session_outlives_the_thread_that_created_it(ws: Path) -> None:
    """Regression: --die-with-parent is per thread; a session made in a worker thread died with it."""
    import threading

    box: dict[str, SessionSandbox] = {}
    t = threading.Thread(target=lambda: box.setdefault("sb", make_sandbox(ws, SandboxConfig(session=True))))
    t.start()
    t.join()
    with box["sb"] as sb:
        proc = sb._session.proc  # type: ignore[union-attr]
        time.sleep(0.3)  # a SIGKILL from the parent-death signal would have landed by now
        assert proc.poll() is None
        assert sb.exec(["echo", "ok"]).stdout == "ok\n"
        assert sb._session.proc is proc  # type: ignore[union-attr]  # the same session, not a restart


def test_one_session_shared_by_many_threads(sb: SessionSandbox) -> None:
    """Commands from several threads are serialised, and each gets its own answer."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: sb.exec(["sh", "-c", f"echo {i}; echo e{i} >&2"]), range(24)))
    assert [(r.stdout, r.stderr) for r in outs] == [(f"{i}\n", f"e{i}\n") for i in range(24)]
