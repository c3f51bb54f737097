"""bench/ is a caller of etude's public API: no bench script imports a private name (one starting with
`_`) from an etude module, and none edits sys.path (they run with the installed etude:
`.venv/bin/python bench/x.py`, or `python -m bench.x` where one bench module imports another)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.bench import BENCH_DIR


def _violations(path: Path, root: Path = BENCH_DIR.parent) -> list[str]:
    """'FILE:LINE: what' for each private etude import and each sys.path edit in `path`, by line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        where = f"{path.relative_to(root)}:{line}"
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "etude":
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append((line, f"{where}: imports the private name {alias.name} from {node.module}"))
            for part in node.module.split(".")[1:]:
                if part.startswith("_"):
                    found.append((line, f"{where}: imports from the private module {node.module}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "etude" and any(p.startswith("_") for p in alias.name.split(".")[1:]):
                    found.append((line, f"{where}: imports the private module {alias.name}"))
        elif isinstance(node, ast.Attribute) and node.attr in ("insert", "append", "extend") \
                and isinstance(node.value, ast.Attribute) and node.value.attr == "path" \
                and isinstance(node.value.value, ast.Name) and node.value.value.id == "sys":
            found.append((line, f"{where}: sys.path.{node.attr}"))
    return [msg for _, msg in sorted(found)]


def test_bench_imports_public_names_only_and_leaves_sys_path_alone():
    files = sorted(BENCH_DIR.glob("*.py"))
    assert files, f"no bench scripts under {BENCH_DIR}"
    bad = [v for f in files for v in _violations(f)]
    assert not bad, "bench/ reaches past etude's public API:\n" + "\n".join(bad)


def test_the_check_sees_a_private_import_and_a_path_edit(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import sys\nfrom etude.train.sft import _lr, mix\nsys.path.insert(0, 'a')\n"
                 "def f():\n    from etude.evals import stats as _s\n    sys.path.append('b')\n")
    assert _violations(f, tmp_path) == ["x.py:2: imports the private name _lr from etude.train.sft",
                                        "x.py:3: sys.path.insert", "x.py:6: sys.path.append"]
