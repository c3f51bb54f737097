"""Start and stop the real `etude serve` as a subprocess on a free loopback port.

```python
with running_server("sqlite:////tmp/x/etude.db", model="tiny") as srv:
    srv.base_url      # http://127.0.0.1:PORT/v1
```

The child is the production code path (`python -m etude.cli serve`), not an in-process app.
It is asked to die with its parent (Linux PR_SET_PDEATHSIG), so a loop killed with SIGKILL
does not leave a server holding its port. Not guaranteed: a free port stays free between the
moment it is picked and the moment the server binds it (a race with other processes; the
start then fails with a clear error).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError


@dataclass(frozen=True)
class ServerHandle:
    base_url: str  # ends in /v1
    port: int
    pid: int
    log_path: Path | None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()  # its own process group: _stop signals the server and everything it started
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, log: Path | None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:].strip().splitlines() if log and log.exists() else []
            raise EtudeError(f"etude serve exited with status {proc.returncode}: {tail[-1] if tail else '(no log)'}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise EtudeError(f"etude serve did not become healthy within {timeout_s:.0f} s ({url})")


def serve_argv(db: str, port: int, *, model: str = "tiny", name: str | None = None, threads: int | None = 1,
               backend: str = "hf", max_batch: int | None = None) -> list[str]:
    """The command line of the loop's `etude serve` (this Python, so a loop run from .venv-vllm
    serves from there too)."""
    argv = [sys.executable, "-m", "etude.cli", "serve", "--model", model, "--db", db, "--port", str(port)]
    if name:
        argv += ["--name", name]
    if threads:
        argv += ["--threads", str(threads)]
    if backend != "hf":
        argv += ["--backend", backend]
    if max_batch is not None and backend == "hf":
        argv += ["--max-batch", str(max_batch)]
    return argv


@contextmanager
def running_server(db: str, *, model: str = "tiny", name: str | None = None, port: int | None = None,
                   threads: int | None = 1, log_path: str | Path | None = None, backend: str = "hf",
                   max_batch: int | None = None, startup_timeout_s: float = 180.0,
                   env: dict[str, str] | None = None) -> Iterator[ServerHandle]:
    """Run `etude serve --model MODEL --db DB [--backend vllm]` until the block exits (SIGTERM,
    then SIGKILL). With backend "vllm" the server's engine batches continuously and loads new
    checkpoints (an org's adapter, a candidate's weights) while it runs."""
    port = port or free_port()
    argv = serve_argv(db, port, model=model, name=name, threads=threads, backend=backend, max_batch=max_batch)
    log = Path(log_path) if log_path else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent,
                            env={**os.environ, **(env or {})})
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}/health", startup_timeout_s, log)
        yield ServerHandle(f"http://127.0.0.1:{port}/v1", port, proc.pid, log)
    finally:
        _stop(proc)
        if log:
            out.close()  # type: ignore[union-attr]


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to the group after `grace_s`. The group, not
    the server alone: a vLLM server's engine cores are its children, and a server killed on its own
    left them running with their KV caches (two 3.4 GiB orphans after `make test-vllm`)."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is None or pgid == os.getpgid(0):  # never signal our own group
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:  # the server is gone; its children may still be exiting
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    if proc.poll() is None:
        proc.wait(timeout=10)
