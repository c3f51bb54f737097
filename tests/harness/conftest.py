import pytest

from etude.protocols import ToolContext


@pytest.fixture
def ws(tmp_path):
    """A small workspace on disk (file tools need no sandbox)."""
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("def f():\n    return 1\n")
    (root / "pkg" / "b.py").write_text("def g():\n    return 2\n")
    (root / "README.md").write_text("hello\n")
    return root


@pytest.fixture
def ctx(ws):
    return ToolContext(workspace=ws)

