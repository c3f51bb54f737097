"""Copy-on-write workspaces: a fresh writable view of a template repository per episode.

Kinds, tried in this order by `kind="auto"`:
- "overlay": overlayfs mounted by the launcher (root needed): lowerdir = template (never written),
  upper/work dirs private to this workspace; creation costs one mount, not a copy. `diff()` only
  looks at what the upper dir holds.
- "worktree": `git worktree add --detach` when the template is a clean git checkout.
- "copy": a full copy (`shutil.copytree`, symlinks kept).
Disk cap: every kind puts the workspace's writable layer (the overlay's upper and work dirs, or
the worktree / copy itself) on an ext4 filesystem of its own, `disk_mb` MiB (default 1 GiB, the
sandbox config's `workspace_disk_mb`), held in a sparse image file `<base>/disk.img` on the
workspace root's disk and loop-mounted at `<base>/disk`. One workspace that writes too much gets
ENOSPC ("No space left on device"); the host's disk loses at most `disk_mb` per workspace, and
the pages are page cache (reclaimable), not tmpfs memory. The image is a sparse copy of a
formatted template image made once per root and size (`<root>/.images/`), so creating a
workspace costs a copy of ~150 KiB of metadata, a loop attach and a mount, not a mkfs.
Fails closed: where the cap cannot be set up (not root, not Linux, no loop device, no mkfs.ext4,
a root on tmpfs) `Workspace.create` raises EtudeError saying why, unless the caller asked to run
uncapped: `disk_mb=None` (no cap, silently), or `allow_uncapped=True` / ETUDE_ALLOW_UNCAPPED_DISK=1
(try the cap, and where it is impossible run uncapped with a warning on stderr, once per process).

Guarantees: the template is never modified (except git's bookkeeping under .git/worktrees for the
worktree kind); `close()` unmounts and deletes everything (the image too; its loop device detaches
itself when the mount goes); a workspace left mounted by a crashed process is cleaned up by the
next `Workspace.create` in the same root (its owner pid is dead).
Does not: snapshot the template (changing the template under a live overlay is undefined, as with
any overlayfs lower dir).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import shutil
import stat
import struct
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
"""Size of each workspace's writable layer (an ext4 image on disk) unless the caller says otherwise."""
ALLOW_UNCAPPED_ENV = "ETUDE_ALLOW_UNCAPPED_DISK"
"""Set to 1 to let workspaces run uncapped (with a warning) where the disk cap cannot be set up."""
_MNT_DETACH = 2
_MS_NOSUID, _MS_NODEV = 2, 4
_INODES_PER_MB = 128  # 131,072 files and directories for the default 1 GiB (what the tmpfs cap had)
_IMAGE_VERSION = 1  # bump when the mkfs options below change: the cached template images are per version
_LOOP_CTL_GET_FREE, _LOOP_CONFIGURE = 0x4C82, 0x4C0A
_LO_FLAGS_AUTOCLEAR, _LO_FLAGS_DIRECT_IO = 4, 16
_MEMORY_FS = {0x01021994: "tmpfs", 0x858458F6: "ramfs"}  # statfs f_type
_quota_warned = threading.Event()
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sweep_lock = threading.Lock()
_image_lock = threading.Lock()


def default_root() -> Path:
    """Where workspaces live: $ETUDE_WORKSPACES, else <tmp>/etude-workspaces, or
    /var/tmp/etude-workspaces where <tmp> is a tmpfs (the disk images must be on disk)."""
    if os.environ.get("ETUDE_WORKSPACES"):
        return Path(os.environ["ETUDE_WORKSPACES"])
    tmp = Path(tempfile.gettempdir())
    if _memory_fs(tmp) and Path("/var/tmp").is_dir() and not _memory_fs(Path("/var/tmp")):
        return Path("/var/tmp/etude-workspaces")
    return tmp / "etude-workspaces"


def _memory_fs(path: Path) -> str | None:
    """"tmpfs" / "ramfs" when `path` is on a filesystem held in memory, else None."""
    if sys.platform != "linux":
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs; f_type is its first field, a long
    if _libc.statfs(str(path).encode(), buf) != 0:
        return None
    return _MEMORY_FS.get(ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF)


def _mount_overlay(lower: Path, upper: Path, work: Path, target: Path) -> None:
    opts = f"lowerdir={lower},upperdir={upper},workdir={work}"
    # NOTE: redirect_dir/metacopy off keep every change visible as a plain file in upper, which
    # is what diff() reads; some kernels lack the options, so retry without them.
    for extra in (",redirect_dir=off,metacopy=off,index=off", ""):
        if _libc.mount(b"overlay", str(target).encode(), b"overlay", 0, (opts + extra).encode()) == 0:
            return
    err = ctypes.get_errno()
    raise OSError(err, f"overlay mount failed: {os.strerror(err)}")


def _mkfs_tool() -> str | None:
    for name in ("mkfs.ext4", "mke2fs"):
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if found:
            return found
    return None


def _template_image(root: Path, size_mb: int) -> Path:
    """A formatted, never-mounted ext4 image of `size_mb` MiB under `root`/.images, made once
    (mkfs, a few ms) and copied sparsely for every workspace of that size."""
    img = root / ".images" / f"ext4-{size_mb}m-v{_IMAGE_VERSION}.img"
    # The launcher mounts what it copies from here: only from a root and a cache that no one else can write.
    _check_private(root)
    if img.is_file() and _check_private(img.parent) and _check_private(img).st_size == size_mb * 2**20:
        return img
    tool = _mkfs_tool()
    if tool is None:
        raise OSError(errno.ENOENT, "mkfs.ext4 not found (install e2fsprogs)")
    with _image_lock:
        img.parent.mkdir(mode=0o700, exist_ok=True)
        _check_private(img.parent)
        if img.is_file() and _check_private(img).st_size == size_mb * 2**20:
            return img
        tmp = img.with_name(f".{img.name}.{os.getpid()}.tmp")  # other processes: their own name, then rename
        try:
            with open(tmp, "wb") as fh:
                fh.truncate(size_mb * 2**20)
            # No journal (a workspace does not outlive a crash), no reserved blocks, no resize inode:
            # ~97% of the image is usable; 4 KiB blocks at every size; ~150 KiB of it is ever written.
            args = [tool, "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0",
                    "-N", str(max(size_mb * _INODES_PER_MB, 1024)), "-O", "^has_journal,^resize_inode", str(tmp)]
            res = subprocess.run(args, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise OSError(errno.EIO, f"mkfs.ext4 failed: {' '.join((res.stderr or res.stdout).split())}")
            os.replace(tmp, img)
        finally:
            tmp.unlink(missing_ok=True)
    return img


def _check_private(path: Path) -> os.stat_result:
    """`path`'s lstat, or OSError where it is a symlink, or someone else's, or writable by others."""
    st = os.lstat(path)
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & 0o1000
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid() or (st.st_mode & 0o022 and not sticky_dir):
        raise OSError(errno.EPERM, f"{path} is a symlink, not owned by this user, or writable by others: "
                      "refusing to mount a disk image from there")
    return st


def _sparse_copy(src: Path, dst: Path) -> None:
    """Copy `src` to a new file `dst`, only its data extents (the holes stay holes)."""
    size = src.stat().st_size
    with open(src, "rb") as s, open(dst, "xb") as d:
        d.truncate(size)
        off = 0
        while off < size:
            try:
                start = os.lseek(s.fileno(), off, os.SEEK_DATA)
            except OSError as e:
                if e.errno == errno.ENXIO:  # only a hole is left
                    break
                raise
            end = os.lseek(s.fileno(), start, os.SEEK_HOLE)
            pos = start
            while pos < end:
                n = os.copy_file_range(s.fileno(), d.fileno(), end - pos, pos, pos)
                if n == 0:
                    raise OSError(errno.EIO, f"short copy of {src}")
                pos += n
            off = end


def _attach_loop(image: Path) -> tuple[int, str]:
    """Attach `image` to a free loop device, autoclear (it detaches itself when its last user,
    the mount, goes) and direct I/O (no second copy in the host's page cache, where the kernel
    can). Returns an open descriptor of the device (close it once mounted) and its path."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    img = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        # struct loop_config { u32 fd, block_size; struct loop_info64 info; u64 reserved[8]; }
        config = struct.pack("=II5Q4I64s64s32s2Q8Q", img, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                             _LO_FLAGS_AUTOCLEAR | _LO_FLAGS_DIRECT_IO, str(image).encode()[:63], b"", b"",
                             0, 0, *[0] * 8)
        for _ in range(64):
            n = fcntl.ioctl(ctl, _LOOP_CTL_GET_FREE)
            dev = f"/dev/loop{n}"
            fd = os.open(dev, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(fd, _LOOP_CONFIGURE, config)
            except OSError as e:
                os.close(fd)
                if e.errno == errno.EBUSY:  # another thread or process took it first
                    continue
                raise
            return fd, dev
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(img)
        os.close(ctl)


def _mount_disk_image(root: Path, image: Path, target: Path, size_mb: int) -> None:
    """Mount a fresh ext4 filesystem of `size_mb` MiB, held in the sparse file `image`, at `target`.
    Raises OSError saying why where that is impossible here."""
    if sys.platform != "linux":
        raise OSError(errno.ENOSYS, "loop-mounting a disk image needs Linux")
    if os.geteuid() != 0:
        raise OSError(errno.EPERM, "loop-mounting a disk image needs a root launcher")
    mem = _memory_fs(root)
    if mem:
        raise OSError(errno.EINVAL, f"the workspace root {root} is on {mem} (memory), not disk; "
                      "point ETUDE_WORKSPACES at a directory on disk")
    _sparse_copy(_template_image(root, size_mb), image)
    try:
        fd, dev = _attach_loop(image)
    except OSError as e:
        raise OSError(e.errno, f"cannot attach a loop device: {_why(e)}") from e
    try:
        if _libc.mount(dev.encode(), str(target).encode(), b"ext4", _MS_NOSUID | _MS_NODEV, b"") != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mounting {dev} failed: {os.strerror(err)}")
    finally:
        os.close(fd)  # the mount holds the device now; without one, this detaches it


def _why(e: OSError) -> str:
    return f"{e.strerror or e}: {e.filename}" if e.filename else str(e.strerror or e)


def _warn_no_quota(why: str) -> None:
    if not _quota_warned.is_set():
        _quota_warned.set()
        print(f"etude: WARNING: workspaces have NO disk cap here ({why}): one workspace can fill the "
              f"host's disk ({ALLOW_UNCAPPED_ENV} / allow_uncapped asked for this)", file=sys.stderr)


def _disk_layer(base: Path, root: Path, disk_mb: int | None, allow_uncapped: bool) -> tuple[Path, int | None]:
    """The directory that holds the workspace's writable layer, and the cap actually in force."""
    disk = base / "disk"
    disk.mkdir()
    if disk_mb is None:
        return disk, None
    try:
        _mount_disk_image(root, base / "disk.img", disk, disk_mb)
    except OSError as e:
        (base / "disk.img").unlink(missing_ok=True)
        why = _why(e)
        if allow_uncapped or os.environ.get(ALLOW_UNCAPPED_ENV, "") not in ("", "0"):
            _warn_no_quota(why)
            return disk, None
        raise EtudeError(f"cannot cap the workspace's disk at {disk_mb} MiB: {why}; to run uncapped, pass "
                         f"disk_mb=None (SandboxConfig.workspace_disk_mb=None) or set {ALLOW_UNCAPPED_ENV}=1") from None
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
               disk_mb: int | None = DEFAULT_DISK_MB, allow_uncapped: bool = False) -> Workspace:
        """A fresh workspace from `template` (a directory), its writable layer an ext4 image of
        `disk_mb` MiB on disk (None: no cap). Raises EtudeError on bad input, and where the cap
        cannot be set up here, unless `allow_uncapped` (or $ETUDE_ALLOW_UNCAPPED_DISK=1): then
        the workspace runs uncapped (`disk_mb` None) with a warning on stderr."""
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
            disk, cap = _disk_layer(base, root, disk_mb, allow_uncapped)
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
    # `disk` holds the writable layer (a size-capped ext4 image unless uncapped); the overlay's merged
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
        if child.name == "lost+found":  # ext4's own
            continue
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
    for mnt in (base / "merged", base / "disk"):  # the overlay first: its upper lives on the disk image
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
