"""Split a source file into search units: functions, classes and methods, else line windows.

Python files are parsed with tree-sitter. Each top-level function is one chunk; each class is
one chunk (its header, docstring and class-level statements, plus the names of its methods)
and each of its methods is another (`Class.method`, nested classes recurse as
`Outer.Inner.method`). Module-level code between definitions (imports, constants, scripts) is
cut into line windows of kind "module". Functions nested inside functions stay part of their
parent: an agent navigates to the outer function anyway.

Other files, and Python files that tree-sitter reports a syntax error in, are cut into
overlapping line windows (kind "window"). I don't try to salvage the valid part of a file with a
syntax error: a half-edited file is a rare, short-lived state, and windows still find it.

Guarantees: line spans are 1-based and inclusive, every chunk has at least one non-blank line,
and the chunker never raises on any bytes (undecodable bytes are replaced).
Does not: understand languages other than Python syntactically.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

WINDOW_LINES = 40  # lines per window for non-Python files and module-level code
WINDOW_OVERLAP = 10  # lines two consecutive windows share, so a match at a boundary is whole in one


@dataclass(frozen=True)
class Chunk:
    """One unit of the index. `text` is the source the embedding and the lexical score see."""

    path: str  # relative to the repository root, '/'-separated
    start_line: int  # 1-based, inclusive
    end_line: int  # 1-based, inclusive
    symbol: str  # qualified name ("Class.method"); "" for windows
    kind: str  # "function" | "class" | "method" | "module" | "window"
    text: str


@lru_cache(maxsize=1)
def _parser() -> Any:
    # I build the parser once per process: loading the grammar is the slow part.
    import tree_sitter_python as tsp
    from tree_sitter import Language, Parser

    return Parser(Language(tsp.language()))


def chunk_file(path: str, data: bytes) -> list[Chunk]:
    """The chunks of one file (`path` is only recorded, never opened)."""
    text = data.decode("utf-8", errors="replace")
    lines = text.split("\n")
    if path.endswith((".py", ".pyi")):
        tree = _parser().parse(data)
        if not tree.root_node.has_error:
            return _python_chunks(path, tree.root_node, lines)
    return window_chunks(path, lines, 1, len(lines), kind="window")


def window_chunks(path: str, lines: list[str], first: int, last: int, *, kind: str) -> list[Chunk]:
    """Overlapping windows over lines first..last (1-based, inclusive); blank windows dropped."""
    out: list[Chunk] = []
    step = WINDOW_LINES - WINDOW_OVERLAP
    start = first
    while start <= last:
        end = min(start + WINDOW_LINES - 1, last)
        span = _trim(lines, start, end)
        if span is not None:
            s, e = span
            out.append(Chunk(path, s, e, "", kind, "\n".join(lines[s - 1 : e])))
        if end == last:
            break
        start += step
    return out


def _trim(lines: list[str], start: int, end: int) -> tuple[int, int] | None:
    """The span without leading and trailing blank lines; None if it is all blank."""
    while start <= end and not lines[start - 1].strip():
        start += 1
    while end >= start and not lines[end - 1].strip():
        end -= 1
    return (start, end) if start <= end else None


def _definition(node: Any) -> Any | None:
    """The function/class node behind `node` (unwrapping decorators), or None."""
    if node.type == "decorated_definition":
        node = node.child_by_field_name("definition")
    if node is not None and node.type in ("function_definition", "class_definition"):
        return node
    return None


def _name(node: Any) -> str:
    ident = node.child_by_field_name("name")
    return ident.text.decode("utf-8", errors="replace") if ident is not None else "?"


def _python_chunks(path: str, root: Any, lines: list[str]) -> list[Chunk]:
    out: list[Chunk] = []
    covered_until = 0  # last line (1-based) that belongs to a definition
    for child in root.named_children:
        defn = _definition(child)
        if defn is None:
            continue
        start, end = child.start_point[0] + 1, child.end_point[0] + 1
        out.extend(window_chunks(path, lines, covered_until + 1, start - 1, kind="module"))
        out.extend(_definition_chunks(path, child, defn, lines, prefix=""))
        covered_until = end
    out.extend(window_chunks(path, lines, covered_until + 1, len(lines), kind="module"))
    return out


def _definition_chunks(path: str, outer: Any, defn: Any, lines: list[str], *, prefix: str) -> list[Chunk]:
    """Chunks for one definition: itself, and for a class, its methods and nested classes."""
    qual = prefix + _name(defn)
    start, end = outer.start_point[0] + 1, outer.end_point[0] + 1
    if defn.type == "function_definition":
        kind = "method" if prefix else "function"
        return [Chunk(path, start, end, qual, kind, "\n".join(lines[start - 1 : end]))]
    members = _class_members(defn)
    head_end = members[0][0].start_point[0] if members else end  # lines before the first member
    names = [_name(d) for _, d in members]
    head = "\n".join(lines[start - 1 : max(head_end, start)])
    if names:
        head += "\nmembers: " + ", ".join(names)
    out = [Chunk(path, start, end, qual, "class", head)]
    for node, member in members:
        out.extend(_definition_chunks(path, node, member, lines, prefix=qual + "."))
    return out


def _class_members(cls: Any) -> list[tuple[Any, Any]]:
    """(outer node, definition) of each method and nested class directly in the class body."""
    body = cls.child_by_field_name("body")
    if body is None:
        return []
    found = []
    for stmt in body.named_children:
        defn = _definition(stmt)
        if defn is not None:
            found.append((stmt, defn))
    return found
