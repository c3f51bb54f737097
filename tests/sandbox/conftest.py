"""Sandbox tests run real bubblewrap; they are skipped (with the reason) where bwrap is missing."""

import shutil
import sys
from pathlib import Path

import pytest

from etude.sandbox import SandboxConfig

VENV = Path(sys.prefix)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


@pytest.fixture
def cfg() -> SandboxConfig:
    """Short timeout, the test venv bound so `python -m pytest` works inside."""
    return SandboxConfig(timeout_s=20, ro_binds=(str(VENV),), path_prepend=(str(VENV / "bin"),))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "unsandboxed: runs the explicit unsandboxed backend (no bwrap needed)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test here runs real bubblewrap; skip them loudly (not silently pass) where it is missing.
    if shutil.which("bwrap") is not None:
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="bubblewrap (bwrap) not installed")
    for item in items:
        if here in Path(item.fspath).parents and "unsandboxed" not in item.keywords:
            item.add_marker(skip)
