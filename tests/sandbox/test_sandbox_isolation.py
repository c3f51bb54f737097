"""Isolation and limits of the bwrap backend, each shown with a real attempt to break it."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from etude.sandbox import SandboxConfig, run
from etude.sandbox.limits import controller_base

PY = "python"


def survivors(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (processes that outlived their run)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


# --- secrets and the host filesystem -----------------------------------------------------------


def test_etc_shadow_is_not_readable(ws: Path) -> None:
    assert Path("/etc/shadow").exists()  # the host has one; the sandbox must not show it
    r = run(["sh", "-c", "cat /etc/shadow; ls /etc"], workspace=ws)
    assert "No such file" in r.stderr
    assert "shadow" not in r.stdout


def test_host_root_home_and_tmp_are_not_visible(ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-42")
    r = run(["sh", "-c", f"cat {secret}; ls -A /root; ls -A /tmp"], workspace=ws)
    assert "TOP-SECRET-42" not in r.stdout
    visible_root = set(r.stdout.split())
    host_root = set(os.listdir("/root"))
    # Only the path down to the interpreter prefix (e.g. /root/.pyenv) may exist inside.
    assert visible_root <= {".pyenv"} and (host_root - {".pyenv"}).isdisjoint(visible_root)


def test_nothing_outside_the_workspace_is_writable(ws: Path, cfg: SandboxConfig) -> None:
    venv_file = Path(cfg.ro_binds[0]) / "etude-sandbox-write-test"
    script = f"touch /usr/x; touch /workspace/../escape; touch /escape; touch {venv_file}; echo ok > /workspace/in"
    r = run(["sh", "-c", script], workspace=ws, config=cfg)
    assert r.stderr.count("Read-only file system") == 4, r.stderr
    assert not (ws.parent / "escape").exists() and not venv_file.exists() and not Path("/usr/x").exists()
    assert (ws / "in").read_text() == "ok\n"


def test_workspace_files_stay_owned_by_the_launcher(ws: Path) -> None:
    run(["sh", "-c", "mkdir d && echo x > d/f"], workspace=ws)
    st = (ws / "d" / "f").stat()
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert (ws / "d" / "f").read_text() == "x\n"


def test_no_capabilities_and_remount_is_refused(ws: Path) -> None:
    r = run(["sh", "-c", "grep CapEff /proc/self/status; mount -o remount,rw /usr; touch /usr/y"], workspace=ws)
    assert "CapEff:\t0000000000000000" in r.stdout
    assert not Path("/usr/y").exists()


# --- network --------------------------------------------------------------------------------------


def test_host_loopback_listener_is_unreachable(ws: Path, cfg: SandboxConfig) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__)\n"
    )
    try:
        r = run([PY, "-c", code], workspace=ws, config=cfg)
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()  # a connection that got through would be waiting in the backlog
    finally:
        srv.close()
    assert r.stdout.strip() == "ConnectionRefusedError", r.stdout + r.stderr


def test_only_a_private_loopback_interface(ws: Path) -> None:
    r = run(["cat", "/proc/net/dev"], workspace=ws)
    ifaces = [ln.split(":")[0].strip() for ln in r.stdout.splitlines()[2:]]
    assert ifaces == ["lo"]


# --- process tree, timeouts ------------------------------------------------------------------------


def test_timeout_kills_setsid_children_with_status_124(ws: Path) -> None:
    marker = "313.371"
    script = f"setsid sleep {marker} & setsid sh -c 'sleep {marker}' & (sleep {marker} &) ; sleep {marker}"
    r = run(["sh", "-c", script], workspace=ws, timeout_s=1)
    assert (r.returncode, r.timed_out) == (124, True)
    assert survivors(marker) == []


def test_background_children_die_when_the_command_exits(ws: Path) -> None:
    marker = "314.159"
    r = run(["sh", "-c", f"setsid sleep {marker} > /dev/null 2>&1 & echo started"], workspace=ws)
    assert (r.returncode, r.stdout) == (0, "started\n")
    assert survivors(marker) == []


@pytest.mark.skipif(
    controller_base("pids") is None and os.geteuid() == 0,
    reason="no pids cgroup and a root launcher: no process cap, a fork bomb would hit the host",
)
def test_fork_bomb_hits_the_process_cap_and_leaves_nothing(ws: Path) -> None:
    marker = "forkbomb-7b1e"
    cfg = SandboxConfig(max_procs=32, timeout_s=3)
    r = run(["sh", "-c", f": {marker}; f() {{ f | f & }}; f; sleep 30"], workspace=ws, config=cfg)
    assert "Cannot fork" in r.stderr or "Resource temporarily unavailable" in r.stderr
    assert survivors(marker) == []


@pytest.mark.skipif(
    controller_base("pids") is None and os.geteuid() == 0,
    reason="no pids cgroup and a root launcher: no process cap, a fork bomb would hit the host",
)
def test_relentless_fork_bomb_runs_into_the_timeout_and_leaves_nothing(ws: Path) -> None:
    """A bomb that never gives up (every process forks forever, ignoring failures) until 124."""
    marker = "relentless-9c4d"
    code = f"# {marker}\nimport os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run(["python3", "-c", code], workspace=ws, config=SandboxConfig(max_procs=48, timeout_s=1.5))
    assert (r.returncode, r.timed_out) == (124, True)
    assert survivors(marker) == []


@pytest.mark.skipif(controller_base("pids") is None, reason="pids cgroup not writable here")
def test_process_cap_counts_live_processes(ws: Path, cfg: SandboxConfig) -> None:
    code = (
        "import subprocess\nok = fail = 0\nps = []\n"
        "for _ in range(40):\n"
        "    try:\n        ps.append(subprocess.Popen(['sleep', '5'])); ok += 1\n"
        "    except OSError:\n        fail += 1\n"
        "print(ok, fail)\n"
        "for p in ps: p.kill()\n"
    )
    small = SandboxConfig(max_procs=16, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    r = run([PY, "-c", code], workspace=ws, config=small)
    ok, fail = map(int, r.stdout.split())
    assert ok < 16 and fail > 0 and ok + fail == 40


# --- resource limits -------------------------------------------------------------------------------

BOMB = "x = []\nwhile True:\n    x.append(b'x' * 10_000_000)\n"


def test_memory_bomb_is_stopped_by_rlimit_as(ws: Path, cfg: SandboxConfig) -> None:
    small = SandboxConfig(memory_mb=256, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    r = run([PY, "-c", BOMB], workspace=ws, config=small)
    assert r.returncode != 0 and not r.timed_out
    assert "MemoryError" in r.stderr or r.returncode == 137


@pytest.mark.skipif(controller_base("memory") is None, reason="memory cgroup not writable here")
def test_memory_cgroup_caps_many_processes_together(ws: Path, cfg: SandboxConfig) -> None:
    """Four processes of 100 MB each, under RLIMIT_AS each, exceed a 256 MB cgroup together."""
    one = "import time; x = b'x' * 100_000_000; time.sleep(1); print('survived')"
    script = f'for i in 1 2 3 4; do python -c "{one}" & done; wait'
    small = SandboxConfig(memory_mb=256, address_space_mb=1024, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    r = run(["sh", "-c", script], workspace=ws, config=small)
    assert r.stdout.count("survived") < 4


def test_cpu_time_limit_kills_a_busy_loop(ws: Path, cfg: SandboxConfig) -> None:
    small = SandboxConfig(cpu_s=1, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    r = run([PY, "-c", "while True: pass"], workspace=ws, config=small, timeout_s=30)
    assert not r.timed_out
    assert r.returncode in (128 + 9, 128 + 24)  # SIGKILL / SIGXCPU


def test_file_size_limit(ws: Path) -> None:
    r = run(["sh", "-c", "head -c 3000000 /dev/zero > big"], workspace=ws, config=SandboxConfig(file_size_mb=1))
    assert r.returncode != 0
    assert (ws / "big").stat().st_size <= 1024 * 1024


def test_open_files_limit(ws: Path, cfg: SandboxConfig) -> None:
    code = "fs = []\ntry:\n    for i in range(200): fs.append(open(f'f{i}', 'w'))\nexcept OSError as e:\n    print(e.errno)\n"
    small = SandboxConfig(open_files=32, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
    r = run([PY, "-c", code], workspace=ws, config=small)
    assert r.stdout.strip() == "24"  # EMFILE
    assert len(list(ws.glob("f*"))) < 32


def test_output_capture_is_bounded(ws: Path) -> None:
    cfg = SandboxConfig(max_output_bytes=10_000)
    r = run(
        ["sh", "-c", "echo START; head -c 50000000 /dev/zero | tr '\\000' a; echo; echo END"], workspace=ws, config=cfg
    )
    assert r.returncode == 0 and r.truncated
    assert len(r.stdout) < 11_000
    assert r.stdout.startswith("START") and r.stdout.rstrip().endswith("END")
    assert "bytes of output omitted" in r.stdout


def test_run_is_thread_safe(ws: Path) -> None:
    results: dict[int, str] = {}

    def one(i: int) -> None:
        r = run(["sh", "-c", f"echo {i} > f{i}; cat f{i}"], workspace=ws)
        results[i] = r.stdout

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n" for i in range(8)}


def test_command_that_closes_its_output_is_not_cut_short(ws: Path) -> None:
    """Regression: EOF on stdout/stderr was taken as the end of the command."""
    r = run(["sh", "-c", "echo early; exec >&- 2>&-; sleep 0.5; echo done > f"], workspace=ws)
    assert (r.returncode, r.stdout) == (0, "early\n")
    assert (ws / "f").read_text() == "done\n"


def test_timeout_note_and_memory_note_reach_the_model(ws: Path, cfg: SandboxConfig) -> None:
    r = run(["sleep", "30"], workspace=ws, timeout_s=0.5)
    assert "timed out after 0.5 s" in r.stderr
    if controller_base("memory") is not None:
        small = SandboxConfig(memory_mb=128, address_space_mb=0, ro_binds=cfg.ro_binds, path_prepend=cfg.path_prepend)
        r = run([PY, "-c", BOMB], workspace=ws, config=small)
        assert r.returncode == 137 and "memory limit exceeded" in r.stderr


def test_private_tmp_is_size_capped(ws: Path) -> None:
    r = run(["sh", "-c", "head -c 3000000 /dev/zero > /tmp/fill"], workspace=ws, config=SandboxConfig(tmp_mb=2))
    assert r.returncode != 0 and "No space left" in r.stderr


@pytest.mark.parametrize("via_shell", [True, False], ids=["sh-ulimit", "prlimit"])
def test_rlimits_are_set_soft_and_hard(ws: Path, monkeypatch: pytest.MonkeyPatch, via_shell: bool) -> None:
    import etude.sandbox.limits as lim

    monkeypatch.setattr(lim, "_ulimit_works", lambda: via_shell)
    cfg = SandboxConfig(memory_mb=300, cpu_s=7, file_size_mb=3, open_files=55)
    text = run(["cat", "/proc/self/limits"], workspace=ws, config=cfg).stdout
    rows = {ln[:26].strip(): ln[26:].split()[:2] for ln in text.splitlines()[1:]}
    assert rows["Max address space"] == [str(300 << 20)] * 2
    assert rows["Max cpu time"] == ["7", "7"]
    assert rows["Max file size"] == [str(3 << 20)] * 2
    assert rows["Max open files"] == ["55", "55"]
    assert rows["Max core file size"] == ["0", "0"]


@pytest.mark.skipif(controller_base("pids") is None, reason="pids cgroup not writable here")
def test_cgroups_left_by_a_killed_launcher_are_swept(ws: Path) -> None:
    import subprocess
    import sys

    import etude.sandbox.limits as lim

    code = (
        "import os, sys\nfrom etude.sandbox import SandboxConfig\nfrom etude.sandbox.limits import Cgroup\n"
        "cg = Cgroup.create(SandboxConfig())\nprint(*cg.dirs, flush=True)\nos._exit(9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False).stdout.split()
    left = [Path(p) for p in out]
    assert left and all(p.is_dir() for p in left)
    lim._sweep_stale(controller_base("pids"))  # what the first probe of a new process does
    if controller_base("memory") is not None:
        lim._sweep_stale(controller_base("memory"))
    assert not any(p.exists() for p in left)
