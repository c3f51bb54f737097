"""Copy-on-write workspaces: a fresh writable view of a template repository per episode.

Kinds, tried in this order by `kind="auto"`:
- "overlay": overlayfs mounted by the launcher (root needed): lowerdir = template (never written),
  upper/work dirs private to this workspace; creation costs one mount, not a copy. `diff()` only
  looks at what the upper dir holds.
- "worktree": `git worktree add --detach` when the template is a clean git checkout.
- "copy": a full copy (`shutil.copytree`, symlinks kept).
Disk quota: every kind puts the workspace's writable layer (the overlay's upper and work dirs, or
the worktree / copy itself) on a tmpfs mounted with `size=disk_mb` (default 1 GiB, the sandbox
config's `workspace_disk_mb`), so one workspace that writes too much gets ENOSPC ("No space left
on device") and the host's disk and the other workspaces keep their space. A tmpfs's pages are
memory (swappable), charged to the memory cgroup of the process that wrote them, like the
sandbox's /tmp. Where the launcher cannot mount (not root / no CAP_SYS_ADMIN, or not Linux) the
workspace is created without a cap, `disk_mb` is None, and a warning says so once per process.

Guarantees: the template is never modified (except git's bookkeeping under .git/worktrees for the
worktree kind); `close()` unmounts and deletes everything; a workspace left mounted by a crashed
process is cleaned up by the next `Workspace.create` in the same root (its owner pid is dead).
Does not: snapshot the template (changing the template under a live overlay is undefined, as with
any overlayfs lower dir).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Literal

from etude.errors import EtudeError
from etude.sandbox.diff import tree_diff, walk_files

Kind = Literal["auto", "overlay", "worktree", "copy"]
DEFAULT_DISK_MB = 1024
"""Size of each workspace's writable layer (a tmpfs) unless the caller says otherwise."""
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4
_INODES_PER_MB = 128  # tmpfs inode cap: 131,072 files and directories for the default 1 GiB
_quota_warned = threading.Event()
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sweep_lock = threading.Lock()


def default_root() -> Path:
    """Where workspaces live: $ETUDE_WORKSPACES, else <tmp>/etude-workspaces."""
    return Path(os.environ.get("ETUDE_WORKSPACES") or Path(tempfile.gettempdir()) / "etude-workspaces")


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    # NOTE: redirect_dir/metacopy off keep every change visible as a plain file in upper, which
    # is what diff() reads; some kernels lack the options, so retry without them.
    for extra in (",redirect_dir=off,metacopy=off,index=off", ""):
        if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, (opts + extra).encode()) == 0:
            return
    err = ctypes.get_errno()
    raise OSError(err, f"overlay mount failed: {os.strerror(err)}")


def _mount_tmpfs(target: Path, size_mb: int) -> None:
    opts = f"size={size_mb}m,nr_inodes={max(size_mb * _INODES_PER_MB, 1024)},mode=0755"
    if _libc.mount(b"tmpfs", str(target).encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"tmpfs mount failed: {os.strerror(err)}")


def _warn_no_quota(why: str) -> None:
    if not _quota_warned.is_set():
        _quota_warned.set()
        print(f"etude: WARNING: workspaces have NO disk quota here ({why}): one workspace can fill the "
              "host's disk; run as root on Linux to cap each at workspace_disk_mb", file=sys.stderr)


def _disk_layer(base: Path, disk_mb: int | None) -> tuple[Path, int | None]:
    """The directory that holds the workspace's writable layer, and the cap actually in force."""
    disk = base / "disk"
    disk.mkdir()
    if disk_mb is None:
        return disk, None
    if sys.platform != "linux" or os.geteuid() != 0:
        _warn_no_quota("mounting a size-capped tmpfs needs a root launcher on Linux")
        return disk, None
    try:
        _mount_tmpfs(disk, disk_mb)
    except OSError as e:
        _warn_no_quota(str(e))
        return disk, None
    return disk, disk_mb


def _umount(target: Path) -> None:
    _libc.umount2(str(target).encode(), _MNT_DETACH)


def _is_mount(p: Path) -> bool:
    try:
        return p.is_mount()
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Workspace:
    """A writable copy-on-write view of `template` at `path`; use as a context manager."""

    def __init__(self, template: Path, base: Path, path: Path, kind: str, disk_mb: int | None = None) -> None:
        self.template, self.base, self.path, self.kind = template, base, path, kind
        self.disk_mb = disk_mb
        """The size cap of the writable layer in MiB; None: no cap (not requested, or not possible here)."""
        self._closed = False

    @classmethod
    def create(cls, template: Path | str, *, kind: Kind = "auto", root: Path | None = None,
               disk_mb: int | None = DEFAULT_DISK_MB) -> Workspace:
        """A fresh workspace from `template` (a directory), its writable layer capped at `disk_mb`
        MiB (None: no cap). Raises EtudeError on bad input."""
        tpl = Path(template).resolve()
        if not tpl.is_dir():
            raise EtudeError(f"workspace template is not a directory: {template}")
        if kind not in ("auto", "overlay", "worktree", "copy"):
            raise EtudeError(f"unknown workspace kind {kind!r} (auto, overlay, worktree, copy)")
        if disk_mb is not None and (isinstance(disk_mb, bool) or not isinstance(disk_mb, int) or disk_mb <= 0):
            raise EtudeError(f"workspace disk_mb must be a positive integer (MiB) or None, got {disk_mb!r}")
        root = Path(root or default_root())
        root.mkdir(parents=True, exist_ok=True)
        sweep_stale(root)
        base = Path(tempfile.mkdtemp(prefix="ws-", dir=root))
        (base / "owner.pid").write_text(str(os.getpid()))
        try:
            disk, cap = _disk_layer(base, disk_mb)
            path, made = _materialise(tpl, disk, kind, cap)
        except BaseException:
            _remove(base)
            raise
        return cls(tpl, base, path, made, cap)

    def diff(self) -> str:
        """Unified patch (a/ b/ prefixes, `git apply`-able in the template) of every change."""
        if self._closed:
            raise EtudeError("workspace is closed")
        candidates = _overlay_candidates(self.base / "disk" / "upper", self.template) if self.kind == "overlay" else None
        return tree_diff(self.template, self.path, candidates)

    def close(self) -> None:
        """Unmount and delete everything (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self.kind == "worktree":
            subprocess.run(
                ["git", "-C", str(self.template), "worktree", "remove", "--force", str(self.path)],
                capture_output=True,
                check=False,
            )
        _remove(self.base)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Workspace(kind={self.kind!r}, path={str(self.path)!r}, template={str(self.template)!r})"


def _materialise(tpl: Path, disk: Path, kind: Kind, cap: int | None) -> tuple[Path, str]:
    # `disk` holds the writable layer (a size-capped tmpfs where possible); the overlay's merged
    # view is mounted beside it, in the workspace's base directory.
    order = [kind] if kind != "auto" else ["overlay", "worktree", "copy"]
    errors = []
    for k in order:
        try:
            if k == "overlay":
                return _make_overlay(tpl, disk), k
            if k == "worktree":
                return _make_worktree(tpl, disk), k
            return _make_copy(tpl, disk), k
        except (OSError, subprocess.CalledProcessError, _Unsuitable) as e:
            errors.append(f"{k}: {e}")
            _clear(disk)  # a half-made attempt must not eat the next one's quota
    hint = f" (is the template larger than the workspace's disk cap of {cap} MiB?)" if cap and any(
        "No space left" in e or "ENOSPC" in e for e in errors) else ""
    raise EtudeError("cannot create workspace: " + "; ".join(errors) + hint)


def _clear(d: Path) -> None:
    for child in list(d.iterdir()) if d.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


class _Unsuitable(Exception):
    pass


def _make_overlay(tpl: Path, disk: Path) -> Path:
    if sys.platform != "linux":
        raise _Unsuitable("overlayfs is Linux-only")
    if os.geteuid() != 0:
        raise _Unsuitable("needs root")
    if any(c in str(tpl) for c in ",:\\"):
        raise _Unsuitable("template path has characters overlayfs options cannot hold")
    upper, work, merged = disk / "upper", disk / "work", disk.parent / "merged"
    for d in (upper, work, merged):
        d.mkdir()
    _mount_overlay(tpl, upper, work, merged)
    return merged


def _make_worktree(tpl: Path, disk: Path) -> Path:
    if not (tpl / ".git").exists() or shutil.which("git") is None:
        raise _Unsuitable("template is not a git checkout")
    status = subprocess.run(
        ["git", "-C", str(tpl), "status", "--porcelain"], capture_output=True, text=True, check=True
    )
    if status.stdout.strip():
        raise _Unsuitable("template has uncommitted changes")
    tree = disk / "tree"
    subprocess.run(
        ["git", "-C", str(tpl), "worktree", "add", "--detach", str(tree), "HEAD"], capture_output=True, check=True
    )
    return tree


def _make_copy(tpl: Path, disk: Path) -> Path:
    tree = disk / "tree"
    shutil.copytree(tpl, tree, symlinks=True)
    return tree


def _overlay_candidates(upper: Path, template: Path) -> set[str]:
    """Paths that may differ: everything in upper, plus the template's files under any whiteout
    or opaque directory (their lower content is hidden)."""
    out: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(upper):
        rel_dir = os.path.relpath(dirpath, upper)
        rel_dir = "" if rel_dir == "." else rel_dir
        if rel_dir and _opaque(Path(dirpath)):
            out.update(walk_files(template, rel_dir))
        for name in filenames + dirnames:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            lower = template / rel
            if name in filenames or os.path.islink(os.path.join(dirpath, name)):
                out.add(rel)
                if lower.is_dir() and not lower.is_symlink():
                    out.update(walk_files(template, rel))  # whiteout (or file) over a lower directory
            elif lower.is_symlink() or lower.exists() and not lower.is_dir():
                out.add(rel)  # a directory now where the template had a file
    return out


def _opaque(d: Path) -> bool:
    try:
        return os.getxattr(d, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _remove(base: Path) -> None:
    for mnt in (base / "merged", base / "disk"):  # the overlay first: its upper lives on the disk tmpfs
        if _is_mount(mnt):
            _umount(mnt)
    shutil.rmtree(base, ignore_errors=True)


def sweep_stale(root: Path) -> int:
    """Remove workspaces under `root` whose owner process is gone (a crash left them). Returns count."""
    n = 0
    with _sweep_lock:
        for base in root.glob("ws-*"):
            try:
                pid = int((base / "owner.pid").read_text())
            except (OSError, ValueError):
                continue  # being created right now, or not ours
            if not _pid_alive(pid):
                _remove(base)
                n += 1
    return n
