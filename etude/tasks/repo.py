"""Materialising a task: its repository at base, and a virtual environment for its tests.

How base is materialised (the contract for every sdist-derived task):
  template = unpacked sdist `setup["sdist"]` (package, version, sha256) + `setup["base_patch"]`
  applied with git apply, then `git init` and one commit, cached under cache()/repos/<key>.
  * mined tasks: the old release as published (old source, old tests); base_patch is empty.
    `test_patch` brings the new release's tests at grading, `patch` is the release's source diff.
  * synthesised tasks: the release with the bug injected (base_patch = the mutation), original
    tests; `patch` is the reverse of the mutation; test_patch is empty.
  * a task may instead name a local directory in `setup["repo_dir"]` (`etude tasks synth --repo`,
    or SWE-bench rows a user has checked out at base): it is copied (without .git, venvs and
    caches) and base_patch applied the same way. The cache key includes the tree's file sizes and
    mtimes, so editing the directory makes a new template.
  * a task mined from git history (`etude tasks mine --repo`) names a content-addressed snapshot
    of its base tree in `setup["archive"]` ({"sha256", "commit"}): cache()/archives/<sha256>.tar.gz
    (etude.tasks.snapshot), unpacked and base_patch applied the same way, so the task rebuilds
    without the repository it came from. The archive itself is not re-creatable from the task.
`base_commit` is "sdist:NAME==VER+KEY" so it names exactly this state (for history tasks: the
parent commit's sha, which the archive holds).

The test environment: a venv per distinct requirement set (most pure-Python packages share one),
made with `python -m venv --without-pip` from the host interpreter (so the sandbox, which binds the
host interpreter, can run it through `ro_binds`/`path_prepend`) and filled by the host's pip
(`pip --python`). The package itself is NOT installed in it: tests import the workspace copy
through PYTHONPATH=/workspace or /workspace/src (`setup["pythonpath"]`), because an editable install
cannot be made read-only and an installed copy would shadow the agent's edits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from etude.errors import EtudeError
from etude.paths import cache
from etude.tasks.diffs import apply_patch
from etude.tasks.fetch import fetch_sdist, locked, normalise
from etude.tasks.layout import iter_files
from etude.tasks.snapshot import unpacked
from etude.types import Task

PYTEST_PIN = "pytest==9.2.0"  # the version the project's own suite pins; every task env gets it


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def sdist_of(task: Task) -> tuple[str, str, str | None]:
    sd = task.setup.get("sdist") or {}
    pkg, ver = sd.get("package"), sd.get("version")
    if not pkg or not ver:
        raise EtudeError(
            f"task {task.instance_id}: no setup.sdist and no setup.repo_dir; "
            "etude can only build repositories from PyPI sdists or a local checkout"
        )
    return str(pkg), str(ver), sd.get("sha256")


def base_key(package: str, version: str, sha256: str | None, base_patch: str) -> str:
    return _key(normalise(package), version, sha256, base_patch)


def base_commit_id(package: str, version: str, sha256: str | None, base_patch: str) -> str:
    return f"sdist:{package}=={version}+{base_key(package, version, sha256, base_patch)}"


def _git(root: Path, *args: str) -> None:
    env = dict(
        os.environ,
        GIT_AUTHOR_NAME="etude",
        GIT_AUTHOR_EMAIL="etude@localhost",
        GIT_COMMITTER_NAME="etude",
        GIT_COMMITTER_EMAIL="etude@localhost",
        GIT_CEILING_DIRECTORIES=str(root.parent),
    )
    subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


def _make_template(src: Path, dest: Path, base_patch: str) -> Path:
    # A private temporary name per call (threads share a pid), renamed into place at the end.
    scratch = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp", dir=dest.parent))
    try:
        tmp = scratch / "t"
        shutil.copytree(src, tmp, symlinks=False, ignore=_IGNORE)
        apply_patch(tmp, base_patch)
        # One commit, so a git-worktree workspace works and `git diff` inside shows only the agent's edits.
        if not (tmp / ".gitignore").exists():
            (tmp / ".gitignore").write_text("__pycache__/\n.pytest_cache/\n")
        _git(tmp, "init", "-q")
        _git(tmp, "add", "-A", "-f", ".")
        _git(tmp, "commit", "-q", "--no-verify", "-m", "base")
        try:
            tmp.rename(dest)
        except OSError:  # another process built it first: theirs is identical
            pass
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest


_IGNORE = shutil.ignore_patterns(
    ".git", ".venv", "venv", "node_modules", "__pycache__", ".pytest_cache", ".tox", ".mypy_cache"
)


def _tree_signature(root: Path) -> str:
    """Cheap identity of a local tree's contents (paths, sizes, mtimes)."""
    return _key([(rel, (root / rel).stat().st_size, (root / rel).stat().st_mtime_ns) for rel in iter_files(root)])


def archive_of(task: Task) -> str | None:
    """The sha256 of the task's base snapshot (history tasks), None for other kinds."""
    arc = task.setup.get("archive") or {}
    return str(arc["sha256"]) if not task.setup.get("repo_dir") and arc.get("sha256") else None


def _template_source(task: Task) -> tuple[Path, str]:
    """(tree to copy, cache directory name) for the task's base; the tree is Path() when it must
    first be fetched (sdist) or unpacked (archive)."""
    base_patch = task.setup.get("base_patch", "")
    if task.setup.get("repo_dir"):
        src = Path(task.setup["repo_dir"])
        if not src.is_dir():
            raise EtudeError(f"task {task.instance_id}: setup.repo_dir {src} is not a directory")
        return src, f"local-{src.name}-{_key(str(src.resolve()), _tree_signature(src), base_patch)}"
    if (sha := archive_of(task)) is not None:
        return Path(), f"archive-{sha[:16]}-{_key(sha, base_patch)}"
    pkg, ver, sha = sdist_of(task)
    return Path(), f"{normalise(pkg)}-{ver}-{base_key(pkg, ver, sha, base_patch)}"


def template_dir(task: Task) -> Path:
    """Where the task's template lives in the cache (built or not)."""
    return cache() / "repos" / _template_source(task)[1]


def prepare_repo(task: Task) -> Path:
    """The cached template directory of the task's repository at base (never modify it)."""
    src, name = _template_source(task)
    dest = cache() / "repos" / name
    if (dest / ".git").is_dir():
        return dest
    archive = archive_of(task)
    if not task.setup.get("repo_dir") and archive is None:
        src = fetch_sdist(*sdist_of(task)).root
    with locked(dest.with_name(dest.name + ".lock")):
        if (dest / ".git").is_dir():
            return dest  # built by another thread or process while we waited
        if archive is None:
            return _make_template(src, dest, task.setup.get("base_patch", ""))
        with unpacked(archive, dest.parent) as tree:
            return _make_template(tree, dest, task.setup.get("base_patch", ""))


def test_requirements(task: Task) -> list[str]:
    reqs = [str(r) for r in task.setup.get("test_deps", [])]
    return sorted(set(reqs))


def env_dir(requirements: list[str]) -> Path:
    ver = f"py{sys.version_info.major}{sys.version_info.minor}"
    return cache() / "envs" / f"{ver}-{_key(sys.base_prefix, PYTEST_PIN, sorted(requirements))}"


def make_env(requirements: list[str]) -> Path:
    """A cached venv with pytest and `requirements` (never the package under test)."""
    dest = env_dir(requirements)
    if (dest / ".etude-ready").is_file():
        return dest
    with locked(dest.with_name(dest.name + ".lock")):
        if (dest / ".etude-ready").is_file():
            return dest
        return _build_env(dest, requirements)


def _build_env(dest: Path, requirements: list[str]) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{dest.name}.tmp", dir=dest.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the sandbox user (uid 1000) must read it
    base_python = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
    # NOTE: we build in tmp and rename. Console scripts then hold a stale shebang, but bin/python
    # finds pyvenv.cfg next to itself wherever it is, and we only ever run `python -m pytest`.
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(tmp / "bin" / "python"), "install", "-q",
         "--disable-pip-version-check", PYTEST_PIN, *requirements],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["pip failed"]
        raise EtudeError(f"cannot install test requirements {requirements}: {tail[0]}")
    (tmp / ".etude-ready").write_text(json.dumps({"requirements": requirements, "pytest": PYTEST_PIN}))
    try:
        tmp.rename(dest)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def task_env(task: Task) -> Path:
    """The venv (a directory) for this task's tests; bind it read-only into the sandbox."""
    return make_env(test_requirements(task))
