"""Mining tasks from a local git repository's history (`etude tasks mine --repo DIR`).

Every commit in range (newest first) is a candidate. Skipped without running anything: merges
(`merge`), root commits (`root-commit`), commits that change no test module (`docs-only` when they
change only documentation, `no-code-change` when they change other files but no Python file, else
`no-tests-changed`) and commits whose non-test part touches no source file (`no-source-change`;
layout.source_files of either side). For the rest, base is the parent's tree, snapshotted into
the cache (etude.tasks.snapshot, `setup["archive"]`) so the task rebuilds without this
repository; gold `patch` is the non-test part of the commit's diff and `test_patch` the test part
(layout.is_test_path). The commit's changed test modules run in the sandbox, twice per state, at
the parent with the commit's tests and at the commit, through the same `run_state` /
`verdict_from_runs` as every other task: a commit is kept when some tests fail before and pass
after (FAIL_TO_PASS), the other tests of those files pass at both (PASS_TO_PASS, at least one) and
no touched test fails after the commit; otherwise `tests-fail-after`, `tests-pass-before`,
`no-pass-to-pass`, `timeout`, `deps-unresolvable` or `patch-does-not-apply`. The statement is
the commit message as written (subject and body), `created_at` the committer date.

The test environment is the commit's declared dependencies (PKG-INFO, pyproject's [project]
dependencies and test extras or dependency groups, setup.cfg's install_requires and test extras),
installed from the package index into a cached venv; the package itself is not installed.
What this does not guarantee: that a commit is a fix rather than a feature or a refactor with
tests, that dependencies declared only in setup.py or a requirements file are installed, or that a
touched test file holding no tests (fixtures only) is not counted as failing.
"""

from __future__ import annotations

import configparser
import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from etude.errors import EtudeError
from etude.tasks import diffs, layout
from etude.tasks.fetch import normalise
from etude.tasks.repo import task_env, template_dir
from etude.tasks.runner import TestRun
from etude.tasks.snapshot import archive_path, export_commit, store_tree
from etude.tasks.validate import hang_timeout, run_state, verdict_from_runs
from etude.types import Task

Progress = Callable[[str], None]
_TEST_EXTRAS = ("test", "tests", "testing")


@dataclass
class HistoryConfig:
    """Knobs of one history-mining run."""

    max_tasks: int | None = None
    """Stop after this many kept tasks (None: scan the whole range)."""
    since: str | None = None
    """Only commits not reachable from this revision (exclusive)."""
    until: str = "HEAD"
    """The newest commit of the range (inclusive)."""
    runs: int = 2
    """Runs of each state (at least 2: flaky tests are excluded)."""
    timeout_s: float = 300.0
    """Wall-clock limit of one test run at the commit; at the parent, 5x its time (at least 60 s)."""
    extra_deps: tuple[str, ...] = ()
    """Requirements the tests need beyond what the project declares."""


def git_env() -> dict[str, str]:
    """The environment without the variables that would point git at another repository."""
    drop = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")
    return {k: v for k, v in os.environ.items() if k not in drop}


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], env=git_env(), capture_output=True, text=True,
                          errors="surrogateescape")  # fmt: skip
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["git failed"]
        raise EtudeError(f"git {args[0]} failed in {repo}: {tail[0]}")
    return proc.stdout


def check_repo(repo: Path) -> Path:
    """The repository's top-level directory, resolved; one clear error when `repo` is not one."""
    if not repo.is_dir():
        raise EtudeError(f"not a git repository (not a directory): {repo}")
    top = repo.resolve()
    env = dict(git_env(), GIT_CEILING_DIRECTORIES=str(top.parent))
    proc = subprocess.run(["git", "-C", str(top), "rev-parse", "--show-toplevel"], env=env, capture_output=True,
                          text=True)  # fmt: skip
    if proc.returncode != 0 or Path(proc.stdout.strip()).resolve() != top:
        raise EtudeError(f"not a git repository (give the top-level directory of a work tree): {repo}")
    return top


def commits(repo: Path, since: str | None, until: str) -> list[tuple[str, list[str]]]:
    """(sha, parent shas) of the range, newest first; an error when a revision or the range names
    no commit."""
    for rev in [r for r in (since, until) if r]:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", "--end-of-options",
                               f"{rev}^{{commit}}"], env=git_env(), capture_output=True, text=True)  # fmt: skip
        if proc.returncode != 0:
            raise EtudeError(f"{rev!r} names no commit in {repo}")
    spec = f"{since}..{until}" if since else until
    rows = [line.split() for line in _git(repo, "rev-list", "--parents", spec, "--").splitlines() if line.strip()]
    if not rows:
        raise EtudeError(f"the range {spec} names no commit in {repo}")
    return [(r[0], r[1:]) for r in rows]


def _usable(lines: Sequence[str], project: str) -> list[str]:
    """Requirement strings that hold for this interpreter (markers as layout.declared_requirements),
    without test tooling or the project itself."""
    from packaging.requirements import InvalidRequirement, Requirement

    out = []
    for line in lines:
        try:
            req = Requirement(line.split("#", 1)[0].strip())
        except InvalidRequirement:
            continue
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *_TEST_EXTRAS)):
            continue
        req.marker = None
        name = layout.normalise_name(req.name)
        if name not in layout._TOOLING and name != layout.normalise_name(project):
            out.append(str(req))
    return out


def _pyproject(root: Path) -> tuple[str, list[str]]:
    try:
        data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return "", []
    proj, groups = data.get("project") or {}, data.get("dependency-groups") or {}
    lines = list(proj.get("dependencies") or [])
    for e in _TEST_EXTRAS:
        lines += (proj.get("optional-dependencies") or {}).get(e) or []
        lines += [g for g in groups.get(e) or [] if isinstance(g, str)]
    return str(proj.get("name") or ""), [x for x in lines if isinstance(x, str)]


def _setup_cfg(root: Path) -> tuple[str, list[str]]:
    cp = configparser.ConfigParser(interpolation=None)
    try:
        cp.read_string((root / "setup.cfg").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, configparser.Error):
        return "", []
    lines = cp.get("options", "install_requires", fallback="").splitlines()
    for e in _TEST_EXTRAS:
        lines += cp.get("options.extras_require", e, fallback="").splitlines()
    return cp.get("metadata", "name", fallback=""), lines


def requirements(root: Path) -> list[str]:
    """The tree's declared runtime and test requirements (see the module docstring)."""
    (n1, pp), (n2, cfg) = _pyproject(root), _setup_cfg(root)
    project = n1 or n2
    return sorted(set(layout.declared_requirements(root)) | set(_usable([*pp, *cfg], project)))


def _is_test_module(rel: str) -> bool:
    name = PurePosixPath(rel).name
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _changed(repo: Path, parent: str, sha: str) -> list[str]:
    out = _git(repo, "diff-tree", "-r", "--no-renames", "--name-only", "-z", parent, sha)
    return sorted(p for p in out.split("\0") if p)


def _diff(repo: Path, parent: str, sha: str) -> tuple[str, str]:
    """(patch, test_patch): the commit's diff without and with only its test files."""
    full = _git(repo, "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false", "-c", "core.quotepath=off",
                "diff", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames", "--binary", "--full-index",
                parent, sha)  # fmt: skip
    files = diffs.split_files(full)
    return diffs.join(f for f in files if not layout.is_test_path(f.path)), diffs.join(
        f for f in files if layout.is_test_path(f.path)
    )


_DOC_SUFFIXES = {".md", ".rst", ".txt", ".adoc"}


def _is_doc(rel: str) -> bool:
    p = PurePosixPath(rel)
    return p.parts[0] in {"docs", "doc"} or p.suffix.lower() in _DOC_SUFFIXES or (not p.suffix and p.name.isupper())


def _cheap_reason(changed: list[str]) -> str | None:
    """A skip reason visible from the changed paths alone."""
    if any(layout.is_test_path(p) for p in changed):
        return None
    if any(p.endswith(".py") for p in changed):
        return "no-tests-changed"
    return "docs-only" if all(_is_doc(p) for p in changed) else "no-code-change"


@dataclass(frozen=True)
class CommitOutcome:
    """What became of one scanned commit (bench/history.py keeps one record per commit)."""

    commit: str
    outcome: str  # "kept" or the skip reason
    build_s: float | None = None  # exporting the trees, the snapshot and the test environment
    validate_s: float | None = None  # the test runs at the commit and at the parent
    task: Task | None = None  # the kept task (so a caller can save each as it comes)


@dataclass(frozen=True)
class _Candidate:
    proto: Task
    targets: list[str]
    new_archive: bool
    new_template: bool


def _candidate(repo: Path, sha: str, parent: str, changed: list[str], cfg: HistoryConfig,
               scratch: Path) -> _Candidate | str:  # fmt: skip
    """The proto task of one commit (base snapshotted), or why it is skipped."""
    old, new = export_commit(repo, parent, scratch / "parent"), export_commit(repo, sha, scratch / "commit")
    src = set(layout.source_files(old)) | set(layout.source_files(new))
    if not any(p in src for p in changed if not layout.is_test_path(p)):
        return "no-source-change"
    targets = [p for p in changed if layout.is_test_path(p) and _is_test_module(p) and (new / p).is_file()]
    if not targets:
        return "no-tests-changed"
    patch, test_patch = _diff(repo, parent, sha)
    archive, fresh = store_tree(old)
    proto = _proto(repo, sha, parent, patch, test_patch, new, archive, targets, cfg)
    return _Candidate(proto, targets, fresh, not template_dir(proto).exists())


def _proto(repo: Path, sha: str, parent: str, patch: str, test_patch: str, new: Path, archive: str,
           targets: list[str], cfg: HistoryConfig) -> Task:  # fmt: skip
    name = normalise(repo.name)
    setup = {
        "archive": {"sha256": archive, "commit": parent},
        "base_patch": "",
        "pythonpath": layout.import_root(new),
        "test_paths": layout.test_paths(new),
        "test_deps": sorted(set(requirements(new)) | set(cfg.extra_deps)),
    }
    return Task(
        instance_id=f"{name}__{sha[:12]}",
        repo=f"local/{name}",
        base_commit=parent,
        patch=patch,
        test_patch=test_patch,
        problem_statement=_git(repo, "log", "-1", "--format=%B", sha).strip(),
        created_at=_git(repo, "log", "-1", "--format=%cI", sha).strip(),
        version=parent[:12],
        environment_setup_commit=parent,
        source={"repo_dir": str(repo), "commit": sha, "parent": parent},
        strategy="history",
        test_cmd="python -m pytest " + " ".join(targets),
        timeout_s=cfg.timeout_s,
        setup=setup,
        meta={"commit": sha, "test_files": targets},
    )


def _file(test_id: str) -> str:
    return test_id.split("::", 1)[0]


def _fails_after(gold: Sequence[TestRun], targets: Sequence[str]) -> bool:
    """A touched test file reports nothing at the commit (it did not import), or a test fails in
    every run there."""
    seen = {_file(t) for r in gold for t in r.status}
    if any(f not in seen for f in targets):
        return True
    ids = set().union(*(r.status for r in gold))
    return any(all(r.status.get(t) in ("failed", "error") for r in gold) for t in ids)


_VERDICT_REASON = {"timed out": "timeout", "no FAIL_TO_PASS test": "tests-pass-before",
                   "no PASS_TO_PASS test": "no-pass-to-pass"}  # fmt: skip


def _judge(c: _Candidate, cfg: HistoryConfig, say: Progress, times: dict[str, float]) -> Task | str:
    """Run the commit's test files at both states and validate; the task or why it is skipped.
    `times` gains build_s (the test environment) and validate_s (the test runs)."""
    proto, t0 = c.proto, time.monotonic()
    try:
        task_env(proto)
    except EtudeError:
        return "deps-unresolvable"
    finally:
        times["build_s"] = times.get("build_s", 0.0) + time.monotonic() - t0
    t0 = time.monotonic()
    try:
        return _validate(c, cfg, say, t0)
    finally:
        times["validate_s"] = time.monotonic() - t0


def _validate(c: _Candidate, cfg: HistoryConfig, say: Progress, t0: float) -> Task | str:
    proto = c.proto
    try:
        say("tests at the commit")
        gold = run_state(proto, [proto.test_patch, proto.patch], cfg.runs, c.targets)
        if any(r.timed_out for r in gold):
            return "timeout"
        if _fails_after(gold, c.targets):
            return "tests-fail-after"
        say("tests at the parent")
        base = run_state(proto, [proto.test_patch], cfg.runs, c.targets, hang_timeout(gold, proto))
    except EtudeError as e:
        if str(e).startswith("patch does not apply"):
            return "patch-does-not-apply"
        raise
    v = verdict_from_runs(proto, base, gold, time.monotonic() - t0)
    if not v.kept or v.task is None:
        return _VERDICT_REASON.get(v.reason, "tests-fail-after")
    return dataclasses.replace(v.task, meta={**v.task.meta, "wall_s": round(v.wall_s, 2)})


def summary(scanned: int, kept: int, skipped: Counter) -> str:
    """One line: commits scanned, tasks kept, skips by reason (most frequent first)."""
    why = ", ".join(f"{k} {n}" for k, n in sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"scanned {scanned} commit(s), kept {kept}" + (f"; skipped: {why}" if why else "")


def mine_history(repo: Path, cfg: HistoryConfig | None = None, progress: Progress | None = None,
                 on_commit: Callable[[CommitOutcome], None] | None = None) -> tuple[list[Task], Counter]:  # fmt: skip
    """Validated tasks from the repository's commits and the skip counts by reason; an error
    (exit 2) for a path that is not a git repository, a range that names no commit, or when no
    commit could be mined. Snapshots and templates this run created for commits it did not keep
    are removed again; nothing that was already cached is changed. `on_commit` hears what became
    of each scanned commit, with its build and validation seconds."""
    cfg = cfg or HistoryConfig()
    if cfg.runs < 2:
        raise EtudeError("validation needs at least two runs of each state")
    top = check_repo(repo)
    rows = commits(top, cfg.since, cfg.until)
    say = progress or (lambda _msg: None)
    tasks: list[Task] = []
    skipped: Counter = Counter()
    created: list[_Candidate] = []
    scanned = 0
    try:
        for i, (sha, parents) in enumerate(rows, 1):
            if cfg.max_tasks is not None and len(tasks) >= cfg.max_tasks:
                break
            scanned += 1
            times: dict[str, float] = {}
            result = _one(top, sha, parents, cfg, _prefixed(say, f"commit {i}/{len(rows)} {sha[:10]}"), created, times)
            if isinstance(result, str):
                skipped[result] += 1
            else:
                tasks.append(result)
            if on_commit is not None:
                kept = None if isinstance(result, str) else result
                on_commit(CommitOutcome(sha, "kept" if kept else str(result), times.get("build_s"),
                                        times.get("validate_s"), kept))  # fmt: skip
    finally:
        _discard(created, tasks)
    if not tasks:
        raise EtudeError(f"nothing could be mined from {repo}: {summary(scanned, 0, skipped)}")
    return tasks, skipped


def _prefixed(say: Progress, prefix: str) -> Progress:
    return lambda msg: say(f"{prefix}: {msg}")


def _one(repo: Path, sha: str, parents: list[str], cfg: HistoryConfig, say: Progress,
         created: list[_Candidate], times: dict[str, float]) -> Task | str:  # fmt: skip
    if len(parents) != 1:
        return "merge" if parents else "root-commit"
    changed = _changed(repo, parents[0], sha)
    reason = _cheap_reason(changed)
    if reason is not None:
        return reason
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="etude-history-") as tmp:
        say("exporting trees")
        c = _candidate(repo, sha, parents[0], changed, cfg, Path(tmp))
    times["build_s"] = time.monotonic() - t0
    if isinstance(c, str):
        return c
    created.append(c)
    return _judge(c, cfg, say, times)


def _discard(created: Sequence[_Candidate], kept: Sequence[Task]) -> None:
    """Remove the snapshots and templates this run made that no kept task uses."""
    used = {t.setup["archive"]["sha256"] for t in kept}
    for c in created:
        sha = c.proto.setup["archive"]["sha256"]
        if sha in used:
            continue
        if c.new_template:
            d = template_dir(c.proto)
            shutil.rmtree(d, ignore_errors=True)
            d.with_name(d.name + ".lock").unlink(missing_ok=True)
        if c.new_archive:
            archive_path(sha).unlink(missing_ok=True)
