"""How an unpacked source tree is laid out: which files are tests, which are the package's
source, where the import root is, and which requirements the tests need.

These are heuristics over sdists of pure-Python packages (flat or src/ layout, tests in
`tests/`, `test/`, `testing/` or named test_*.py / *_test.py). They do not run setup.py or a
build backend; a package whose tests need a compiled extension is out of scope.
"""

from __future__ import annotations

import email.parser
import re
from pathlib import Path, PurePosixPath

_TEST_DIRS = {"tests", "test", "testing"}
# Files that decide which tests run or how: an agent's edits to these never count at grading.
CONTROL_FILES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py"}
# Files that would shadow or hook the test runner from the workspace.
SHADOW_FILES = {"pytest.py", "sitecustomize.py", "usercustomize.py", "_pytest"}
_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".tox", ".eggs", "build", "dist", ".mypy_cache"}


def is_test_path(rel: str) -> bool:
    """True for test modules and anything under a test directory."""
    parts = PurePosixPath(rel).parts
    name = parts[-1] if parts else ""
    if any(p in _TEST_DIRS for p in parts[:-1]):
        return True
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py")


def is_protected_path(rel: str) -> bool:
    """Paths whose content at grading comes from the task, never from the agent: tests, test
    configuration, and files that could shadow pytest or hook interpreter start-up."""
    parts = PurePosixPath(rel).parts
    if not parts:
        return False
    name = parts[-1]
    if is_test_path(rel) or name.endswith(".pth") or any(p in SHADOW_FILES for p in parts):
        return True
    return name in CONTROL_FILES and (len(parts) == 1 or name == "conftest.py")


def iter_files(root: Path) -> list[str]:
    """Relative POSIX paths of regular files, sorted, skipping caches and VCS folders."""
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if any(part in _SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if p.is_file() and not p.is_symlink():
            out.append(rel.as_posix())
    return sorted(out)


def import_root(root: Path) -> str:
    """'src' for a src/ layout, '.' otherwise (relative to the repository root)."""
    src = root / "src"
    if src.is_dir() and any((c / "__init__.py").is_file() or c.suffix == ".py" for c in src.iterdir()):
        return "src"
    return "."


def source_files(root: Path) -> list[str]:
    """Python files that belong to the package itself (not tests, docs, examples or build files)."""
    base = import_root(root)
    out = []
    for rel in iter_files(root):
        parts = PurePosixPath(rel).parts
        if not rel.endswith(".py") or is_test_path(rel):
            continue
        if base == "src" and parts[0] != "src":
            continue
        if base == "." and (len(parts) == 1 and parts[0] in {"setup.py", "noxfile.py", "conf.py", "fabfile.py"}):
            continue
        if parts[0] in {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools", "ci"}:
            continue
        out.append(rel)
    return out


def test_files(root: Path) -> list[str]:
    return [rel for rel in iter_files(root) if is_test_path(rel)]


def test_paths(root: Path) -> list[str]:
    """What pytest should run for the whole suite: the test directories, or "." when tests sit at
    the top level or inside the package."""
    dirs = sorted({rel.split("/", 1)[0] for rel in test_files(root) if "/" in rel})
    named = [d for d in dirs if d in _TEST_DIRS]
    return named or dirs[:1] or ["."]


def _pkg_info(root: Path) -> email.message.Message | None:
    p = root / "PKG-INFO"
    if not p.is_file():
        return None
    return email.parser.Parser().parsestr(p.read_text(encoding="utf-8", errors="replace"))


def declared_requirements(root: Path) -> list[str]:
    """Runtime requirements plus those of a test extra, from PKG-INFO (markers evaluated for
    this interpreter). Optional extras other than test/tests/testing are left out."""
    from packaging.requirements import InvalidRequirement, Requirement

    info = _pkg_info(root)
    if info is None:
        return []
    out: list[str] = []
    for line in info.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None:
            ok = any(req.marker.evaluate({"extra": e}) for e in ("", "test", "tests", "testing"))
            if not ok:
                continue
            # A marker that holds only under a non-test extra was already filtered out above.
        req.marker = None
        if normalise_name(req.name) not in _TOOLING:
            out.append(str(req))
    return sorted(set(out))


# Test tooling we never install per task: pytest is pinned by the env, the rest is not needed to
# run tests (coverage, linters, runners).
_TOOLING = {"pytest", "pytest-cov", "coverage", "flake8", "mypy", "tox", "nox", "black", "ruff", "pre-commit", "pylint",
            "isort", "sphinx", "twine", "build", "wheel", "setuptools", "pytest-runner", "codecov", "check-manifest"}  # fmt: skip


def normalise_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def changelog_text(root: Path) -> str:
    """The first changelog-like file near the top of the tree, else the README (whose "version
    history" section some packages keep instead); '' if neither exists."""
    pat = re.compile(r"^(changes|changelog|history|news|release[-_ ]?notes)(\.\w+)?$", re.I)
    files = [rel for rel in iter_files(root) if len(PurePosixPath(rel).parts) <= 2]
    readme = re.compile(r"^readme(\.\w+)?$", re.I)
    for rel in [r for r in files if pat.match(PurePosixPath(r).name)] + [r for r in files if readme.match(r)]:
        return (root / rel).read_text(encoding="utf-8", errors="replace")
    return ""
