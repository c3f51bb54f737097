"""`etude sandbox exec` end to end, and the explicit unsandboxed backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import etude.sandbox.bwrap as bw
from etude.errors import EtudeError
from etude.sandbox import SandboxConfig, make_sandbox, run

# The sandbox's own entry point (same command, same error handling) starts in well under a second;
# the full `etude` app imports every component and is exercised once, in the slow test below.
FAST = [sys.executable, "-m", "etude.sandbox.cli"]


def etude(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    assert args[0] == "sandbox"
    return subprocess.run([*FAST, *args[1:]], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.slow
def test_full_etude_cli_exec(ws: Path) -> None:
    full = [sys.executable, "-m", "etude.cli", "sandbox", "exec", "--workspace"]
    p = subprocess.run(
        [*full, str(ws), "--", "sh", "-c", "echo hi; exit 5"], capture_output=True, text=True, check=False
    )
    assert (p.returncode, p.stdout) == (5, "hi\n"), p.stderr
    (ws / "a-file").write_text("")  # a missing workspace is created (mkdir -p); a file there is an error
    p = subprocess.run([*full, str(ws / "a-file"), "--", "true"], capture_output=True, text=True, check=False)
    assert p.returncode == 2 and p.stderr.startswith("etude: error: ") and "Traceback" not in p.stderr


def test_exec_passes_status_output_and_writes(ws: Path) -> None:
    p = etude("sandbox", "exec", "--workspace", str(ws), "--", "sh", "-c", "echo out; echo err >&2; echo w > f; exit 3")
    assert (p.returncode, p.stdout, p.stderr) == (3, "out\n", "err\n")
    assert (ws / "f").read_text() == "w\n"


def test_exec_timeout_is_124(ws: Path) -> None:
    p = etude(
        "sandbox",
        "exec",
        "--workspace",
        str(ws),
        "--timeout",
        "1",
        "--",
        "sh",
        "-c",
        "setsid sleep 271.828 & sleep 271.828",
    )
    assert p.returncode == 124 and "timed out after 1 s" in p.stderr
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "271.828" not in ps


def test_exec_with_venv_runs_python(ws: Path) -> None:
    p = etude(
        "sandbox",
        "exec",
        "--workspace",
        str(ws),
        "--venv",
        sys.prefix,
        "--",
        "python",
        "-c",
        "import typer, sys; print(sys.prefix)",
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == sys.prefix


@pytest.mark.parametrize(
    "args",
    [
        ["--workspace", "/dev/null", "--", "true"],  # a file, not a folder (a missing folder is made)
        ["--workspace", "{ws}", "--timeout", "-1", "--", "true"],
        ["--workspace", "{ws}", "--ro-bind", "/no/such/path", "--", "true"],
    ],
)
def test_exec_bad_input_is_one_line_exit_2(ws: Path, args: list[str]) -> None:
    p = etude("sandbox", "exec", *[a.format(ws=ws) for a in args])
    assert p.returncode == 2
    assert p.stderr.startswith("etude: error: ") and len(p.stderr.strip().splitlines()) == 1
    assert "Traceback" not in p.stderr


def test_missing_bwrap_is_an_error_never_a_silent_fallback(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bw.shutil, "which", lambda name, **k: None)
    bw.bwrap_exe.cache_clear()
    try:
        with pytest.raises(EtudeError, match="unsandboxed"):
            run(["true"], workspace=ws)
        with pytest.raises(EtudeError):
            make_sandbox(ws)
    finally:
        bw.bwrap_exe.cache_clear()


@pytest.mark.unsandboxed
def test_unsandboxed_backend_is_explicit_and_loud(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import etude.sandbox.runner as runner

    runner._warned.clear()
    r = run(["sh", "-c", "echo $ETUDE_UNSANDBOXED; pwd"], workspace=ws, config=SandboxConfig(backend="unsandboxed"))
    assert r.stdout.split() == ["1", str(ws.resolve())]
    assert "NO isolation" in capsys.readouterr().err


@pytest.mark.unsandboxed
def test_unsandboxed_timeout_still_kills_the_tree(ws: Path) -> None:
    cfg = SandboxConfig(backend="unsandboxed", timeout_s=1)
    r = run(["sh", "-c", "sleep 161.803 & sleep 161.803"], workspace=ws, config=cfg)
    assert r.returncode == 124
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "161.803" not in ps
