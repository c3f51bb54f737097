"""`etude sandbox exec --workspace DIR` creates a missing DIR (mkdir -p), as the README tour's
first command (`--workspace /tmp/ws`) needs on a fresh machine; a file at DIR is still an error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

FAST = [sys.executable, "-m", "etude.sandbox.cli", "exec", "--workspace"]


def test_a_missing_workspace_is_created_with_its_parents(tmp_path: Path) -> None:
    ws = tmp_path / "not" / "yet" / "ws"
    p = subprocess.run([*FAST, str(ws), "--timeout", "5", "--", "python", "-c", "print('hello from the sandbox')"],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 0 and p.stdout == "hello from the sandbox\n", p.stderr
    assert ws.is_dir()


def test_a_file_at_the_workspace_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "a-file"
    f.write_text("")
    p = subprocess.run([*FAST, str(f), "--", "true"], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2 and "workspace is not a directory" in p.stderr and "Traceback" not in p.stderr
    assert f.is_file()


def test_help_says_the_workspace_is_created() -> None:
    p = subprocess.run([*FAST[:-1], "--help"], capture_output=True, text=True, timeout=60, check=False,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and "mkdir -p" in p.stdout, p.stdout + p.stderr
