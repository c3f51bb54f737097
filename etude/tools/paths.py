"""Every path a tool touches is resolved here, inside the workspace, or refused.

Rules:
- relative paths are relative to the workspace root;
- absolute paths are accepted when they are inside the workspace (host path) or written as
  `/workspace/...` (the path the sandbox shows, so what a command prints can be used as is);
- `..` that leaves the root is refused, even if the path would come back in;
- symlinks are resolved at every component, and a path whose real location is outside the
  root is refused;
- reads and writes re-check the opened file descriptor's real path (`/proc/self/fd`) and open
  the final component with O_NOFOLLOW, so a symlink swapped in after the check is caught.

Not guaranteed: a process racing to swap an *intermediate* directory for a symlink between the
check and `open` could make an O_CREAT create an empty file outside before the re-check refuses
the write. Commands the agent runs are confined by the sandbox; this module only keeps the
tools (which run on the host) from being steered outside.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from etude.tools.base import ToolError, os_error, shown

WORKSPACE_MOUNT = "/workspace"


def workspace_root(workspace: os.PathLike[str] | str) -> Path:
    """The real path of the workspace root (a symlinked workspace is fine)."""
    root = Path(os.path.realpath(os.fspath(workspace)))
    if not root.is_dir():
        raise ToolError(f"workspace {workspace} is not a directory", kind="bad_workspace")
    return root


def inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def _relative_part(path: str, root: Path, workspace: os.PathLike[str] | str) -> str:
    """The part of `path` below the root, still unnormalised; refuses absolute paths outside."""
    if not os.path.isabs(path):
        return path
    if path == WORKSPACE_MOUNT or path.startswith(WORKSPACE_MOUNT + "/"):
        return path[len(WORKSPACE_MOUNT) :].lstrip("/")
    norm = os.path.normpath(path)
    for base in (str(root), os.path.normpath(os.path.abspath(os.fspath(workspace)))):
        if inside(norm, base):
            return os.path.relpath(norm, base)
    raise ToolError(
        f"path {path!r} is outside the workspace; use a path relative to the workspace root",
        kind="path_outside",
    )


def resolve(workspace: os.PathLike[str] | str, path: object) -> Path:
    """The real host path for `path`, guaranteed (at this moment) to be inside the workspace."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("path is empty; give a path relative to the workspace root", kind="bad_path")
    if "\x00" in path:
        raise ToolError("path contains a NUL byte", kind="bad_path")
    if path.startswith("~"):
        raise ToolError(f"path {path!r} uses '~'; give a path relative to the workspace root", kind="path_outside")
    root = workspace_root(workspace)
    rel = os.path.normpath(_relative_part(path, root, workspace) or ".")
    if rel == ".." or rel.startswith("../"):
        raise ToolError(f"path {path!r} uses '..' to leave the workspace", kind="path_outside")
    real = os.path.realpath(root / rel)
    if not inside(real, str(root)):
        raise ToolError(f"path {path!r} goes through a symlink that leaves the workspace", kind="path_outside")
    return Path(real)


def _check_fd(fd: int, root: Path, shown_path: str) -> None:
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return  # no /proc (not Linux): the resolve() check is all we have
    if not inside(real, str(root)):
        raise ToolError(f"path {shown_path!r} changed to point outside the workspace", kind="path_outside")


def _check_regular(fd: int, shown_path: str) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise ToolError(f"{shown_path} is not a regular file (a FIFO, socket or device)", kind="not_a_file")


def read_bytes(root: Path, real: Path, max_bytes: int) -> bytes:
    """Read a regular file that `resolve` returned; refuses directories and files over `max_bytes`."""
    name = shown(root, real)
    if real.is_dir():
        raise ToolError(f"{name} is a directory; use list_dir to see its contents", kind="is_directory")
    try:
        # O_NONBLOCK: a FIFO the agent made with mkfifo must not hang the tool (it is refused below).
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ToolError(f"file not found: {name} (use glob or list_dir to find files)", kind="not_found") from None
    except OSError as e:
        raise os_error(e, name) from None
    with os.fdopen(fd, "rb") as f:
        _check_fd(fd, root, name)
        _check_regular(fd, name)
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise ToolError(f"{name} is {size} bytes, over the {max_bytes}-byte limit", kind="too_large", bytes=size)
        return f.read(max_bytes + 1)


def write_bytes(root: Path, real: Path, data: bytes) -> bool:
    """Write (create or replace) a file that `resolve` returned, making parent directories.

    Returns True when the file was created. I open without O_TRUNC and truncate only after the
    descriptor is checked, so a refused write leaves the old contents alone."""
    name = shown(root, real)
    if real.is_dir():
        raise ToolError(f"{name} is a directory; give a file path", kind="is_directory")
    created = not real.exists()
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(real, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise os_error(e, name) from None
    with os.fdopen(fd, "wb") as f:
        _check_fd(fd, root, name)
        _check_regular(fd, name)
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        f.write(data)
    return created
