"""`builtin:history`: tasks mined from the git history of real, permissively licensed repositories.

What etude ships is a manifest (`history_manifest.json`, written by bench/history.py): per
repository its URL, licence, the range that was mined and, per kept task, the commit and its date.
It ships none of the repositories' code. The first use of a repository clones it once (from its URL,
or from `ETUDE_HISTORY_SOURCES=DIR` holding a git repository DIR/<name>) into
cache()/history/<HISTORY_VERSION>/<name>/repo, then mines each listed commit again with
`etude.tasks.history` (so every task is validated on this machine: gold resolves, base fails) and
caches the tasks there (tasks.jsonl). After that the suite loads offline: the tasks come from the
cache, each base from its snapshot (cache()/archives), and a snapshot that is missing is rebuilt
from the cached clone without the network.

The time split (`builtin:history:before=YYYY-MM-DD`, `:after=YYYY-MM-DD`, or both) filters by the
task's `created_at` (the commit date) against midnight UTC of that day: before is strictly earlier,
after is that day or later, so the two halves of one date never share a task.

What this does not guarantee: the same task count on every machine (a commit whose tests time out
or whose dependencies no longer resolve from the package index is dropped there, and counted on
stderr), or that a repository still exists at its URL (point ETUDE_HISTORY_SOURCES at a copy).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

from etude.errors import EtudeError
from etude.paths import cache
from etude.tasks.history import HistoryConfig, check_repo, git_env, mine_history
from etude.tasks.schema import load_tasks, save_tasks
from etude.tasks.snapshot import archive_path, export_commit, store_tree
from etude.types import Task

HISTORY_VERSION = "v1"  # bump when the build changes: old caches are then ignored
MANIFEST = Path(__file__).with_name("history_manifest.json")
SOURCES_ENV = "ETUDE_HISTORY_SOURCES"
PREFIX = "builtin:history"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class HistoryEntry:
    instance_id: str
    commit: str  # the fixing commit; the task's base is its parent
    created_at: str  # ISO 8601 committer date


@dataclass(frozen=True)
class HistoryRepo:
    name: str
    url: str
    licence: str  # SPDX identifier
    licence_file: str  # its path in the repository
    since: str  # the mined range, exclusive ...
    until: str  # ... to inclusive
    tasks: tuple[HistoryEntry, ...]
    extra_deps: tuple[str, ...] = ()  # test requirements beyond what the project declares
    timeout_s: float = 300.0

    @property
    def slug(self) -> str:
        """owner/name from the URL (the tasks' `repo`)."""
        return "/".join(self.url.rstrip("/").removesuffix(".git").split("/")[-2:])


def load_manifest(path: Path | None = None) -> list[HistoryRepo]:
    path = path or MANIFEST
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise EtudeError(f"cannot read the history manifest {path}: {e}") from e
    out = []
    for r in data.get("repos", []):
        entries = tuple(HistoryEntry(**e) for e in r.get("tasks", []))
        fields = {k: v for k, v in r.items() if k in {f.name for f in dataclasses.fields(HistoryRepo)}}
        out.append(HistoryRepo(**{**fields, "tasks": entries, "extra_deps": tuple(r.get("extra_deps", ()))}))
    return out


def write_manifest(repos: Sequence[HistoryRepo], path: Path = MANIFEST) -> None:
    doc = {"version": HISTORY_VERSION, "repos": [dataclasses.asdict(r) for r in repos]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _day(text: str, key: str, spec: str) -> datetime:
    try:
        d = date.fromisoformat(text)
        if len(text) != 10:
            raise ValueError
    except ValueError:
        raise EtudeError(f"{spec}: {key}={text!r} is not a date (use {key}=YYYY-MM-DD)") from None
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def parse_spec(spec: str) -> tuple[datetime | None, datetime | None]:
    """(before, after) of `builtin:history[:before=YYYY-MM-DD][:after=YYYY-MM-DD]`; one-line
    error for anything else."""
    if spec != PREFIX and not spec.startswith(PREFIX + ":"):
        raise EtudeError(f"not a history suite: {spec!r} (use {PREFIX}[:before=YYYY-MM-DD][:after=YYYY-MM-DD])")
    bounds: dict[str, datetime] = {}
    for part in [p for p in spec.removeprefix(PREFIX).split(":") if p]:
        key, eq, value = part.partition("=")
        if key not in ("before", "after") or not eq:
            raise EtudeError(f"{spec}: unknown filter {part!r} (use before=YYYY-MM-DD or after=YYYY-MM-DD)")
        if key in bounds:
            raise EtudeError(f"{spec}: {key}= given twice")
        bounds[key] = _day(value, key, spec)
    before, after = bounds.get("before"), bounds.get("after")
    if before is not None and after is not None and after >= before:
        raise EtudeError(f"{spec}: after= must be earlier than before= (the range holds no day)")
    return before, after


def committed(created_at: str) -> datetime:
    t = datetime.fromisoformat(created_at)
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).astimezone(UTC)


def in_window(created_at: str, before: datetime | None, after: datetime | None) -> bool:
    t = committed(created_at)
    return (before is None or t < before) and (after is None or t >= after)


def repo_cache(name: str) -> Path:
    return cache() / "history" / HISTORY_VERSION / name


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], env=git_env(), capture_output=True, text=True)


def _has_commit(clone: Path, sha: str) -> bool:
    return _git("-C", str(clone), "cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


def ensure_clone(repo: HistoryRepo, say: Progress, src: Path | None = None) -> Path:
    """The cached clone of `repo` (made once, from `src`, ETUDE_HISTORY_SOURCES/<name> or its URL)."""
    dest = repo_cache(repo.name) / "repo"
    if dest.is_dir() and _has_commit(dest, repo.until):
        return dest
    src_dir = os.environ.get(SOURCES_ENV)
    origin = str(src) if src is not None else str(Path(src_dir) / repo.name) if src_dir else repo.url
    if src is None and src_dir and not Path(origin).is_dir():
        raise EtudeError(f"{SOURCES_ENV}={src_dir} holds no repository {repo.name}/ (a git clone of {repo.url})")
    say(f"cloning {origin}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="clone-", dir=dest.parent) as tmp:
        part = Path(tmp) / "repo"
        r = _git("clone", "--quiet", "--no-checkout", origin, str(part))
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["git clone failed"])[-1]
            raise EtudeError(
                f"cannot clone {origin} for {PREFIX} ({tail}); set {SOURCES_ENV}=DIR with a clone at DIR/{repo.name}"
            )
        if not _has_commit(part, repo.until):
            raise EtudeError(f"{origin} lacks commit {repo.until[:12]} that {PREFIX} was mined from")
        if dest.exists():
            shutil.rmtree(dest)
        part.rename(dest)
    return dest


def _as_builtin(task: Task, repo: HistoryRepo, clone: Path) -> Task:
    source = {**task.source, "repo_dir": str(clone), "url": repo.url, "licence": repo.licence}
    return dataclasses.replace(task, repo=repo.slug, source=source)


def install(repo: HistoryRepo, tasks: Sequence[Task], clone_from: Path) -> Path:
    """Put tasks already mined (bench/history.py) into the cache as this repository's build, with a
    clone of `clone_from`; returns the tasks file."""
    clone = ensure_clone(repo, lambda _m: None, clone_from)
    out = repo_cache(repo.name) / "tasks.jsonl"
    save_tasks([_as_builtin(t, repo, clone) for t in tasks], out)
    _attempted_file(repo).write_text(json.dumps(sorted(t.instance_id for t in tasks)) + "\n")
    return out


def _attempted_file(repo: HistoryRepo) -> Path:
    return repo_cache(repo.name) / "attempted.json"


def _attempted(repo: HistoryRepo) -> set[str]:
    try:
        return set(json.loads(_attempted_file(repo).read_text()))
    except (OSError, json.JSONDecodeError):
        return set()


def _mine_one(clone: Path, repo: HistoryRepo, e: HistoryEntry, say: Progress) -> Task | None:
    cfg = HistoryConfig(since=f"{e.commit}^", until=e.commit, extra_deps=repo.extra_deps, timeout_s=repo.timeout_s)
    try:
        tasks, _ = mine_history(clone, cfg, progress=say)
    except EtudeError as err:
        print(f"etude: {PREFIX}: {e.instance_id} did not validate here ({err})", file=sys.stderr)
        return None
    return tasks[0] if tasks else None


def repo_tasks(repo: HistoryRepo, entries: Sequence[HistoryEntry], progress: Progress | None = None) -> list[Task]:
    """The validated tasks of `entries` (a subset of repo.tasks), building the ones not yet
    attempted on this machine; every base snapshot present (rebuilt from the clone if need be)."""
    say = progress or (lambda _m: None)
    path = repo_cache(repo.name) / "tasks.jsonl"
    by_commit = {e.commit: e.instance_id for e in repo.tasks}
    have: dict[str, Task] = {}
    for t in load_tasks(path) if path.is_file() else []:
        # a task mined here is named after the clone's folder ("repo__<sha>"; etude.tasks.history
        # names tasks after the repository directory): it goes by the manifest's name for its commit
        iid = by_commit.get(str(t.meta.get("commit", "")), t.instance_id)
        have[iid] = t if iid == t.instance_id else dataclasses.replace(t, instance_id=iid)
    todo = [e for e in entries if e.instance_id not in have and e.instance_id not in _attempted(repo)]
    if todo:
        clone = ensure_clone(repo, say)
        for i, e in enumerate(todo, 1):
            t = _mine_one(clone, repo, e, lambda m, i=i: say(f"{repo.name} {i}/{len(todo)}: {m}"))
            if t is not None:
                have[e.instance_id] = dataclasses.replace(_as_builtin(t, repo, clone), instance_id=e.instance_id)
            save_tasks(list(have.values()), path)
            done = _attempted(repo) | {e.instance_id}
            _attempted_file(repo).write_text(json.dumps(sorted(done)) + "\n")
    wanted = [have[e.instance_id] for e in entries if e.instance_id in have]
    return [ensure_base(t, repo) for t in wanted]


def ensure_base(task: Task, repo: HistoryRepo) -> Task:
    """`task` with its base snapshot in the cache: when missing, rebuilt offline from the cached
    clone (the parent commit's tree); if this machine's gzip writes other bytes, the task names the
    new snapshot."""
    sha = str(task.setup["archive"]["sha256"])
    if archive_path(sha).is_file():
        return task
    clone = repo_cache(repo.name) / "repo"
    parent = str(task.setup["archive"]["commit"])
    if not (clone.is_dir() and _has_commit(clone, parent)):
        raise EtudeError(
            f"{task.instance_id}: base snapshot {sha[:12]} is missing and there is no clone of "
            f"{repo.name} in {clone.parent} to rebuild it from; delete that folder to build again"
        )
    with tempfile.TemporaryDirectory(prefix="etude-base-") as tmp:
        new, _ = store_tree(export_commit(check_repo(clone), parent, Path(tmp) / "t"))
    if new == sha:
        return task
    setup = {**task.setup, "archive": {**task.setup["archive"], "sha256": new}}
    return dataclasses.replace(task, setup=setup)


def builtin_history(spec: str = PREFIX, max_tasks: int | None = None, progress: Progress | None = None,
                    manifest: Path | None = None) -> list[Task]:  # fmt: skip
    """The tasks of `builtin:history[:before=D][:after=D]` (see the module doc), repositories in
    manifest order, each one's tasks oldest first; builds only what `max_tasks` needs."""
    before, after = parse_spec(spec)
    out: list[Task] = []
    for repo in load_manifest(manifest or MANIFEST):
        if max_tasks is not None and len(out) >= max_tasks:
            break
        entries = sorted((e for e in repo.tasks if in_window(e.created_at, before, after)), key=lambda e: e.created_at)
        if max_tasks is not None:
            entries = entries[: max_tasks - len(out)]
        if entries:
            out += repo_tasks(repo, entries, progress)
    return out
