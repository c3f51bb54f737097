"""Unified, `git apply`-able patches between a template tree and a workspace tree.

Covers new, modified and deleted regular files and symlinks, mode changes (executable bit) and
binary files (as git "literal" binary patches with full index lines, which `git apply` accepts).
Ignores `.git`, `__pycache__`, `.pytest_cache`, `*.pyc` (and `*.pyo`). Paths are relative, with
`a/` and `b/` prefixes; unusual names are C-quoted the way git does.
Does not: detect renames or copies (a rename is a delete plus an add), or diff directories that
contain no files (git does not track them either).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import os
import stat
import zlib
from collections.abc import Iterable
from pathlib import Path

IGNORED_DIRS = frozenset({".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
_ZERO = "0" * 40


def ignored(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in IGNORED_DIRS for p in parts) or rel.endswith(IGNORED_SUFFIXES)


def walk_files(root: Path, sub: str = "") -> Iterable[str]:
    """Relative paths of every non-directory entry under root/sub (symlinks not followed)."""
    base = root / sub if sub else root
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in dirnames:
            full = os.path.join(dirpath, d)
            if d in IGNORED_DIRS:
                continue
            if os.path.islink(full):
                filenames.append(d)  # a symlink to a directory is a file for git
            else:
                keep.append(d)
        dirnames[:] = keep
        for f in filenames:
            rel = f"{rel_dir}/{f}" if rel_dir else f
            if not ignored(rel):
                yield rel


class TooLarge(Exception):
    pass


def _entry(root: Path, rel: str, max_bytes: int) -> tuple[str, bytes] | None:
    """(git mode, content) of root/rel; None when absent, a directory, a fifo or a device."""
    p = root / rel
    try:
        st = p.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "120000", os.readlink(p).encode()
    if not stat.S_ISREG(st.st_mode):
        return None
    if st.st_size > max_bytes:
        raise TooLarge(rel)
    return ("100755" if st.st_mode & 0o111 else "100644"), p.read_bytes()


def _blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_binary(data: bytes) -> bool:
    if b"\0" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def quote_path(path: str) -> str:
    """git's C-style quoting for names with quotes, backslashes, control or non-ASCII bytes."""
    raw = path.encode("utf-8", "surrogateescape")
    if not any(b < 0x20 or b >= 0x7F or b in (0x22, 0x5C) for b in raw):
        return path
    esc = {0x22: '\\"', 0x5C: "\\\\", 0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
    out = "".join(esc.get(b) or (chr(b) if 0x20 <= b < 0x7F else f"\\{b:03o}") for b in raw)
    return f'"{out}"'


def _name(prefix: str, rel: str) -> str:
    return quote_path(prefix + rel)


def _lines(data: bytes) -> list[str]:
    parts = data.decode("utf-8").split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _text_hunks(old: bytes, new: bytes) -> str:
    a, b = _lines(old), _lines(new)
    out = []
    for line in list(difflib.unified_diff(a, b, n=3))[2:]:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def _binary_literal(data: bytes) -> str:
    """git's "literal" binary hunk: zlib-deflated, base85 in lines of up to 52 input bytes."""
    z = zlib.compress(data, 9)
    out = [f"literal {len(data)}\n"]
    for i in range(0, len(z), 52):
        chunk = z[i : i + 52]
        n = len(chunk)
        lenchar = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)
        pad = chunk + b"\0" * (-n % 4)
        out.append(lenchar + base64.b85encode(pad).decode() + "\n")
    return "".join(out) + "\n"


def file_patch(rel: str, old: tuple[str, bytes] | None, new: tuple[str, bytes] | None) -> str:
    """The patch for one path; "" when unchanged."""
    if old == new:
        return ""
    if old and new and old[0] != new[0] and "120000" in (old[0], new[0]):
        return file_patch(rel, old, None) + file_patch(rel, None, new)  # type change: delete + add
    a, b = _name("a/", rel), _name("b/", rel)
    head = [f"diff --git {a} {b}\n"]
    old_id = _blob_id(old[1]) if old else _ZERO
    new_id = _blob_id(new[1]) if new else _ZERO
    if old is None:
        head.append(f"new file mode {new[0]}\n")  # type: ignore[index]
    elif new is None:
        head.append(f"deleted file mode {old[0]}\n")
    elif old[0] != new[0]:
        head += [f"old mode {old[0]}\n", f"new mode {new[0]}\n"]
    same_mode = old is not None and new is not None and old[0] == new[0]
    ob, nb = (old[1] if old else b""), (new[1] if new else b"")
    if ob == nb:
        return "".join(head)  # mode change only (or empty file added/removed)
    head.append(f"index {old_id}..{new_id}" + (f" {old[0]}\n" if same_mode else "\n"))  # type: ignore[index]
    if _is_binary(ob) or _is_binary(nb):
        return "".join(head) + "GIT binary patch\n" + _binary_literal(nb) + _binary_literal(ob)
    head.append(f"--- {a if old else '/dev/null'}\n+++ {b if new else '/dev/null'}\n")
    return "".join(head) + _text_hunks(ob, nb)


def tree_diff(
    template: Path, work: Path, candidates: Iterable[str] | None = None, max_file_bytes: int = 16 << 20
) -> str:
    """Patch turning `template` into `work`. `candidates` limits the paths compared (overlay).

    Files over `max_file_bytes` are left out and named in `# etude: skipped` lines at the top
    (git apply ignores text before the first `diff --git`)."""
    if candidates is None:
        paths = set(walk_files(template)) | set(walk_files(work))
    else:
        paths = {p for p in candidates if not ignored(p)}
    parts, skipped = [], []
    for rel in sorted(paths):
        try:
            parts.append(file_patch(rel, _entry(template, rel, max_file_bytes), _entry(work, rel, max_file_bytes)))
        except TooLarge:
            skipped.append(f"# etude: skipped file larger than {max_file_bytes} bytes: {quote_path(rel)}\n")
    return "".join(skipped + parts)
