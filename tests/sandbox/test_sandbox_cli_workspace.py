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


def test_writes_are_capped_and_what_the_command_leaves_comes_back(tmp_path: Path) -> None:
    """--disk-mb (default 1024): the command runs in a capped copy; writing past the cap fails with
    ENOSPC; files it writes, changes and deletes reach the host folder when it ends."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "keep.txt").write_text("old\n")
    (ws / "gone.txt").write_text("bye\n")
    (ws / "sub" / "x.py").write_text("x = 1\n")
    script = ("import pathlib, os; p = pathlib.Path('/workspace'); (p / 'keep.txt').write_text('new\\n'); "
              "os.remove(p / 'gone.txt'); (p / 'made').mkdir(); (p / 'made' / 'y.txt').write_text('y\\n')")
    p = subprocess.run([*FAST, str(ws), "--timeout", "30", "--", "python", "-c", script],
                       capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr
    assert (ws / "keep.txt").read_text() == "new\n" and not (ws / "gone.txt").exists()
    assert (ws / "made" / "y.txt").read_text() == "y\n" and (ws / "sub" / "x.py").read_text() == "x = 1\n"

    big = "import sys\ntry:\n    open('/workspace/big', 'wb').write(b'0' * (48 << 20))\nexcept OSError as e:\n    print(e.errno); sys.exit(3)\n"
    p = subprocess.run([*FAST, str(ws), "--disk-mb", "16", "--timeout", "60", "--", "python", "-c", big],
                       capture_output=True, text=True, timeout=180, check=False)
    assert p.returncode == 3 and p.stdout.strip() == "28", p.stdout + p.stderr  # ENOSPC, not the host's disk


def test_sync_back_mirrors_the_tree(tmp_path: Path) -> None:
    from etude.sandbox.cli import sync_back

    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f").write_text("1")
    (src / "link").symlink_to("a/b/f")
    (dst / "a").mkdir(parents=True)
    (dst / "a" / "old").write_text("0")
    (dst / "link").write_text("was a file")
    (dst / "d").mkdir()
    sync_back(src, dst)
    assert (dst / "a" / "b" / "f").read_text() == "1" and not (dst / "a" / "old").exists()
    assert (dst / "link").is_symlink() and (dst / "link").read_text() == "1" and not (dst / "d").exists()
