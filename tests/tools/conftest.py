"""A workspace with files, a secret outside it, and symlinks that point in and out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from etude.protocols import ToolContext


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("TOP SECRET\n")
    return d


@pytest.fixture
def ws(tmp_path: Path, outside: Path) -> Path:
    w = tmp_path / "ws"
    (w / "src" / "pkg").mkdir(parents=True)
    (w / "src" / "pkg" / "__init__.py").write_text("")
    (w / "src" / "pkg" / "core.py").write_text(
        "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
    )
    (w / "README.md").write_text("# demo\nadd and sub\n")
    (w / "tests").mkdir()
    (w / "tests" / "test_core.py").write_text(
        "from pkg.core import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
    )
    os.symlink(outside / "secret.txt", w / "leak.txt")  # file symlink out
    os.symlink(outside, w / "outdir")  # folder symlink out
    os.symlink("src/pkg/core.py", w / "core_link.py")  # symlink that stays inside
    return w


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws)
