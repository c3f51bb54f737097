"""Adherence to the repository: does a patch look like one the codebase's maintainers would write?

The task's curated (gold) patch is the reference. Every measure is taken the same way on the
agent's patch and on the gold patch, from the files' contents before and after (never from the
diff text, whose context and hunk layout vary), and each component compares the two, so a patch
that makes the same change as the gold patch scores exactly 1.0 on every component:

    files       F1 of the files touched, against the gold patch's files
    size        min(a, g) / max(a, g) of changed lines (added + removed), a = agent, g = gold
    duplicates  1 / (1 + excess) where excess = new defs duplicating existing ones, beyond gold's;
                a duplicate is a new function/class whose body equals an existing one's after
                renaming local names (and dropping docstrings and annotations), or a new top-level
                function/class with the name and parameters of one in another module
    imports     1 / (1 + n), n = modules newly imported that nothing in the repository imports
                (and that are not the repository's own), beyond those the gold patch adds
    lint        1 / (1 + excess), excess = ruff warnings added in the touched .py files, beyond
                gold's (`ruff check --isolated --select E4,E7,E9,F` before vs after)
    format      1 - max(0, fa - fg), f = share of added lines in existing .py files that break
                the file's own style (indent character, indent unit of logical lines, dominant
                quote character, longest line length, trailing whitespace)

The combined score is the weighted mean of the components that apply (weights in
EvalConfig.adherence_weights). An empty patch has no adherence (None): there is nothing to judge.

What this does not guarantee: that a high score means a good patch (a wrong fix in the right file
scores well; correctness is measured apart), or that every duplicate is found (bodies that differ
by more than names are not matched). Style checks cover Python files only; new files are not
style-checked. ruff parses the files on the host (it never runs them).
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import tokenize
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.evals.models import patched_files
from etude.tasks.layout import iter_files

COMPONENTS = ("files", "size", "duplicates", "imports", "lint", "format")
_MIN_BODY_NODES = 12  # smaller bodies (a `return x`, a `pass`) are not worth calling duplicates
_MAX_EVIDENCE = 8

Contents = dict[str, str | None]  # path -> text (None: absent on that side)


@dataclass(frozen=True)
class PatchFacts:
    """What one patch does to the repository, measured on contents before and after."""

    files: tuple[str, ...]
    changed_lines: int
    duplicates: tuple[str, ...] = ()  # "path:qualname duplicates path:qualname (why)"
    new_imports: tuple[str, ...] = ()  # top-level modules new to the repository
    lint_added: int | None = None  # ruff warnings after - before; None when ruff is unavailable
    lint_codes: dict[str, int] = field(default_factory=dict)  # codes with more warnings after
    style_checked: int = 0  # added lines in existing .py files
    style_breaks: int = 0
    style_evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


# --- the repository at base ---------------------------------------------------------------------


@dataclass(frozen=True)
class Def:
    path: str
    qualname: str
    top_level: bool
    signature: tuple[str, ...] | None  # parameter names; None for classes
    body_key: str | None  # normalised body; None when too small to compare


@dataclass(frozen=True)
class RepoIndex:
    defs: tuple[Def, ...]
    imported: frozenset[str]  # top-level modules imported anywhere at base
    local: frozenset[str]  # names of the repository's own modules and packages


_INDEXES: dict[str, RepoIndex] = {}
_INDEX_LOCK = threading.Lock()


def repo_index(template: Path) -> RepoIndex:
    """Definitions and imports of every .py file of the template (cached per template)."""
    key = str(template.resolve())
    with _INDEX_LOCK:
        if key not in _INDEXES:
            _INDEXES[key] = _build_index(template)
        return _INDEXES[key]


def _build_index(template: Path) -> RepoIndex:
    defs: list[Def] = []
    imported: set[str] = set()
    local: set[str] = set()
    for rel in iter_files(template):
        if not rel.endswith(".py"):
            continue
        parts = Path(rel).with_suffix("").parts
        local.update(p for p in parts if p != "__init__")
        tree = _parse((template / rel).read_text(encoding="utf-8", errors="replace"))
        if tree is not None:
            defs += definitions(rel, tree)
            imported |= imports_of(tree)
    return RepoIndex(tuple(defs), frozenset(imported), frozenset(local))


def _parse(text: str | None) -> ast.Module | None:
    if text is None:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


# --- definitions and duplicates -----------------------------------------------------------------


def _canon_dump(node: object, names: dict[str, str], count: list[int]) -> str:
    """ast.dump-like text of `node` with every local name and parameter renamed v0, v1, ... in
    order of appearance (attribute names and constants kept). No copy of the tree is made."""
    if isinstance(node, list):
        return "[" + ",".join(_canon_dump(x, names, count) for x in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    count[0] += 1
    if isinstance(node, ast.Name):
        return f"N({names.setdefault(node.id, f'v{len(names)}')})"
    if isinstance(node, ast.arg):
        return f"A({names.setdefault(node.arg, f'v{len(names)}')})"  # annotation dropped
    if isinstance(node, ast.expr_context):
        return ""
    fields = ",".join(_canon_dump(getattr(node, f, None), names, count) for f in node._fields)
    return f"{type(node).__name__}({fields})"


def body_key(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str | None:
    """The definition's body, docstring dropped and names canonicalised; None if it is tiny."""
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    names: dict[str, str] = {}
    count = [0]
    params = _canon_dump(node.args, names, count) if not isinstance(node, ast.ClassDef) else ""
    text = params + _canon_dump(body, names, count)  # parameters are part of the code
    return text if count[0] >= _MIN_BODY_NODES else None


DefNode = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def def_nodes(tree: ast.Module) -> list[tuple[str, DefNode, bool]]:
    """(qualified name, node, top level?) of every function and class of a module."""
    out: list[tuple[str, DefNode, bool]] = []

    def walk(nodes: list[ast.stmt], prefix: str) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.append((f"{prefix}{node.name}", node, not prefix))
                walk(node.body, f"{prefix}{node.name}.")

    walk(tree.body, "")
    return out


def make_def(path: str, qual: str, node: DefNode, top: bool) -> Def:
    sig = None if isinstance(node, ast.ClassDef) else tuple(a.arg for a in _params(node))
    return Def(path, qual, top, sig, body_key(node))


def definitions(path: str, tree: ast.Module) -> list[Def]:
    """Every function and class of a module, with qualified names and body keys."""
    return [make_def(path, q, n, top) for q, n, top in def_nodes(tree)]


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = node.args
    return [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs, *([a.kwarg] if a.kwarg else [])]


def find_duplicates(before: Contents, after: Contents, index: RepoIndex) -> list[str]:
    """New definitions (not at base under the same path and name) that duplicate base ones
    still present after the patch."""
    new_defs, gone = _changed_defs(before, after)
    existing = [d for d in index.defs if (d.path, d.qualname) not in gone]
    by_body: dict[str, Def] = {d.body_key: d for d in existing if d.body_key}
    found = []
    for d in new_defs:
        twin = by_body.get(d.body_key) if d.body_key else None
        why = "same body"
        if twin is None and d.top_level and not d.qualname.startswith(("_", "test")):
            twin = next((e for e in existing if _same_name_sig(d, e)), None)
            why = "same name and parameters"
        if twin is not None:
            found.append(f"{d.path}:{d.qualname} duplicates {twin.path}:{twin.qualname} ({why})")
    return found


def _same_name_sig(d: Def, e: Def) -> bool:
    return e.top_level and e.path != d.path and e.qualname == d.qualname and e.signature == d.signature


def _changed_defs(before: Contents, after: Contents) -> tuple[list[Def], set[tuple[str, str]]]:
    """(definitions new in `after`, (path, qualname) of base definitions removed)."""
    new: list[Def] = []
    gone: set[tuple[str, str]] = set()
    for rel in after:
        if not rel.endswith(".py"):
            continue
        b, a = _parse(before.get(rel)), _parse(after.get(rel))
        old = {q for q, _, _ in def_nodes(b)} if b else set()
        now = def_nodes(a) if a else []
        new += [make_def(rel, q, n, top) for q, n, top in now if q not in old]  # body keys of new ones only
        gone |= {(rel, q) for q in old - {q for q, _, _ in now}}
    return new, gone


# --- imports ------------------------------------------------------------------------------------


def imports_of(tree: ast.Module) -> set[str]:
    """Top-level names of the modules a module imports (absolute imports only)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out - {"__future__"}


def foreign_imports(before: Contents, after: Contents, index: RepoIndex) -> list[str]:
    """Modules the patch imports that the repository neither imports nor contains."""
    added: set[str] = set()
    for rel, text in after.items():
        a = _parse(text) if rel.endswith(".py") else None
        if a is not None:
            b = _parse(before.get(rel))
            added |= imports_of(a) - (imports_of(b) if b else set())
    return sorted(added - index.imported - index.local)


# --- lint delta ---------------------------------------------------------------------------------


def ruff_binary() -> str | None:
    here = Path(sys.executable).parent / "ruff"
    return str(here) if here.is_file() else shutil.which("ruff")


def lint_delta(before: Contents, after: Contents, select: tuple[str, ...]) -> tuple[int | None, dict[str, int]]:
    """(warnings after - warnings before, codes that gained warnings) over the .py files touched."""
    ruff = ruff_binary()
    py = [rel for rel in after if rel.endswith(".py")]
    if ruff is None:
        return None, {}
    if not py:
        return 0, {}
    with tempfile.TemporaryDirectory(prefix="etude-lint-") as tmp:
        for side, contents in (("before", before), ("after", after)):
            for rel in py:
                text = contents.get(rel)
                if text is not None:
                    dest = Path(tmp, side, rel)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_text(text, encoding="utf-8", errors="surrogateescape")
        counts = _ruff_counts(ruff, Path(tmp), select)
    if counts is None:
        return None, {}
    gained = {c: n for c, n in (counts["after"] - counts["before"]).items() if n > 0}
    return counts["after"].total() - counts["before"].total(), dict(sorted(gained.items()))


def _ruff_counts(ruff: str, root: Path, select: tuple[str, ...]) -> dict[str, Counter[str]] | None:
    argv = [ruff, "check", "--isolated", "--no-cache", "--exit-zero", "--output-format", "json",
            "--select", ",".join(select), "."]  # fmt: skip
    try:
        proc = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)
        items = json.loads(proc.stdout or "[]")
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None  # lint does not apply rather than a failed episode
    counts: dict[str, Counter[str]] = {"before": Counter(), "after": Counter()}
    for item in items:
        side = Path(item.get("filename", "")).resolve().relative_to(root.resolve()).parts[0]
        counts[side][item.get("code") or "syntax-error"] += 1
    return counts


# --- formatting kept ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileStyle:
    indent_char: str | None  # " " or "\t"; None if the file has no indented lines
    indent_unit: int
    quote: str | None  # dominant quote of single-line strings, if one dominates
    max_len: int
    trailing_ws: bool  # the base file already has lines with trailing whitespace


def file_style(text: str) -> FileStyle:
    lines = text.splitlines()
    lead = [ln[: len(ln) - len(ln.lstrip())] for ln in lines if ln.strip()]
    chars = Counter(ch for w in lead for ch in set(w))
    indent_char = chars.most_common(1)[0][0] if chars else None
    quotes = Counter(q for q, _ in _strings(text))
    quote = None
    if sum(quotes.values()) >= 3:
        q, n = quotes.most_common(1)[0]
        quote = q if n / sum(quotes.values()) >= 0.8 else None
    return FileStyle(indent_char, _indent_unit(lines), quote, max((len(ln) for ln in lines), default=0),
                     any(ln != ln.rstrip() for ln in lines))  # fmt: skip


def _indent_unit(lines: list[str]) -> int:
    steps: Counter[int] = Counter()
    prev = 0
    for ln in lines:
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        width = len(ln) - len(ln.lstrip())
        if width > prev:
            steps[width - prev] += 1
        prev = width
    return steps.most_common(1)[0][0] if steps else 4


def _strings(text: str) -> list[tuple[str, int]]:
    """(quote character, line) of single-line string literals that could use either quote."""
    out = []
    for tok in _tokens(text):
        if tok.type != tokenize.STRING:
            continue
        body = tok.string.lstrip("rbuRBUfF")
        if body[:3] in ('"""', "'''") or "'" in body[1:-1] or '"' in body[1:-1]:
            continue
        out.append((body[0], tok.start[0]))
    return out


def _tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return []


def _logical_starts(text: str) -> set[int]:
    """Line numbers where a logical line starts (continuation lines may align freely)."""
    starts, fresh = set(), True
    for tok in _tokens(text):
        if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            fresh = True
        elif tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENCODING) and fresh:
            starts.add(tok.start[0])
            fresh = False
    return starts


def added_line_numbers(before: str, after: str) -> list[int]:
    """1-based numbers of lines of `after` that are inserted or replaced relative to `before`."""
    sm = difflib.SequenceMatcher(None, before.splitlines(), after.splitlines(), autojunk=False)
    return [j + 1 for tag, _, _, j1, j2 in sm.get_opcodes() if tag in ("insert", "replace") for j in range(j1, j2)]


def style_breaks(before: str, after: str, path: str = "") -> tuple[int, list[str]]:
    """(added lines checked, their breaks of the file's style as evidence strings)."""
    style, lines = file_style(before), after.splitlines()
    added = [n for n in added_line_numbers(before, after) if lines[n - 1].strip()]
    logical = _logical_starts(after)
    quote_lines = {ln for q, ln in _strings(after) if style.quote and q != style.quote}
    out = []
    for n in added:
        why = _line_break(lines[n - 1], style, n in logical, n in quote_lines)
        if why:
            out.append(f"{path}:{n}: {why}")
    return len(added), out


def _line_break(line: str, style: FileStyle, logical: bool, other_quote: bool) -> str | None:
    lead = line[: len(line) - len(line.lstrip())]
    if style.indent_char and lead and any(ch != style.indent_char for ch in lead):
        return "indentation mixes tabs and spaces unlike the file"
    if logical and style.indent_char == " " and len(lead) % max(1, style.indent_unit):
        return f"indent {len(lead)} is not a multiple of the file's {style.indent_unit}"
    if other_quote:
        return f"string quote differs from the file's {style.quote}"
    if len(line) > max(79, style.max_len):
        return f"line of {len(line)} characters, longer than any in the file ({style.max_len})"
    if line != line.rstrip() and not style.trailing_ws:
        return "trailing whitespace"
    return None


# --- one patch, then agent vs gold --------------------------------------------------------------


def changed_line_count(before: Contents, after: Contents) -> int:
    total = 0
    for rel in after:
        a, b = (after[rel] or "").splitlines(), (before.get(rel) or "").splitlines()
        sm = difflib.SequenceMatcher(None, b, a, autojunk=False)
        total += sum((i2 - i1) + (j2 - j1) for tag, i1, i2, j1, j2 in sm.get_opcodes() if tag != "equal")
    return total


def before_contents(template: Path, paths: list[str]) -> Contents:
    out: Contents = {}
    for rel in paths:
        p = template / rel
        out[rel] = p.read_text(encoding="utf-8", errors="surrogateescape") if p.is_file() else None
    return out


def patch_facts(template: Path, patch: str, select: tuple[str, ...] = ("E4", "E7", "E9", "F")) -> PatchFacts | None:
    """Facts of a patch on the template; None for an empty patch. Raises EtudeError if it does
    not apply."""
    if not patch.strip():
        return None
    after = patched_files(template, patch)
    before = before_contents(template, list(after))
    index = repo_index(template)
    lint, codes = lint_delta(before, after, select)
    checked, breaks = 0, []
    for rel in sorted(after):
        if rel.endswith(".py") and before.get(rel) is not None and after[rel] is not None:
            n, found = style_breaks(before[rel] or "", after[rel] or "", rel)
            checked, breaks = checked + n, breaks + found
    return PatchFacts(
        files=tuple(sorted(after)), changed_lines=changed_line_count(before, after),
        duplicates=tuple(find_duplicates(before, after, index)), new_imports=tuple(foreign_imports(before, after, index)),
        lint_added=lint, lint_codes=codes, style_checked=checked, style_breaks=len(breaks),
        style_evidence=tuple(breaks[:_MAX_EVIDENCE]),
    )  # fmt: skip


def components(agent: PatchFacts, gold: PatchFacts) -> dict[str, float | None]:
    """Each component in [0, 1], 1 = as the gold patch (see the module docstring)."""
    a_files, g_files = set(agent.files), set(gold.files)
    hit = len(a_files & g_files)
    f1 = 2 * hit / (len(a_files) + len(g_files)) if a_files or g_files else 1.0
    big, small = max(agent.changed_lines, gold.changed_lines), min(agent.changed_lines, gold.changed_lines)
    lint = None
    if agent.lint_added is not None and gold.lint_added is not None:
        lint = 1 / (1 + max(0, agent.lint_added - gold.lint_added))
    fmt = None
    if agent.style_checked:
        fa = agent.style_breaks / agent.style_checked
        fg = gold.style_breaks / gold.style_checked if gold.style_checked else 0.0
        fmt = 1 - max(0.0, fa - fg)
    return {
        "files": f1,
        "size": small / big if big else 1.0,
        "duplicates": 1 / (1 + max(0, len(agent.duplicates) - len(gold.duplicates))),
        "imports": 1 / (1 + len(set(agent.new_imports) - set(gold.new_imports))),
        "lint": lint,
        "format": fmt,
    }


def combine(parts: dict[str, float | None], weights: dict[str, float]) -> float | None:
    """Weighted mean of the components that apply; None when none does."""
    used = {k: v for k, v in parts.items() if v is not None and weights.get(k, 0) > 0}
    total = sum(weights[k] for k in used)
    return sum(weights[k] * v for k, v in used.items()) / total if total else None


def adherence(agent: PatchFacts | None, gold: PatchFacts | None, weights: dict[str, float]) -> dict[str, Any]:
    """{"score", "components", "agent", "gold"} for one patch; score None for an empty patch."""
    if agent is None or gold is None:
        return {"score": None, "components": dict.fromkeys(COMPONENTS), "agent": None,
                "gold": gold.to_dict() if gold else None}  # fmt: skip
    parts = components(agent, gold)
    return {"score": combine(parts, weights), "components": parts, "agent": agent.to_dict(), "gold": gold.to_dict()}
