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

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from etude.tools.base import ToolError
from etude.tools.paths import resolve
from etude.types import ToolCall, ToolResult

WRITING_TOOLS = frozenset({"edit_file", "write_file"})

# a pytest node id: a .py path, then one or more ::parts (a class, a function, a [param])
_NODE_ID = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.py(?:::[\w.-]+(?:\[[^\]\s`'\"]*\])?)+)")


def named_tests(request: str) -> tuple[str, ...]:
    """The pytest node ids named in `request`, first mention first."""
    return tuple(dict.fromkeys(m.group(1) for m in _NODE_ID.finditer(request)))


def written_paths(calls: Iterable[ToolCall]) -> list[str]:
    """The `path` arguments of the calls that change files."""
    return [str(c.arguments.get("path")) for c in calls
            if c.name in WRITING_TOOLS and isinstance(c.arguments.get("path"), str)]


class Snapshot:
    """Files' bytes (None: the file did not exist), keyed by their real path in the workspace."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        self.files: dict[Path, bytes | None] = {}

    def add(self, paths: Iterable[str]) -> None:
        """Remember the current bytes of each path not remembered yet (a path the tools would
        refuse is skipped: its call fails and changes nothing)."""
        for p in paths:
            try:
                real = Path(resolve(self.workspace, p))
            except (ToolError, OSError, ValueError):
                continue
            if real not in self.files:
                self.files[real] = real.read_bytes() if real.is_file() else None

    def current(self) -> dict[Path, bytes | None]:
        """The remembered files as they are now."""
        return {p: (p.read_bytes() if p.is_file() else None) for p in self.files}

    def drop_bytecode(self) -> None:
        """Remove the cached bytecode of the remembered .py files. Python trusts a .pyc whose
        recorded source mtime (whole seconds) and size match: an undone edit and the next attempt,
        written within one second and of the same size (`<` for `>`), would otherwise run the
        rejected attempt's code."""
        for p in self.files:
            if p.suffix == ".py":
                for pyc in (p.parent / "__pycache__").glob(f"{p.stem}.*.pyc"):
                    pyc.unlink(missing_ok=True)

    def restore(self, state: dict[Path, bytes | None] | None = None) -> None:
        """Put every remembered file back as it was (or as `state` has it)."""
        for p, before in self.files.items():
            data = state[p] if state is not None and p in state else before
            if data is None:
                p.unlink(missing_ok=True)
            else:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)


def passed(result: ToolResult) -> bool:
    return bool(result.ok and result.meta.get("exit_code") == 0)


def tail(text: str, chars: int = 600) -> str:
    return text if len(text) <= chars else "…" + text[-chars:]


def attempt_record(reply: str, outcome: str, output: str = "") -> dict[str, Any]:
    """One attempt of a verified turn as `meta.verified_edits` keeps it. `outcome`: "passed",
    "failed" (its tests still fail), "not an edit" (the reply was not a verifiable edit turn),
    "not applied" (its edits failed; nothing changed)."""
    return {"reply": reply[:2000], "outcome": outcome, "output": tail(output)}
