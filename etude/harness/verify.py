"""Verified edits (HarnessConfig.verify_edits): the pieces the agent loop uses to check an edit
turn against the failing tests a request names, and to put the files back when they still fail.

- `named_tests(request)`: the pytest node ids written in the request ("The test
  `tests/test_x.py::test_y` fails ..."), in order, without repeats. A request that names none gets
  no verification: the harness never guesses which test matters.
- `Snapshot`: the bytes of the files a turn's edits and writes name, taken before the turn, so a
  rejected attempt can be undone exactly (a file the attempt created is removed again).
- `Snapshot.drop_bytecode()`: before each check, so a stale .pyc never answers for new source;
- `passed(result)`: whether the verify command's run exited 0.

What this does not do: undo a command's side effects. A turn holding anything but edits, writes
and read-only calls is never verified (etude.harness.loop checks that before it runs the turn).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from etude.tools.base import ToolError, shown
from etude.tools.paths import WORKSPACE_MOUNT, inside, read_bytes, resolve, workspace_root, write_bytes
from etude.types import ToolCall, ToolResult

WRITING_TOOLS = frozenset({"edit_file", "write_file"})
MAX_SNAPSHOT_BYTES = 50_000_000  # a file larger than this is not one an edit turn wrote

# a pytest node id: a .py path, then one or more ::parts (a class, a function, a [param])
_NODE_ID = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.py(?:::[\w.-]+(?:\[[^\]\s`'\"]*\])?)+)")


def named_tests(request: str) -> tuple[str, ...]:
    """The pytest node ids named in `request`, first mention first."""
    return tuple(dict.fromkeys(m.group(1) for m in _NODE_ID.finditer(request)))


def check_targets(ids: Sequence[str], scope: str) -> tuple[str, ...]:
    """What a check runs: the named ids ("tests") or the files that hold them ("files")."""
    if scope == "tests":
        return tuple(ids)
    return tuple(dict.fromkeys(i.split("::", 1)[0] for i in ids))


def written_paths(calls: Iterable[ToolCall]) -> list[str]:
    """The `path` arguments of the calls that change files."""
    return [str(c.arguments.get("path")) for c in calls
            if c.name in WRITING_TOOLS and isinstance(c.arguments.get("path"), str)]


def touches_tests(paths: Iterable[str], ids: Sequence[str]) -> bool:
    """Whether any path is a file of the named tests or a conftest.py: an attempt that changes
    them could pass its check by weakening the test (and grading drops such changes)."""
    tests = {os.path.normpath(i.split("::", 1)[0]) for i in ids}
    for p in paths:
        rel = p[len(WORKSPACE_MOUNT):].lstrip("/") if p.startswith(WORKSPACE_MOUNT + "/") else p
        rel = os.path.normpath(rel)
        if rel in tests or PurePosixPath(rel).name == "conftest.py":
            return True
    return False


class Snapshot:
    """Files' bytes (None: the path did not exist), keyed by their real path in the workspace.
    Only regular files and absent paths are remembered (a folder named as a file path is the
    tool's error, not something to undo). Reads and writes go through etude.tools.paths, so a
    folder swapped for a symlink by the code a check ran is refused, never followed."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.root = workspace_root(workspace)
        self.files: dict[Path, bytes | None] = {}

    def add(self, paths: Iterable[str]) -> None:
        """Remember the current bytes of each path not remembered yet (a path the tools would
        refuse, or one that is not a regular file, is skipped: its call fails and changes nothing)."""
        for p in paths:
            try:
                real = resolve(self.workspace, p)
                if real in self.files:
                    continue
                if (data := self._regular_bytes(real)) is not None or not os.path.lexists(real):
                    self.files[real] = data
            except (ToolError, OSError, ValueError):
                continue

    def current(self) -> dict[Path, bytes | None]:
        """The remembered files as they are now (a path that is no longer a regular file reads
        as absent)."""
        out: dict[Path, bytes | None] = {}
        for p in self.files:
            try:
                out[p] = self._regular_bytes(p)
            except (ToolError, OSError):
                out[p] = None
        return out

    def _regular_bytes(self, real: Path) -> bytes | None:
        """The bytes of `real` when it is a regular file (not a symlink), else None."""
        return read_bytes(self.root, real, MAX_SNAPSHOT_BYTES) if real.is_file() and not real.is_symlink() else None

    def restore(self, state: dict[Path, bytes | None] | None = None) -> list[str]:
        """Put every remembered file back as it was (or as `state` has it), then drop their
        cached bytecode. -> the paths that could not be restored (left as they are)."""
        failed = []
        for p, before in self.files.items():
            data = state[p] if state is not None and p in state else before
            try:
                if data is None:
                    if os.path.lexists(p) and not p.is_dir() and inside(os.path.realpath(p.parent), str(self.root)):
                        p.unlink()
                else:
                    write_bytes(self.root, p, data)
            except (ToolError, OSError):
                failed.append(shown(self.root, p))
        self.drop_bytecode()
        return failed

    def drop_bytecode(self) -> None:
        """Remove the cached bytecode of the remembered .py files. Python trusts a .pyc whose
        recorded source mtime (whole seconds) and size match: an undone edit and the next attempt,
        written within one second and of the same size (`<` for `>`), would otherwise run the
        rejected attempt's code."""
        for p in self.files:
            cache = p.parent / "__pycache__"
            if p.suffix != ".py" or cache.is_symlink() or not inside(os.path.realpath(cache), str(self.root)):
                continue
            for pyc in cache.glob(f"{p.stem}.*.pyc"):
                with contextlib.suppress(OSError):
                    if not pyc.is_symlink():
                        pyc.unlink()


def passed(result: ToolResult) -> bool:
    return bool(result.ok and result.meta.get("exit_code") == 0)


def tail(text: str, chars: int = 600) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


def attempt_record(reply: str, outcome: str, output: str = "") -> dict[str, Any]:
    """One attempt of a verified turn as `meta.verified_edits` keeps it. `outcome`: "passed",
    "failed" (its tests still fail), "not an edit" (the reply was not a verifiable edit turn:
    a command, a parse error, no edit, or an edit of the named tests or a conftest.py), "not
    applied" (none of its edits applied; nothing changed), or why verification stopped."""
    return {"reply": reply[:2000], "outcome": outcome, "output": tail(output)}
