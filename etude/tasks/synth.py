"""Synthesising bugs in a package's source and keeping those its own tests catch.

Pipeline: enumerate (file, mutator, site) candidates over the package's source files, shuffle them
with the seed, mutate (libcst keeps formatting), drop mutants whose diff we have seen (dedupe by
diff hash), and validate each in the sandbox against a reference: the unmodified suite run twice
(tests failing or flaky there are excluded). A mutant run once more: tests that pass in both
reference runs and fail on the mutant are FAIL_TO_PASS, the rest of the reference-passing tests
that still pass are PASS_TO_PASS. Then 2-3 validated mutants of one module are combined and
validated again. Task: base = the mutant (setup.base_patch), gold `patch` = the reverse diff,
`test_patch` empty. What this does not do: judge whether a bug is realistic; it only guarantees
the tests catch it and the gold patch fixes it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError
from etude.tasks import describe, diffs, layout
from etude.tasks.fetch import fetch_sdist, normalise, parse_spec
from etude.tasks.mutators import MUTATORS, mutate, site_lines
from etude.tasks.repo import base_commit_id
from etude.tasks.runner import TestRun
from etude.tasks.validate import classify, hang_timeout, run_state
from etude.types import Task

Progress = Callable[[str], None]


@dataclass
class SynthConfig:
    """Knobs of one synthesis run."""

    max_tasks: int = 50
    """Stop after this many validated tasks (singles and combinations together)."""
    seed: int = 0
    """Shuffles candidate sites; the same seed on the same sdist gives the same tasks."""
    max_candidates: int | None = None
    """Mutants to try at most (default: 4 x max_tasks)."""
    combine_fraction: float = 0.25
    """Share of max_tasks given to combinations of 2-3 validated bugs in one module."""
    max_f2p_fraction: float = 0.5
    """Drop mutants that break more than this share of the suite (they break import, not logic)."""
    mutators: tuple[str, ...] = tuple(MUTATORS)
    """Which mutators to use."""
    extra_deps: tuple[str, ...] = ()
    """Requirements the tests need beyond what the package declares."""
    sites: dict[str, frozenset[int]] | None = None
    """Only mutants whose changed line is one of these (source file relative to the tree -> line
    numbers, 1-based); None: every site. `etude.tasks.curriculum.function_curriculum` builds bugs
    in chosen functions this way."""
    workers: int | None = None
    """Mutants validated at once (each runs the suite in its own sandbox). None: the machine's
    cores, at most 4. Results are taken in the candidates' order, as one at a time would take them
    (at most workers - 1 mutants are run in vain), so the tasks kept do not depend on it unless
    the suite's verdicts depend on load (a test that fails only on a busy machine); the reference
    runs stay one at a time."""


@dataclass(frozen=True)
class Candidate:
    rel: str  # file
    mutators: tuple[str, ...]
    lines: tuple[int, ...]
    base_patch: str  # original -> mutant (what prepare_repo applies to build base)
    patch: str  # mutant -> original (the gold patch)


def _source_tree(package: str | None, repo: Path | None) -> tuple[Path, dict]:
    if repo is not None:
        if not repo.is_dir():
            raise EtudeError(f"not a directory: {repo}")
        return repo, {"repo_dir": str(repo.resolve())}
    name, ver = parse_spec(package or "")
    sd = fetch_sdist(name, ver)
    return sd.root, {"sdist": {"package": name, "version": ver, "sha256": sd.sha256}, "created_at": sd.upload_time}


def proto_task(
    package: str | None = None, repo: Path | None = None, extra_deps: Sequence[str] = ()
) -> tuple[Task, Path]:
    """The unmutated task (no bug yet) and the original tree it is built from."""
    root, setup = _source_tree(package, repo)
    created_at = setup.pop("created_at", "")
    if not layout.test_files(root):
        raise EtudeError(f"{package or repo}: no tests found (tests/, test_*.py); cannot synthesise tasks")
    if not layout.source_files(root):
        raise EtudeError(f"{package or repo}: no Python source files found")
    setup.update(
        base_patch="",
        pythonpath=layout.import_root(root),
        test_paths=layout.test_paths(root),
        test_deps=sorted(set(layout.declared_requirements(root)) | set(extra_deps)),
    )
    if "sdist" in setup:
        sd = setup["sdist"]
        name, ver, sha = sd["package"], sd["version"], sd["sha256"]
        source = {"package": name, "version": ver, "sha256": sha}
    else:
        name, ver, sha = root.resolve().name, "local", None
        source = {"repo_dir": str(root.resolve())}
    t = Task(
        instance_id=f"{normalise(name)}__synth",
        repo=f"pypi/{normalise(name)}" if "sdist" in setup else f"local/{name}",
        base_commit=base_commit_id(name, ver, sha, ""),
        patch="",
        test_patch="",
        problem_statement="",
        created_at=created_at,  # the release's upload time: the code is that old
        version=ver,
        environment_setup_commit=base_commit_id(name, ver, sha, ""),  # every mutant shares the release's env
        source=source,
        strategy="synth",
        test_cmd="python -m pytest " + " ".join(setup["test_paths"]),
        timeout_s=300.0,
        setup=setup,
    )
    return t, root


def candidates(root: Path, cfg: SynthConfig) -> Iterator[Candidate]:
    """Single mutants in seeded random order, each yielded once per distinct diff."""
    files = layout.source_files(root)
    if cfg.sites is not None:
        files = [rel for rel in files if cfg.sites.get(rel)]
    sources = {rel: (root / rel).read_text(encoding="utf-8", errors="replace") for rel in files}
    # with `sites`, only the chosen lines' sites are ever mutated
    sites = [(rel, m, i) for rel in files for m in cfg.mutators for i, ln in enumerate(site_lines(sources[rel], m))
             if cfg.sites is None or ln in cfg.sites[rel]]
    random.Random(cfg.seed).shuffle(sites)
    seen: set[str] = set()
    for rel, m, i in sites:
        mut = mutate(sources[rel], m, i)
        if mut is None or (cfg.sites is not None and mut.line not in cfg.sites[rel]):
            continue
        orig, new = sources[rel].splitlines(True), mut.code.splitlines(True)
        base_patch = diffs.file_diff(rel, orig, new)
        h = diffs.diff_hash(base_patch)
        if base_patch and h not in seen:
            seen.add(h)
            yield Candidate(rel, (m,), (mut.line,), base_patch, diffs.file_diff(rel, new, orig))


def combine(root: Path, parts: Sequence[Candidate]) -> Candidate | None:
    """One module with 2-3 validated bugs at once, or None if their diffs collide."""
    rel = parts[0].rel
    with tempfile.TemporaryDirectory(prefix="etude-combine-") as tmp:
        dst = Path(tmp) / "t"
        (dst / rel).parent.mkdir(parents=True)
        shutil.copy2(root / rel, dst / rel)
        for c in parts:
            ok, _ = diffs.apply_patch(dst, c.base_patch, check=False)
            if not ok:
                return None
        base_patch, gold = diffs.tree_diff(root, dst, [rel]), diffs.tree_diff(dst, root, [rel])
    muts = tuple(m for c in parts for m in c.mutators)
    return Candidate(rel, muts, tuple(ln for c in parts for ln in c.lines), base_patch, gold)


def reference(proto: Task, runs: int = 2) -> tuple[list[TestRun], set[str]]:
    """The unmodified suite, `runs` times; the set of tests that passed in every run."""
    ref = run_state(proto, [], runs)
    if any(r.timed_out for r in ref):
        raise EtudeError(f"{proto.instance_id}: the reference test suite timed out")
    good = set.intersection(*(r.passed() for r in ref))
    if not good:
        tail = ref[0].log_tail.strip().splitlines()[-1:] or ["no output"]
        raise EtudeError(f"{proto.instance_id}: no test passes on the unmodified source ({tail[0]})")
    return ref, good


def evaluate(proto: Task, ref: list[TestRun], cand: Candidate, cfg: SynthConfig) -> Task | None:
    """Run the mutant once; a task when the tests catch it (F2P >= 1, P2P >= 1, not too broad)."""
    try:
        run = run_state(proto, [cand.base_patch], 1, timeout_s=hang_timeout(ref, proto))[0]
    except EtudeError:
        return None
    if run.timed_out:
        return None
    # The mutant is "base", the reference (original source) is "gold".
    f2p, p2p, _ = classify([run], ref)
    if not f2p or not p2p or len(f2p) > cfg.max_f2p_fraction * (len(f2p) + len(p2p)):
        return None
    return dataclasses.replace(_task(proto, cand, f2p, p2p, run.messages), timeout_s=hang_timeout(ref, proto))


def _task(proto: Task, cand: Candidate, f2p: list[str], p2p: list[str], messages: dict[str, str]) -> Task:
    name = proto.source.get("package") or Path(proto.setup["repo_dir"]).name
    setup = {**proto.setup, "base_patch": cand.base_patch}
    ver = proto.version
    sha = proto.source.get("sha256")
    tag = diffs.diff_hash(cand.base_patch)[:10]
    return dataclasses.replace(
        proto,
        instance_id=f"{normalise(name)}__synth-{'+'.join(cand.mutators)}-{tag}",
        base_commit=base_commit_id(name, ver, sha, cand.base_patch),
        patch=cand.patch,
        problem_statement=describe.from_tests(name, f2p, messages),
        FAIL_TO_PASS=tuple(f2p),
        PASS_TO_PASS=tuple(p2p),
        strategy="synth:" + "+".join(cand.mutators),
        setup=setup,
        meta={"file": cand.rel, "lines": list(cand.lines), "validated_runs": {"reference": 2, "mutant": 1},
              # the first line pytest printed for each failing test at base (curriculum statements quote it)
              "failures": {t: (messages.get(t) or "").strip().splitlines()[0][:300] if messages.get(t) else ""
                           for t in f2p[:5]}},
    )


def _combos(root: Path, singles: list[tuple[Candidate, Task]], rng: random.Random, limit: int) -> Iterator[Candidate]:
    """Up to `limit` combinations of 2-3 validated bugs in the same module, lines 8+ apart."""
    by_file: dict[str, list[Candidate]] = {}
    for cand, _ in singles:
        by_file.setdefault(cand.rel, []).append(cand)
    pools = [c for c in by_file.values() if len(c) >= 2]
    made, tries = 0, 0
    while pools and made < limit and tries < limit * 10:
        tries += 1
        pool = rng.choice(pools)
        parts = rng.sample(pool, min(len(pool), rng.choice((2, 3))))
        lines = sorted(ln for c in parts for ln in c.lines)
        if any(b - a < 8 for a, b in zip(lines, lines[1:], strict=False)):
            continue
        combo = combine(root, parts)
        if combo is not None:
            made += 1
            yield combo


def _count(stats: dict[str, dict[str, int]] | None, cand: Candidate, kept: bool) -> None:
    if stats is None:
        return
    key = "synth:" + ("combo" if len(cand.mutators) > 1 else cand.mutators[0])
    for name, hit in (("tried", True), ("kept", kept)):
        stats.setdefault(name, {})
        stats[name][key] = stats[name].get(key, 0) + int(hit)


def synthesise(package: str | None = None, repo: Path | None = None, cfg: SynthConfig | None = None,
               progress: Progress | None = None, stats: dict[str, dict[str, int]] | None = None,
               enough: Callable[[Task], bool] | None = None) -> list[Task]:  # fmt: skip
    """Validated synthetic tasks for `package` ("NAME==VER") or a local `repo` directory. With
    `stats`, counts of mutants tried and kept per strategy are added to it ("tried", "kept").
    `enough` is called with each single bug kept; when it returns True the run stops there, so
    its tasks are a prefix of the run without it (the curriculum builds a slice this way)."""
    cfg = cfg or SynthConfig()
    say = progress or (lambda _msg: None)
    proto, root = proto_task(package, repo, cfg.extra_deps)
    say("reference runs")
    ref, _good = reference(proto)
    n_combo = int(cfg.max_tasks * cfg.combine_fraction) if cfg.max_tasks >= 4 else 0
    budget = cfg.max_candidates or 4 * cfg.max_tasks
    workers = cfg.workers or min(4, os.cpu_count() or 1)
    singles: list[tuple[Candidate, Task]] = []
    seen: set[str] = set()
    if cfg.max_tasks - n_combo > 0:
        for i, (cand, task) in enumerate(_evaluated(proto, ref, itertools.islice(candidates(root, cfg), budget),
                                                    cfg, workers)):
            say(f"mutant {i + 1} ({len(singles)} kept)")
            _count(stats, cand, task is not None)
            if task is not None:
                singles.append((cand, task))
                seen.add(task.instance_id)
                if enough is not None and enough(task):
                    return [t for _, t in singles]
            if len(singles) >= cfg.max_tasks - n_combo:
                break
    combos: list[Task] = []
    if n_combo > 0 and len(singles) < cfg.max_tasks:
        combo_cands = _combos(root, singles, random.Random(cfg.seed + 1), 3 * n_combo)
        for j, (combo, task) in enumerate(_evaluated(proto, ref, combo_cands, cfg, workers)):
            say(f"combination {j + 1} ({len(combos)} kept)")
            _count(stats, combo, task is not None)
            if task is not None and task.instance_id not in seen:
                combos.append(task)
                seen.add(task.instance_id)
            if len(combos) >= n_combo or len(singles) + len(combos) >= cfg.max_tasks:
                break
    return [t for _, t in singles] + combos


def _evaluated(proto: Task, ref: list[TestRun], cands: Iterable[Candidate], cfg: SynthConfig,
               workers: int) -> Iterator[tuple[Candidate, Task | None]]:
    """(candidate, its task or None) in the candidates' order, up to `workers` mutants running at
    once; the caller stops when it has enough (the mutants still running are waited for)."""
    if workers <= 1:
        for cand in cands:
            yield cand, evaluate(proto, ref, cand, cfg)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="synth") as pool:
        pending: deque = deque()
        try:
            for cand in cands:
                pending.append((cand, pool.submit(evaluate, proto, ref, cand, cfg)))
                if len(pending) >= workers:
                    first, fut = pending.popleft()
                    yield first, fut.result()
            while pending:
                first, fut = pending.popleft()
                yield first, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()
