"""Unified diffs between trees, split into files and hunks, and applied with `git apply`.

Every patch we write uses a/ b/ prefixes and /dev/null for added or removed files, so it is
`git apply`- and `patch -p1`-able. Parsing is of the diffs we and `git diff` write (text files
only); a binary diff is kept whole as one file entry and never split.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def _read(path: Path) -> list[str] | None:
    if not path.is_file():
        return None
    return path.read_text(encoding="utf-8", errors="surrogateescape").splitlines(keepends=True)


def _fix_eol(lines: list[str]) -> list[str]:
    # difflib leaves the last line without "\n" if the file lacks one; git expects the marker.
    out = []
    for line in lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return out


def file_diff(rel: str, old: list[str] | None, new: list[str] | None, context: int = 3) -> str:
    """Unified diff of one file; '' when equal. `None` means the file is absent on that side."""
    if old == new:
        return ""
    a = f"a/{rel}" if old is not None else "/dev/null"
    b = f"b/{rel}" if new is not None else "/dev/null"
    body = list(difflib.unified_diff(old or [], new or [], a, b, n=context))
    if not body:
        return ""
    header = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        header += "new file mode 100644\n"
    elif new is None:
        header += "deleted file mode 100644\n"
    return header + "".join(body[:2]) + "".join(_fix_eol(body[2:]))


def tree_diff(old_root: Path, new_root: Path, files: Iterable[str], context: int = 3) -> str:
    """Diff of the given relative paths between two trees (files may be missing on either side)."""
    return "".join(file_diff(rel, _read(old_root / rel), _read(new_root / rel), context) for rel in sorted(set(files)))


@dataclass(frozen=True)
class FilePatch:
    path: str  # the b/ path (a/ for deletions)
    header: str  # "diff --git" line through "+++"
    hunks: tuple[str, ...]  # each "@@ ..." block with its lines

    @property
    def text(self) -> str:
        return self.header + "".join(self.hunks)


def split_files(patch: str) -> list[FilePatch]:
    """Split a unified diff into per-file patches, each with its hunks."""
    files: list[FilePatch] = []
    chunks = re.split(r"(?m)^(?=diff --git )", patch)
    for chunk in chunks:
        if not chunk.strip():
            continue
        lines = chunk.splitlines(keepends=True)
        header: list[str] = []
        hunks: list[list[str]] = []
        for line in lines:
            if line.startswith("@@"):
                hunks.append([line])
            elif hunks:
                hunks[-1].append(line)
            else:
                header.append(line)
        files.append(FilePatch(_path_of(header), "".join(header), tuple("".join(h) for h in hunks)))
    return files


def _path_of(header: list[str]) -> str:
    plus = next((h[6:].strip() for h in header if h.startswith("+++ b/")), None)
    if plus:
        return plus
    minus = next((h[6:].strip() for h in header if h.startswith("--- a/")), None)
    if minus:
        return minus
    m = re.match(r"diff --git a/(\S+) b/(\S+)", header[0]) if header else None
    return m.group(2) if m else ""


def join(files: Iterable[FilePatch]) -> str:
    return "".join(f.text for f in files)


def subset(files: list[FilePatch], picks: Iterable[tuple[int, int]]) -> str:
    """A patch of chosen hunks, `picks` = (file index, hunk index). Hunks of one file are kept in
    order; the +line numbers of later hunks are shifted so `git apply` accepts the subset."""
    chosen: dict[int, list[int]] = {}
    for fi, hi in picks:
        chosen.setdefault(fi, []).append(hi)
    out = []
    for fi in sorted(chosen):
        fp = files[fi]
        shift = 0
        kept = []
        for hi, hunk in enumerate(fp.hunks):
            old_n, new_n = _hunk_sizes(hunk)
            if hi in chosen[fi]:
                kept.append(_reshift(hunk, shift))
            else:
                shift -= new_n - old_n  # this hunk's growth is not applied
        out.append(fp.header + "".join(kept))
    return "".join(out)


def _hunk_sizes(hunk: str) -> tuple[int, int]:
    m = _HUNK.match(hunk)
    if not m:
        return 0, 0
    return int(m.group(2) if m.group(2) is not None else 1), int(m.group(4) if m.group(4) is not None else 1)


def _reshift(hunk: str, shift: int) -> str:
    m = _HUNK.match(hunk)
    if not m or shift == 0:
        return hunk
    new_start = int(m.group(3)) + shift
    old_part = f"-{m.group(1)}" + (f",{m.group(2)}" if m.group(2) is not None else "")
    new_part = f"+{new_start}" + (f",{m.group(4)}" if m.group(4) is not None else "")
    return f"@@ {old_part} {new_part} @@" + hunk[m.end() :]


def changed_paths(patch: str) -> list[str]:
    return [f.path for f in split_files(patch)]


def diff_hash(patch: str) -> str:
    """Hash of a patch's changed lines only, so equal edits dedupe whatever their context."""
    lines = [ln for ln in patch.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    paths = changed_paths(patch)
    return hashlib.sha256(("\n".join(paths) + "\0" + "\n".join(lines)).encode()).hexdigest()[:16]


def apply_patch(root: Path, patch: str, *, reverse: bool = False, check: bool = True) -> tuple[bool, str]:
    """Apply a patch to the tree at `root` with `git apply`. Returns (ok, message). With
    `check`, a failure raises EtudeError instead."""
    if not patch.strip():
        return True, ""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.resolve().parent))
    argv = ["git", "apply", "--whitespace=nowarn", "--recount"]
    if reverse:
        argv.append("-R")
    # NOTE: outside a repository git apply works relative to cwd; the ceiling keeps it from
    # discovering an enclosing repository (which would make paths relative to that one).
    proc = subprocess.run(argv, cwd=root, input=patch.encode("utf-8", "surrogateescape"), capture_output=True, env=env)
    ok = proc.returncode == 0
    msg = proc.stderr.decode("utf-8", "replace").strip()
    if not ok and check:
        raise EtudeError(f"patch does not apply: {msg.splitlines()[0] if msg else 'git apply failed'}")
    return ok, msg
