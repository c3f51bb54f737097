"""The loop's server is stopped with everything it started: a vLLM server's engine cores are its
children, and stopping the server alone left them running (two 3.4 GiB orphans after a test run)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from etude.loop.server import _die_with_parent, _stop


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # exited; only its parent's reaping is left


def _wait_gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.05)
    return False


def _spawn(script: str, tmp_path: Path) -> tuple[subprocess.Popen, int]:
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(["bash", "-c", script.replace("PIDFILE", str(pidfile))], preexec_fn=_die_with_parent)
    deadline = time.monotonic() + 10
    while not (pidfile.is_file() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "the server script did not start its child"
        time.sleep(0.05)
    return proc, int(pidfile.read_text())


def test_a_child_of_the_server_is_stopped_with_it(tmp_path):
    proc, child = _spawn("sleep 300 & echo $! > PIDFILE; exec sleep 300", tmp_path)
    assert not _gone(child)
    _stop(proc, grace_s=5)
    assert proc.poll() is not None
    assert _wait_gone(child), "the server's child outlived it"


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    proc, child = _spawn("trap '' TERM; sleep 300 & echo $! > PIDFILE; wait", tmp_path)
    _stop(proc, grace_s=1)
    assert proc.poll() is not None
    assert _wait_gone(child)
