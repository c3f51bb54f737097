"""The task curriculum: validated bugs in real PyPI packages at three levels of difficulty, and a
built-in split whose train, validation and held-out test sets come from disjoint packages.

- Level 1: one bug at one site that can be undone by reading one function (an operator, a
  comparison, a constant, swapped arguments, a negated condition; never a deleted statement). The
  statement names the failing test, the file and the function, and quotes the failure.
- Level 2: single-site bugs of every kind; the statement gives only the failing tests and errors.
- Level 3: bugs at 2-3 sites of one module, and tasks mined from release diffs where the suite
  lists a release pair; the statement is the level-2 one (or the changelog entry for mined tasks).

Every task is validated by `etude.tasks.synth` / `etude.tasks.mine` (the gold patch resolves it,
base fails) before it is kept. Builds are cached per (package, version, level, seed, quota) under
cache()/curriculum/<CURRICULUM_VERSION>/, written atomically, so a second call reads JSONL and an
interrupted build loses only the package it was on. What this does not guarantee: the same count
on every machine (a mutant whose tests time out on a slow machine is dropped there), or that a
bug is realistic (only that the tests catch it and the gold patch fixes it).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError
from etude.paths import cache
from etude.tasks import seal
from etude.tasks.fetch import fetch_sdist, normalise, parse_spec
from etude.tasks.mine import mine
from etude.tasks.schema import load_tasks, save_tasks
from etude.tasks.suite import PACKAGES
from etude.tasks.synth import SynthConfig, synthesise
from etude.types import Task

CURRICULUM_VERSION = "v1"  # bump when statements or the build change: old caches are then ignored

# Single-site mutators that reading the function can undo (no deleted statement, no reordering).
LEVEL1_MUTATORS: tuple[str, ...] = ("op_flip", "cmp_flip", "off_by_one", "invert_if", "swap_args")
SINGLE_MUTATORS: tuple[str, ...] = LEVEL1_MUTATORS + ("remove_stmt", "remove_cond", "remove_return")
LEVELS = (1, 2, 3)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Member:
    """A package of the built-in curriculum split."""

    spec: str  # NAME==VERSION
    sha256: str  # of the sdist, checked on every fetch
    split: str  # "train" | "validation" | "test"
    n: int  # tasks to build at each level


# Test-suite wall times (one run, this kind of machine, unloaded) are 0.1-1.3 s for every package
# here, which is what makes ~600 validated tasks a 20-30 minute build on 2 cores. No package is in
# two splits; `etude tasks curriculum --split test` holds only packages the training never sees.
BUILTIN: tuple[Member, ...] = (
    Member("tinydb==4.8.2", "f7dfc39b8d7fda7a1ca62a8dbb449ffd340a117c1206b68c50b1a481fb95181d", "train", 40),
    Member("isodate==0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "train", 40),
    Member("addict==2.4.0", "b3b2210e0e067a281f5646c8c5db92e99b7231ea8b0eb5f74dbdf9e259d4e494", "train", 25),
    Member("xmltodict==1.0.4", "6d94c9f834dd9e44514162799d344d815a3a4faec913717a9ecbfa5be1bb8e61", "train", 35),
    Member("toolz==1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "train", 40),
    Member("python-slugify==9.2.0", "cee32948083476013804de1667724fb1362dacb71e47b1d5d92adf8db6ee3298", "train", 25),
    Member("cachetools==8.0.2", "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "train", 40),
    Member("funcy==2.0", "3963315d59d41c6f30c04bc910e10ab50a3ac4a225868bfa96feed133df075cb", "train", 40),
    Member("tabulate==0.9.0", "0095b12bf5966de529c0feb1fa08671671b3368eec77d7ef7ab114be2c068b3c", "train", 40),
    Member("semver==3.0.4", "afc7d8c584a5ed0a11033af086e8af226a9c0b206f313e0301f8dd7b6b589602", "train", 40),
    Member("wcwidth==0.2.13", "72ea0c06399eb286d978fdedb6923a9eb47e1c486ce63e9b4e64fc18303972b5", "train", 25),
    Member("six==1.17.0", "ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81", "train", 30),
    Member("jmespath==1.0.1", "90261b206d6defd58fdd5e85f478bf633a2901798906be2ad389150c5c60edbe", "validation", 20),
    Member("colorama==0.4.6", "08695f5cb7ed6e0531a20572697297273c47b8cae5a63ffc6d6ed5c201be6e44", "validation", 15),
    # Added with the seal (stop 28) so that validation can carry development decisions: >= 100 tasks.
    Member("munch==4.0.0", "542cb151461263216a4e37c3fd9afc425feeaf38aaa3025cd2a981fadb422235", "validation", 30),
    Member("pyhumps==3.8.0", "498026258f7ee1a8e447c2e28526c0bea9407f9a59c03260aee4bd6c04d681a3", "validation", 25),
    Member("ordered-set==4.1.0", "694a8e44c87657c59292ede72891eb91d34131f6531463aab3009191c77364a8", "validation", 30),
    Member("idna==3.10", "12f65c9b470abda6dc35cf8e63cc574b1c52b11df2c86030af0ac09b01b13ea9", "test", 25),
    Member("itsdangerous==2.2.0", "e0050c0b7da1eea53ffaf149c0cfbb5c6e2e2b69c4bef22c81fa6eb73e5f6173", "test", 25),
    Member("parse==1.22.4", "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5", "test", 25),
    Member("schema==0.7.8", "e86cc08edd6fe6e2522648f4e47e3a31920a76e82cce8937535422e310862ab5", "test", 25),
    Member("inflection==0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417", "test", 25),
)  # fmt: skip


def pinned_sha256(spec: str) -> str | None:
    """The sdist checksum the built-in suite pins for `spec` (NAME==VERSION), or None."""
    return next((m.sha256 for m in BUILTIN if m.spec == spec), None)


SPLITS = ("train", "validation", "test")


def members(split: str) -> list[Member]:
    if split not in SPLITS:
        raise EtudeError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    return [m for m in BUILTIN if m.split == split]


def read_packages(arg: str) -> list[str]:
    """`--packages`: comma-separated NAME==VERSION, or a file with one requirement a line."""
    p = Path(arg)
    if p.is_file():
        items = [ln.split("#", 1)[0].strip() for ln in p.read_text().splitlines()]
    else:
        items = [x.strip() for x in arg.split(",")]
    items = [x for x in items if x]
    if not items:
        raise EtudeError(f"no packages in {arg!r} (give NAME==VERSION[,NAME==VERSION...] or a file)")
    for x in items:
        parse_spec(x)  # a misspelt spec is one clear line before anything is built
    return items


# ---------------------------------------------------------------- statements


def _line_owners(source: str) -> dict[int, str] | None:
    """Each line inside a function body -> the innermost such function (`Class.method` or
    `function`); None when the source does not parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, SystemError, RecursionError):
        return None
    owner: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:  # parents first, so an inner function's lines are its own
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    for ln in range(child.lineno, getattr(child, "end_lineno", child.lineno) + 1):
                        owner[ln] = name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return owner


def enclosing_function(source: str, line: int) -> str | None:
    """`Class.method` or `function` whose body holds `line` (innermost), None at module level."""
    return (_line_owners(source) or {}).get(line)


def function_lines(source: str, functions: Collection[str]) -> frozenset[int]:
    """The lines whose innermost enclosing function (as `enclosing_function` names it) is one of
    `functions` (`Class.method` or `function`); empty when the source does not parse."""
    wanted = set(functions)
    return frozenset(ln for ln, name in (_line_owners(source) or {}).items() if name in wanted)


def _failures(task: Task) -> list[tuple[str, str]]:
    fails = task.meta.get("failures") or {}
    out = [(t, fails.get(t, "")) for t in task.FAIL_TO_PASS[:3]]
    return out


def _test_lines(failures: Sequence[tuple[str, str]], total: int) -> list[str]:
    lines = [f"- `{t}`" + (f": {msg}" if msg else "") for t, msg in failures]
    if total > len(failures):
        lines.append(f"- and {total - len(failures)} more")
    return lines


def statement(task: Task, level: int, function: str | None) -> str:
    """The problem statement at `level` (see the module doc). Never quotes the gold patch."""
    fails = _failures(task)
    tests = _test_lines(fails, len(task.FAIL_TO_PASS))
    if level == 1 and function:
        first, msg = fails[0] if fails else ("", "")
        msg = msg if len(msg) <= 160 else msg[:157] + "..."
        return (f"The test `{first}` fails" + (f" with `{msg}`" if msg else "") + ". "
                f"The bug is in `{function}` in `{task.meta.get('file')}`. Fix it.")
    return "\n".join(["These tests fail and should pass:", *tests, "", "Find the bug in the library code and fix it."])


def _restate(task: Task, level: int, root: Path) -> Task | None:
    rel = task.meta.get("file")
    lines = task.meta.get("lines") or []
    function = None
    if rel and lines and (root / rel).is_file():
        function = enclosing_function((root / rel).read_text(encoding="utf-8", errors="replace"), int(lines[0]))
    if level == 1 and function is None:
        return None  # a bug outside any function cannot be given as "in function X"
    meta = {**task.meta, "level": level, "function": function, "curriculum": CURRICULUM_VERSION}
    return dataclasses.replace(task, problem_statement=statement(task, level, function), meta=meta)


# ---------------------------------------------------------------- building


def _cache_file(spec: str, level: int, seed: int, n: int, first: int | None = None) -> Path:
    name, ver = parse_spec(spec)
    d = cache() / "curriculum" / CURRICULUM_VERSION
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{normalise(name)}-{ver}-L{level}-s{seed}-n{n}{f'-first{first}' if first else ''}.jsonl"


def package_curriculum(spec: str, level: int, n: int, seed: int = 0, sha256: str | None = None,
                       progress: Progress | None = None, first: int | None = None) -> list[Task]:
    """Up to `n` validated tasks of `level` from one package, built once then read from cache.
    `first` (levels 1 and 2): only the first `first` of those tasks, built alone (the build stops
    there and is cached apart), the same tasks the whole build starts with."""
    if level not in LEVELS:
        raise EtudeError(f"curriculum level must be 1, 2 or 3, not {level}")
    if first is not None and (level == 3 or first >= n):
        first = None  # level 3 combines validated bugs after the singles: no prefix to stop at
    whole = _cache_file(spec, level, seed, n)
    if first is not None and whole.is_file():
        return load_tasks(whole)[:first]
    f = _cache_file(spec, level, seed, n, first)
    if f.is_file():
        return load_tasks(f)
    say = progress or (lambda _m: None)
    name, ver = parse_spec(spec)
    sd = fetch_sdist(name, ver, sha256)  # unknown package or version: EtudeError, nothing cached
    mutators = LEVEL1_MUTATORS if level == 1 else SINGLE_MUTATORS
    if level == 3:
        cfg = SynthConfig(max_tasks=n, seed=seed, max_candidates=6 * n, combine_fraction=0.75, mutators=mutators)
    else:
        cfg = SynthConfig(max_tasks=n, seed=seed, max_candidates=4 * n, combine_fraction=0.0, mutators=mutators)
    restated: dict[str, Task | None] = {}  # each task restated once, by `enough` or below

    def restate(t: Task) -> Task | None:
        if t.instance_id not in restated:
            restated[t.instance_id] = _restate(t, level, sd.root)
        return restated[t.instance_id]

    def enough(t: Task) -> bool:  # the first `first` tasks that survive the restatement are there
        return restate(t) is not None and sum(r is not None for r in restated.values()) >= first

    tasks = synthesise(spec, cfg=cfg, progress=lambda m: say(f"{name}: {m}"), enough=enough if first else None)
    if level == 3:
        tasks = [t for t in tasks if "+" in t.strategy] + _mined(name, ver, say)
    kept = [t2 for t in tasks if (t2 := restate(t)) is not None][:first]  # [:None]: all of them
    save_tasks(kept, f)
    return kept


def repo_curriculum(repo: Path, level: int, n: int, seed: int = 0, progress: Progress | None = None) -> list[Task]:
    """`package_curriculum` for a local repository's working tree (a git repository): cached by
    its path and the tree's content, so an edit to the repository (or a copy elsewhere) builds anew."""
    import hashlib
    import subprocess

    if level not in LEVELS:
        raise EtudeError(f"curriculum level must be 1, 2 or 3, not {level}")
    root = Path(repo).resolve()
    r = subprocess.run(["git", "-C", str(root), "ls-files", "-s"], capture_output=True, text=True)
    if r.returncode != 0:
        raise EtudeError(f"{root}: not a git repository")
    st = subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True).stdout
    # the tasks name the repository's path (setup.repo_dir): the same tree elsewhere is built anew
    key = hashlib.sha256((str(root) + "\n" + r.stdout + st).encode()).hexdigest()[:12]
    d = cache() / "curriculum" / CURRICULUM_VERSION
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"repo-{root.name}-{key}-L{level}-s{seed}-n{n}.jsonl"
    if f.is_file():
        return load_tasks(f)
    mutators = LEVEL1_MUTATORS if level == 1 else SINGLE_MUTATORS
    cfg = SynthConfig(max_tasks=n, seed=seed, max_candidates=4 * n, combine_fraction=0.0 if level < 3 else 0.75,
                      mutators=mutators)
    tasks = synthesise(repo=root, cfg=cfg, progress=lambda m: (progress or (lambda _m: None))(f"{root.name}: {m}"))
    kept = [t2 for t in tasks if (t2 := _restate(t, level, root)) is not None]
    save_tasks(kept, f)
    return kept


def function_curriculum(spec: str, functions: Collection[str], n: int, seed: int = 0,
                        progress: Progress | None = None) -> list[Task]:
    """Up to `n` validated level-1 tasks of one repository (`NAME==VERSION` or a local git
    repository's path) whose bug sits inside one of `functions` (`file::Class.method`, files
    relative to the source tree, as `etude.pipeline.split` names them; names of other files are
    ignored). Every mutant tried is at such a site, so none is validated in vain. Not cached: the
    caller keeps them (the specialisation builds its fix drills on its train functions this way)."""
    by_file: dict[str, set[str]] = {}
    for f in functions:
        rel, _, name = f.partition("::")
        if name and name != "<module>":
            by_file.setdefault(rel, set()).add(name)
    if "==" in spec:
        name, ver = parse_spec(spec)
        root, package, repo = fetch_sdist(name, ver, pinned_sha256(spec)).root, spec, None
    else:
        root = Path(spec).resolve()
        package, repo = None, root
    sites = {rel: lines for rel, names in by_file.items()
             if (root / rel).is_file() and (lines := function_lines((root / rel).read_text(encoding="utf-8", errors="replace"), names))}
    if not sites or n <= 0:
        return []
    cfg = SynthConfig(max_tasks=n, seed=seed, max_candidates=4 * n, combine_fraction=0.0, mutators=LEVEL1_MUTATORS,
                      sites=sites)
    say = progress or (lambda _m: None)
    tasks = synthesise(package, repo, cfg=cfg, progress=lambda m: say(f"{root.name}: {m}"))
    return [t2 for t in tasks if (t2 := _restate(t, 1, root)) is not None]


def _mined(name: str, ver: str, say: Progress) -> list[Task]:
    """Release-diff tasks for a package the built-in suite lists a release pair for."""
    out: list[Task] = []
    for pkg in PACKAGES:
        for v_from, sha, v_to in pkg.releases:
            if normalise(pkg.name) == normalise(name) and v_from == ver:
                fetch_sdist(pkg.name, v_from, sha)
                try:
                    out += mine(pkg.name, v_from, v_to, progress=lambda m, tag=f"{name} {v_from}->{v_to}": say(f"{tag}: {m}"))
                except EtudeError as e:
                    print(f"etude: warning: mining {name} {v_from}->{v_to}: {e}", file=sys.stderr)
    return out


def build(packages: Sequence[str], level: int, max_tasks: int, seed: int = 0,
          progress: Progress | None = None) -> list[Task]:
    """`max_tasks` tasks of `level` spread evenly over `packages` (each NAME==VERSION)."""
    if level not in LEVELS:
        raise EtudeError(f"curriculum level must be 1, 2 or 3, not {level}")
    if max_tasks < 1:
        raise EtudeError(f"--max must be at least 1, got {max_tasks}")
    quota = math.ceil(max_tasks / len(packages))
    out: list[Task] = []
    for spec in packages:
        out += package_curriculum(spec, level, quota, seed, pinned_sha256(spec), progress)[:quota]
    return out[:max_tasks]


def builtin_curriculum(split: str, level: int = 1, seed: int = 0, max_tasks: int | None = None,
                       progress: Progress | None = None, *, use: str) -> list[Task]:
    """The built-in split's tasks (built on first use, then cached). `max_tasks` takes the first
    tasks of every package in turn, so a small slice still spans all the split's packages. `use`
    says why (etude.tasks.seal.USES): the test split is sealed for every use but "final"."""
    where = f"builtin:curriculum:{split}"
    seal.guard_split(where, use=use, where=where)
    ms = members(split)
    if max_tasks is not None and max_tasks < len(ms):
        ms = ms[:max_tasks]  # a slice smaller than the number of packages: one task from each of the first
    # A slice smaller than the split builds only its share of each package (cached apart; a demo
    # needs minutes, not the whole split): the first `share` tasks of the package's whole build,
    # read from that build when it is cached, so a fresh machine gets the same tasks as one with
    # the whole split cached.
    share = math.ceil(max_tasks / len(ms)) if max_tasks else None
    per_pkg = [package_curriculum(m.spec, level, m.n, seed, m.sha256, progress,
                                  first=None if share is None or share >= m.n else share)
               for m in ms]
    out: list[Task] = []
    i = 0
    while any(i < len(p) for p in per_pkg) and (max_tasks is None or len(out) < max_tasks):
        for p in per_pkg:
            if i < len(p) and (max_tasks is None or len(out) < max_tasks):
                out.append(dataclasses.replace(p[i], meta={**p[i].meta, "split": split}))
        i += 1
    return seal.guard(out, use=use, where=where)


def split_summary(level: int = 1, seed: int = 0) -> dict[str, object]:
    """Counts per split and package (reads the cache; builds what is missing)."""
    out: dict[str, object] = {}
    for split in SPLITS:
        tasks = builtin_curriculum(split, level, seed, use="build")
        by: dict[str, int] = {}
        for t in tasks:
            by[t.source.get("package", t.repo)] = by.get(t.source.get("package", t.repo), 0) + 1
        out[split] = {"tasks": len(tasks), "packages": by}
    return out


def dump_summary(path: Path, summary: dict[str, object]) -> None:
    path.write_text(json.dumps(summary, indent=2) + "\n")
