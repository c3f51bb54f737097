"""Content-addressed snapshots of a tree: how a task mined from git history rebuilds its base
without the repository it came from.

A snapshot is a reproducible tar.gz of a tree's regular files (sorted, mtime 0, owner 0, mode
0644 or 0755), stored as cache()/archives/<sha256>.tar.gz and named by the sha256 of its bytes,
so the same tree always gives the same file and a task names it by hash (`setup["archive"]`).
`export_commit` writes a commit's tree from a local repository without touching its index, work
tree or refs. What this does not keep: symlinks (a link to a file inside the tree is stored as that
file, any other link is dropped), empty directories, file modes other than the executable bit, and
submodules' contents.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from etude.errors import EtudeError
from etude.paths import cache


def archive_dir() -> Path:
    return cache() / "archives"


def archive_path(sha256: str) -> Path:
    return archive_dir() / f"{sha256}.tar.gz"


def _members(root: Path) -> list[tuple[str, Path]]:
    """(relative POSIX path, file) for every regular file under root, links resolved inside it."""
    out = []
    top = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames:
            p = Path(dirpath) / name
            real = p.resolve()
            if real.is_file() and real.is_relative_to(top):
                out.append((p.relative_to(root).as_posix(), real))
    return sorted(out)


def _tar_bytes(root: Path) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w",
                                                                            format=tarfile.PAX_FORMAT) as tf:  # fmt: skip
        for rel, real in _members(root):
            data = real.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if os.access(real, os.X_OK) else 0o644
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def store_tree(root: Path) -> tuple[str, bool]:
    """Snapshot `root` into the cache; (sha256, whether this call wrote a new archive). An archive
    already there is never rewritten."""
    data = _tar_bytes(root)
    sha = hashlib.sha256(data).hexdigest()
    dest = archive_path(sha)
    if dest.is_file():
        return sha, False
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f"{sha}.", suffix=".part", dir=dest.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the rest of the cache is world-readable
    os.replace(tmp, dest)
    return sha, True


@contextmanager
def unpacked(sha256: str, scratch: Path) -> Iterator[Path]:
    """The archive's tree unpacked in a temporary directory under `scratch` (removed afterwards);
    the archive's bytes must match its name."""
    src = archive_path(sha256)
    if not src.is_file():
        raise EtudeError(
            f"base archive {sha256[:12]} is not in {src.parent}; mine the repository again "
            "(etude tasks mine --repo) or copy the archive there"
        )
    data = src.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise EtudeError(f"base archive {src} does not match its sha256 (corrupt); delete it and mine again")
    scratch.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unpack-", dir=scratch) as tmp:
        tree = Path(tmp) / "t"
        tree.mkdir()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tf:
            tf.extractall(tree, filter="data")
        yield tree


def export_commit(repo: Path, rev: str, dest: Path) -> Path:
    """Write the tree of `rev` in the git repository `repo` to `dest` (a new directory), through a
    private index file: the repository's own index, work tree and refs are left alone."""
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="etude-index-") as tmp:
        env = dict(os.environ, GIT_INDEX_FILE=str(Path(tmp) / "index"))
        for args in (["read-tree", rev], [f"--work-tree={dest}", "checkout-index", "-a", "-f"]):
            proc = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = proc.stderr.strip().splitlines()[-1:] or ["git failed"]
                raise EtudeError(f"cannot export {rev} from {repo}: {tail[0]}")
    return dest
