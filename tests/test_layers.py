"""Layers that point one way: the component graph of `etude` has no cycle, and every etude import
sits at the top of its file.

A component is a top-level subpackage (`etude/harness/`) or module (`etude/types.py`) of etude.
Every `import etude.X` / `from etude.X import ...` counts, including those inside functions:
a lazy import hides a dependency, it does not remove it. Regression for issue 16, where seven
components (harness, policy, envs, train, rewards, feedback, serve) imported each other in a
circle through imports inside functions.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import etude

ROOT = Path(etude.__file__).resolve().parent

# Function-local etude imports that must stay so, file -> why. Keep it empty unless truly needed.
LOCAL_IMPORT_ALLOWED: dict[str, str] = {
    "etude/serve/run.py": "etude.serve.app imports fastapi; `import etude.serve` (etude --help, keys, registry) must not",
    "etude/demo/cli.py": "etude.demo.run imports train/evals/loop (torch, scipy); `etude demo --help` must not",
    "etude/pipeline/cli.py": "etude.pipeline.specialise imports train/evals (torch, scipy); `etude --help` must not",
    "etude/policy/local.py": "etude.scale.moe imports torch; policy.local is imported (serve.pool, policy) before any model is",
    "etude/policy/__init__.py": "the vLLM backend imports policy.local (torch); `import etude.policy` must stay cheap",
}

# NOTE: a ratchet, not an allow-list. Issue 16 item 1 is half done: these files still import etude
# inside functions (most were under other engineers' uncommitted edits when the rest was hoisted).
# Hoist a file's imports, then delete it here; the test fails if a file not listed gains a
# function-local etude import, and if a listed one no longer has any (so the list only shrinks).
NOT_YET_HOISTED: frozenset[str] = frozenset({
    "etude/train/distributed.py",
})


@dataclass(frozen=True)
class Import:
    target: str  # the imported module, e.g. "etude.rewards.score"
    path: str  # the importing file, relative to the repository
    line: int
    local: bool  # inside a function


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def component(module: str) -> str | None:
    """'etude.harness.loop' -> 'harness', 'etude.types' -> 'types'; the bare package -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path) -> list[Import]:
    module, is_package = module_name(path), path.name == "__init__.py"
    rel = str(path.relative_to(ROOT.parent))
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = _resolve(child, module, is_package)
                # `from etude import harness` imports the submodule etude.harness
                targets = [f"{base}.{a.name}" for a in child.names] if base == "etude" else [base]
            for t in targets:
                if t == "etude" or t.startswith("etude."):
                    found.append(Import(t, rel, child.lineno, inner))
            visit(child, inner)

    visit(ast.parse(path.read_text(), filename=str(path)), False)
    return found


def all_imports() -> list[Import]:
    return [imp for p in sorted(ROOT.rglob("*.py")) for imp in imports_of(p)]


def component_graph(imports: list[Import]) -> dict[str, dict[str, list[Import]]]:
    """component -> component it imports -> the import statements that make the edge."""
    graph: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for imp in imports:
        src = component(module_name(ROOT.parent / imp.path))
        dst = component(imp.target)
        if src and dst and src != dst and dst != "__version__":
            graph[src][dst].append(imp)
    return graph


def find_cycle(graph: dict[str, dict[str, list[Import]]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph.get(v, {})):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (cycle := dfs(w)):
                return cycle
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(graph):
        if v not in state and (cycle := dfs(v)):
            return cycle
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, list[Import]]]) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:], strict=False):
        ev = graph[a][b][0]
        lines.append(f"  {a} -> {b}: {ev.path}:{ev.line} imports {ev.target}{' (inside a function)' if ev.local else ''}")
    return "\n".join(lines)


def test_the_component_graph_has_no_cycle() -> None:
    graph = component_graph(all_imports())
    cycle = find_cycle(graph)
    assert cycle is None, "etude's components import each other in a circle:\n" + describe(cycle, graph)


def test_no_etude_import_is_function_local() -> None:
    every = [i for i in all_imports() if i.local and i.path not in LOCAL_IMPORT_ALLOWED]
    local = [i for i in every if i.path not in NOT_YET_HOISTED]
    where = "\n".join(f"  {i.path}:{i.line} imports {i.target}" for i in local)
    assert not local, f"etude imports belong at the top of their file ({len(local)} inside functions):\n{where}"
    done = NOT_YET_HOISTED - {i.path for i in every}
    assert not done, f"hoisted, so take them off NOT_YET_HOISTED in tests/test_layers.py: {sorted(done)}"


def test_the_checker_sees_cycles_and_local_imports(tmp_path: Path) -> None:
    # the checker itself: a two-component circle through a function-local import is found
    graph: dict[str, dict[str, list[Import]]] = {
        "a": {"b": [Import("etude.b", "etude/a.py", 3, False)]},
        "b": {"a": [Import("etude.a.x", "etude/b/y.py", 9, True)]},
    }
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "a"]
    assert "etude/b/y.py:9 imports etude.a.x (inside a function)" in describe(cycle, graph)
    src = ROOT / "types.py"
    assert all(not i.local for i in imports_of(src))
    assert component("etude.rewards.score") == "rewards" and component("etude.types") == "types"


# Components bottom to top: a component may import only components below it (issue 33 item 7).
# A new component takes its place here; an import that points up the list is a layering error
# even when it makes no cycle yet.
LAYERS: tuple[str, ...] = (
    "errors", "data", "types", "paths", "provenance", "configfile", "protocols", "toolcalls",
    "experiments", "raycluster", "scale", "search", "store", "sandbox", "policy", "feedback", "tasks",
    "tools", "rewards", "harness", "envs", "serve", "evals", "train", "loop", "pipeline", "demo", "cli",
)


def test_imports_point_down_the_declared_layers() -> None:
    comps = {component(module_name(p)) for p in ROOT.rglob("*.py")} - {None}
    missing = sorted(comps - set(LAYERS))
    assert not missing, f"components not placed in LAYERS (tests/test_layers.py): {missing}"
    rank = {c: i for i, c in enumerate(LAYERS)}
    graph = component_graph(all_imports())
    up = [f"  {a} -> {b}: {ev.path}:{ev.line} imports {ev.target}"
          for a, targets in graph.items() for b, evs in targets.items() for ev in evs[:1]
          if b in rank and rank[b] > rank[a]]
    assert not up, "imports that point up the declared layers:\n" + "\n".join(sorted(up))


def _module_targets(path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """Modules (not packages' names) one file imports: `from etude.x import y` is etude.x.y when
    that is a module, else etude.x."""
    out: list[tuple[str, int]] = []
    module, is_package = module_name(path), path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("etude")]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, is_package)
            if base.startswith("etude"):
                out += [(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base, node.lineno) for a in node.names]
    return out


# NOTE: a ratchet: edges of a known loop between files, (importer, imported). Break the loop, then
# delete the edge here; the test fails if a listed edge is gone (so the list only shrinks).
KNOWN_FILE_LOOPS: frozenset[tuple[str, str]] = frozenset({
    # FSDP2 wrapping reaches back for the learner's build_model inside a function (NOT_YET_HOISTED)
    ("etude.train.distributed", "etude.train.learner"),
})


def test_no_loop_between_files_of_one_component() -> None:
    """Within a component, files import each other one way (a package's __init__ re-exporting its
    modules is the top of that component, so a module importing its own package's __init__ is a
    loop too)."""
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph: dict[str, dict[str, list[Import]]] = defaultdict(lambda: defaultdict(list))
    for p in paths:
        src = module_name(p)
        for target, line in _module_targets(p, modules):
            t = target
            while t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t != src and component(t) == component(src) and component(src) is not None:
                graph[src][t].append(Import(t, str(p.relative_to(ROOT.parent)), line, False))
    gone = {e for e in KNOWN_FILE_LOOPS if e[1] not in graph.get(e[0], {})}
    assert not gone, f"loops broken, so take them off KNOWN_FILE_LOOPS: {sorted(gone)}"
    for a, b in KNOWN_FILE_LOOPS:
        del graph[a][b]
    cycle = find_cycle(graph)
    assert cycle is None, "files of one component import each other in a circle:\n" + describe(cycle, graph)
