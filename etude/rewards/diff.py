"""A small unified-diff parser: enough for reward-hack detectors to look at what a patch adds.

It reads `git diff` / `diff -u` output (with or without `diff --git` headers, `a/`/`b/` prefixes,
new and deleted files, renames, `\\ No newline at end of file`). It does not validate that the
hunks apply, and binary patches are reported as files with no hunks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT = re.compile(r"^diff --git (?:a/)?(\S+) (?:b/)?(\S+)")


@dataclass
class Hunk:
    """One hunk. `lines` keeps the diff markers: (" " | "+" | "-", text, new-side line number or 0)."""

    old_start: int
    new_start: int
    lines: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def added(self) -> list[tuple[int, str]]:
        return [(n, t) for m, t, n in self.lines if m == "+"]

    @property
    def removed(self) -> list[str]:
        return [t for m, t, _ in self.lines if m == "-"]

    def new_side(self) -> list[tuple[int, str, bool]]:
        """The hunk as it reads after the patch: (line number, text, is_added)."""
        return [(n, t, m == "+") for m, t, n in self.lines if m != "-"]


@dataclass
class FileDiff:
    old_path: str | None  # None: the file is new
    new_path: str | None  # None: the file is deleted
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    @property
    def paths(self) -> set[str]:
        return {p for p in (self.old_path, self.new_path) if p}

    @property
    def added_lines(self) -> list[tuple[int, str]]:
        return [a for h in self.hunks for a in h.added]

    @property
    def removed_lines(self) -> list[str]:
        return [r for h in self.hunks for r in h.removed]


def _strip(path: str) -> str | None:
    path = path.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    for prefix in ("a/", "b/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def parse_diff(text: str) -> list[FileDiff]:
    """Every file the patch touches, in order. Text before the first header is ignored."""
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    hunk: Hunk | None = None
    old_left = new_left = new_no = 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if hunk is not None and (old_left > 0 or new_left > 0):
            # NOTE: inside a hunk the counts decide, so a removed line "-- x" is never a header.
            if line.startswith("\\"):
                continue
            mark, body = (line[:1] or " "), line[1:]
            if mark not in " +-":
                hunk = None
            else:
                hunk.lines.append((mark, body, new_no if mark != "-" else 0))
                old_left -= mark != "+"
                new_left -= mark != "-"
                new_no += mark != "-"
                continue
        if m := _GIT.match(line):
            cur = FileDiff(_strip("a/" + m.group(1)), _strip("b/" + m.group(2)))
            files.append(cur)
            hunk = None
        elif line.startswith("--- ") and i < len(lines) and lines[i].startswith("+++ "):
            old, new = _strip(line[4:]), _strip(lines[i][4:])
            if cur is None or cur.hunks:
                cur = FileDiff(old, new)
                files.append(cur)
            else:
                cur.old_path, cur.new_path = old, new
            hunk = None
            i += 1
        elif cur is not None and line.startswith("new file mode"):
            cur.old_path = None
        elif cur is not None and line.startswith("deleted file mode"):
            cur.new_path = None
        elif cur is not None and (m := _HUNK.match(line)):
            hunk = Hunk(int(m.group(1)), int(m.group(3)))
            cur.hunks.append(hunk)
            old_left = int(m.group(2) if m.group(2) is not None else 1)
            new_left = int(m.group(4) if m.group(4) is not None else 1)
            new_no = hunk.new_start
    return files
