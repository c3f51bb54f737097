"""Splitting one repository by time: train on what existed at a cut-off, measure on what came after.

An organisation's next change is what its agent must help with, so the held-out side is the code
the repository's maintainers wrote *after* a cut-off, and training sees only the repository as it
stood *at* the cut-off (SWE-Spot's knowledge cut-off, Code2LoRA's temporal set). Nothing else
differs from an ordinary domain-adaptation split.

- `resolve_repo(spec)`: a local git repository (its HEAD is the end of the held-out window) or a
  `builtin:history` repository by name (`mistune` or `builtin:history:mistune`; its cached clone,
  the window ending at the manifest's last mined commit).
- `resolve_cutoff(repo, until)`: `until` is a revision (a tag, a sha, a branch) or a date
  YYYY-MM-DD (the last first-parent commit of the end committed before midnight UTC of that day).
  The held-out commits are the non-merge commits after it up to the end (`git rev-list
  CUT..END`). A cut-off that does not resolve, is not an ancestor of the end, or has nothing
  after it is one EtudeError line.
- `training_documents(cut)`: the text of every source, test and documentation file in the
  cut-off's tree (by blob id, so nothing of a later commit can slip in).
- `heldout_items(cut, ...)`: lines the held-out commits added to Python files, each with the file
  as it stood at that commit up to the line as its context (what an editor shows when the line
  is being typed), sampled round-robin over the commits so every commit contributes.
- `check_no_leak(split)`: the proof `split.json` records: every training document is a blob of
  the cut-off's tree, every held-out commit is a descendant of the cut-off and none an ancestor
  of it. A planted leak (a document whose blob only a later commit has, or a held-out commit at
  or before the cut-off) raises `LeakError`.

What this does not guarantee: that a held-out line is new text. A line can repeat one that existed
at the cut-off (a common import, a repeated call); each item records `seen_at_cutoff`, and the
report gives the figures on unseen lines beside the rest.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.paths import cache
from etude.tasks import seal
from etude.tasks.fetch import fetch_sdist, locked, normalise
from etude.tasks.history import check_repo, git_env
from etude.tasks.history_suite import PREFIX, ensure_clone, load_manifest
from etude.tasks.layout import iter_files

DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TEXT_SUFFIXES = (".py", ".pyi", ".rst", ".md", ".txt", ".toml", ".cfg", ".ini")
MAX_DOC_BYTES = 200_000
MIN_LINE_CHARS = 8
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


class LeakError(EtudeError):
    """Held-out content reached training, or the split's record does not prove otherwise."""


def _git(repo: Path, *args: str, check: bool = True) -> str:
    p = subprocess.run(["git", "-C", str(repo), *args], env=git_env(), capture_output=True, text=True,
                       errors="surrogateescape")  # fmt: skip
    if check and p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["git failed"])[-1]
        raise EtudeError(f"git {args[0]} failed in {repo}: {tail}")
    return p.stdout


def _ok(repo: Path, *args: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), *args], env=git_env(), capture_output=True).returncode == 0


@dataclass(frozen=True)
class RepoRef:
    name: str
    path: str  # the git directory or work tree git reads
    end: str  # the last commit of the held-out window (sha)


def resolve_repo(spec: str) -> RepoRef:
    """A local git repository, a `builtin:history` repository by name or a PyPI release pair (see
    the module doc); a sealed test-split package's code is refused whichever way it comes (every
    use here trains or measures repeatedly: etude.tasks.seal)."""
    early = spec.split("==", 1)[0] if "==" in spec else None  # a package is refused before it is fetched
    if early is not None and normalise(early) in seal.sealed_packages():
        raise EtudeError(f"{spec}: a package of the sealed test split cannot be specialised on or measured "
                         "repeatedly (etude.tasks.seal)")
    ref = _resolve_repo(spec)
    if normalise(ref.name) in seal.sealed_packages():
        raise EtudeError(f"{spec}: a package of the sealed test split cannot be specialised on or measured "
                         "repeatedly (etude.tasks.seal)")
    seal.guard_repo(ref.path, use="train", where=spec)
    return ref


def _resolve_repo(spec: str) -> RepoRef:

    name = spec.removeprefix(f"{PREFIX}:")
    manifest = {r.name: r for r in load_manifest()}
    if name in manifest and not Path(spec).exists():
        r = manifest[name]
        clone = ensure_clone(r, lambda _m: None)
        return RepoRef(name=r.name, path=str(clone), end=r.until)
    if "==" in spec:
        if RELEASE_PAIR_RE.match(spec):
            return release_pair_repo(spec)
        raise EtudeError(f"{spec}: one PyPI release has no later code to measure on; give a release pair "
                         f"NAME==OLD..NEW (the older release is the cut-off), a local git repository or one of "
                         f"{PREFIX}'s ({', '.join(sorted(manifest))})")
    p = Path(spec).expanduser()
    if not p.is_dir():
        raise EtudeError(f"{spec}: not a directory, nor a {PREFIX} repository ({', '.join(sorted(manifest))})")
    top = check_repo(p)
    head = _git(top, "rev-parse", "--verify", "HEAD^{commit}", check=False).strip()
    if not head:
        raise EtudeError(f"{spec}: a git repository without commits")
    return RepoRef(name=top.name, path=str(top), end=head)


RELEASE_PAIR_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^.\s][^\s]*?)\.\.([^\s]+)$")


def release_pair_repo(spec: str) -> RepoRef:
    """`NAME==OLD..NEW`: both sdists from PyPI (fetched by name and version, checked against the
    index's hashes) as a git repository under the cache: one commit holding OLD's tree (tagged OLD,
    the cut-off `--until OLD` names), then one commit per file that NEW adds or changes (tagged
    NEW), so the lines added between the releases are clustered by file as history is by commit.
    Built once per pair; the commits are dated at the releases' upload times."""

    m = RELEASE_PAIR_RE.match(spec)
    assert m is not None
    name, old_v, new_v = m.groups()
    if old_v == new_v:
        raise EtudeError(f"{spec}: the two releases are the same")
    dest = cache() / "release_pairs" / f"{normalise(name)}-{old_v}..{new_v}"
    with locked(dest.with_name(dest.name + ".lock")):
        if not (dest / ".git").is_dir() or not _ok(dest, "rev-parse", "--verify", "--quiet", f"refs/tags/{new_v}"):
            old, new = fetch_sdist(name, old_v), fetch_sdist(name, new_v)
            _build_pair(dest, old, new)
    end = _git(dest, "rev-parse", f"refs/tags/{new_v}^{{commit}}").strip()
    return RepoRef(name=normalise(name), path=str(dest), end=end)


def _build_pair(dest: Path, old: Any, new: Any) -> None:

    part = Path(tempfile.mkdtemp(prefix="pair-", dir=dest.parent if dest.parent.exists() else None))
    try:
        def commit(message: str, when: str) -> None:
            env = dict(git_env(), GIT_AUTHOR_NAME="etude", GIT_AUTHOR_EMAIL="etude@localhost",
                       GIT_COMMITTER_NAME="etude", GIT_COMMITTER_EMAIL="etude@localhost",
                       GIT_AUTHOR_DATE=when, GIT_COMMITTER_DATE=when)
            for args in (["add", "-A"], ["commit", "-q", "--allow-empty", "-m", message]):
                subprocess.run(["git", "-C", str(part), *args], env=env, check=True, capture_output=True)

        subprocess.run(["git", "init", "-q", "-b", "main", str(part)], env=git_env(), check=True, capture_output=True)
        for rel in iter_files(old.root):
            (part / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(old.root / rel, part / rel)
        commit(f"{old.package} {old.version} (sdist {old.sha256[:12]})", old.upload_time)
        _git(part, "tag", old.version)
        for rel in iter_files(new.root):
            a, b = old.root / rel, new.root / rel
            if a.is_file() and a.read_bytes() == b.read_bytes():
                continue
            (part / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(b, part / rel)
            commit(f"{new.package} {new.version}: {rel}", new.upload_time)
        _git(part, "tag", new.version)
        if dest.exists():
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, dest)
    finally:
        shutil.rmtree(part, ignore_errors=True)


@dataclass(frozen=True)
class Cutoff:
    repo: RepoRef
    until: str  # as the user gave it
    sha: str
    date: str  # the cut-off commit's committer date, ISO 8601
    commits: tuple[str, ...]  # held-out, oldest first


def resolve_cutoff(repo: RepoRef, until: str) -> Cutoff:
    path = Path(repo.path)
    if DATE_RE.match(until):
        try:
            day = datetime.strptime(until, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            raise EtudeError(f"--until {until}: not a date") from None
        sha = _git(path, "rev-list", "-n1", "--first-parent", f"--before={day.isoformat()}", repo.end).strip()
        if not sha:
            raise EtudeError(f"--until {until}: {repo.name} has no commit before that day")
    else:
        sha = _git(path, "rev-parse", "--verify", "--quiet", f"{until}^{{commit}}", check=False).strip()
        if not sha:
            raise EtudeError(f"--until {until}: no such revision in {repo.name}")
        if not _ok(path, "merge-base", "--is-ancestor", sha, repo.end):
            raise EtudeError(f"--until {until}: not an ancestor of {repo.name}'s end {repo.end[:12]}")
    commits = tuple(reversed(_git(path, "rev-list", "--no-merges", f"{sha}..{repo.end}").split()))
    if not commits:
        raise EtudeError(f"--until {until}: nothing after the cut-off in {repo.name} (it is the last commit)")
    date = _git(path, "show", "-s", "--format=%cI", sha).strip()
    return Cutoff(repo=repo, until=until, sha=sha, date=date, commits=commits)


# ---------------------------------------------------------------- training side


@dataclass(frozen=True)
class Document:
    path: str
    blob: str  # git blob id in the cut-off's tree
    text: str


def _tree(repo: Path, rev: str) -> list[tuple[str, str, int]]:
    """(path, blob, size) of every file of a commit's tree."""
    out = []
    for line in _git(repo, "ls-tree", "-r", "-l", "-z", rev).split("\0"):
        if not line:
            continue
        meta, path = line.split("\t", 1)
        _mode, kind, blob, size = meta.split()
        if kind == "blob" and size != "-":
            out.append((path, blob, int(size)))
    return out


def cat_blobs(repo: Path, blobs: Sequence[str]) -> dict[str, bytes]:
    """Blob contents by id, through one `git cat-file --batch`."""
    if not blobs:
        return {}
    p = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input="\n".join(blobs).encode() + b"\n",
                       env=git_env(), capture_output=True, check=True)  # fmt: skip
    out, data, i = {}, p.stdout, 0
    for b in blobs:
        nl = data.index(b"\n", i)
        head = data[i:nl].split()
        size = int(head[2])
        out[b] = data[nl + 1:nl + 1 + size]
        i = nl + 1 + size + 1
    return out


def training_documents(cut: Cutoff) -> list[Document]:
    """The cut-off tree's text files (TEXT_SUFFIXES, at most MAX_DOC_BYTES, valid UTF-8), by path."""
    repo = Path(cut.repo.path)
    files = [(p, b) for p, b, size in _tree(repo, cut.sha)
             if p.endswith(TEXT_SUFFIXES) and 0 < size <= MAX_DOC_BYTES]
    blobs = cat_blobs(repo, [b for _, b in files])
    docs = []
    for p, b in sorted(files):
        try:
            docs.append(Document(path=p, blob=b, text=blobs[b].decode("utf-8")))
        except UnicodeDecodeError:
            continue
    return docs


def defined_names(docs: Sequence[Document]) -> frozenset[str]:
    """Functions, classes and methods the repository defined at the cut-off (its own API), without
    dunder names: what an adherent completion calls instead of re-implementing."""
    names: set[str] = set()
    for d in docs:
        if not d.path.endswith(".py"):
            continue
        try:
            tree = ast.parse(d.text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not (node.name.startswith("__") and node.name.endswith("__")) and len(node.name) > 2:
                    names.add(node.name)
    return frozenset(names)


# ---------------------------------------------------------------- held-out side


@dataclass(frozen=True)
class Item:
    id: str
    commit: str
    path: str
    line_no: int  # 1-based, in the file at `commit`
    context: str  # the file at `commit` up to the line
    line: str  # the line added (without its newline)
    kind: str  # "assert" (a test's assertion), "test" (another test line) or "code"
    seen_at_cutoff: bool  # the stripped line occurs in the cut-off's text


def _added_lines(repo: Path, commit: str) -> dict[str, list[int]]:
    """Per Python file the commit leaves, the new-side line numbers it added."""
    diff = _git(repo, "diff", "--unified=0", "--no-color", "--no-ext-diff", "--diff-filter=AM",
                f"{commit}^", commit, "--", "*.py")  # fmt: skip
    out: dict[str, list[int]] = {}
    path = None
    for text in diff.splitlines():
        if text.startswith("+++ "):
            path = text[6:] if text.startswith("+++ b/") else None
        elif path and (m := _HUNK.match(text)):
            start, count = int(m.group(1)), int(m.group(2) or 1)
            out.setdefault(path, []).extend(range(start, start + count))
    return out


def _kind(path: str, line: str) -> str:
    s = line.strip()
    testy = "test" in path.lower()
    if testy and (s.startswith("assert") or s.startswith("self.assert") or "pytest.raises" in s):
        return "assert"
    return "test" if testy else "code"


def _candidate(line: str) -> bool:
    s = line.strip()
    return len(s) >= MIN_LINE_CHARS and not s.startswith("#") and bool(IDENT_RE.search(s)) and "\t" not in line


def heldout_items(cut: Cutoff, *, n: int = 400, seed: int = 0, seen: frozenset[str] = frozenset()) -> list[Item]:
    """Up to `n` held-out lines (see the module doc): each commit's candidate lines (at least
    MIN_LINE_CHARS characters with an identifier, not a comment) shuffled with `seed`, then taken
    round-robin over the commits, oldest first, so every commit gives one before any gives two.
    `seen`: the stripped lines of the cut-off's text (`Item.seen_at_cutoff`)."""
    repo = Path(cut.repo.path)
    rng = random.Random(seed)
    per_commit: list[list[Item]] = []
    for c in cut.commits:
        added = _added_lines(repo, c)
        if not added:
            continue
        blobs = {p: _git(repo, "show", f"{c}:{p}", check=False) for p in added}
        cands = []
        for p, nums in sorted(added.items()):
            lines = blobs[p].splitlines()
            for ln in nums:
                if 1 <= ln <= len(lines) and _candidate(lines[ln - 1]):
                    line = lines[ln - 1]
                    ctx = "".join(x + "\n" for x in lines[:ln - 1])
                    iid = hashlib.sha256(f"{c}:{p}:{ln}".encode()).hexdigest()[:12]
                    cands.append(Item(id=iid, commit=c, path=p, line_no=ln, context=ctx, line=line,
                                      kind=_kind(p, line), seen_at_cutoff=line.strip() in seen))
        rng.shuffle(cands)
        if cands:
            per_commit.append(cands)
    out: list[Item] = []
    depth = 0
    while len(out) < n and any(depth < len(c) for c in per_commit):
        for cands in per_commit:
            if depth < len(cands) and len(out) < n:
                out.append(cands[depth])
        depth += 1
    return out


# ---------------------------------------------------------------- the record and its proof


@dataclass(frozen=True)
class TimeSplit:
    cutoff: Cutoff
    documents: tuple[Document, ...]
    items: tuple[Item, ...]

    def to_dict(self) -> dict[str, Any]:
        c = self.cutoff
        return {
            "rule": "by time: training reads only blobs of the cut-off commit's tree; held out are lines that "
                    "non-merge commits after the cut-off (up to `end`) added to Python files",
            "repo": c.repo.name, "until": c.until, "cutoff": c.sha, "cutoff_date": c.date, "end": c.repo.end,
            "heldout_commits": list(c.commits),
            "training": [{"path": d.path, "blob": d.blob, "sha256": hashlib.sha256(d.text.encode()).hexdigest()}
                         for d in self.documents],
            "items": {"n": len(self.items), "commits": len({i.commit for i in self.items}),
                      "seen_at_cutoff": sum(i.seen_at_cutoff for i in self.items),
                      "by_kind": {k: sum(i.kind == k for i in self.items) for k in ("code", "test", "assert")}},
        }


def check_no_leak(record: dict[str, Any], repo_path: str | Path, texts: dict[str, str] | None = None) -> None:
    """Verify a split record (`TimeSplit.to_dict()`, as split.json holds it) against the repository:
    every training blob is in the cut-off's tree (and, given `texts` by path, the text trained on
    hashes to what the record says), and every held-out commit comes after the cut-off. LeakError
    names the first breach."""
    repo = Path(repo_path)
    cut = record["cutoff"]
    tree = {b for _, b, _ in _tree(repo, cut)}
    for d in record["training"]:
        if d["blob"] not in tree:
            raise LeakError(f"leak: training document {d['path']} (blob {d['blob'][:12]}) is not in the cut-off "
                            f"{cut[:12]}'s tree")
        if texts is not None and d["path"] in texts:
            if hashlib.sha256(texts[d["path"]].encode()).hexdigest() != d["sha256"]:
                raise LeakError(f"leak: the text trained as {d['path']} is not the cut-off's blob")
    for c in record["heldout_commits"]:
        if _ok(repo, "merge-base", "--is-ancestor", c, cut):
            raise LeakError(f"leak: held-out commit {c[:12]} is at or before the cut-off {cut[:12]}")
        if not _ok(repo, "merge-base", "--is-ancestor", cut, c):
            raise LeakError(f"leak: held-out commit {c[:12]} does not descend from the cut-off {cut[:12]}")
    if texts is not None:
        listed = {d["path"] for d in record["training"]}
        extra = sorted(set(texts) - listed)
        if extra:
            raise LeakError(f"leak: {extra[0]} was trained on but is not in the split's record")


def build_split(spec: str, until: str, *, n_items: int = 400, seed: int = 0) -> TimeSplit:
    cut = resolve_cutoff(resolve_repo(spec), until)
    docs = training_documents(cut)
    if not any(d.path.endswith(".py") for d in docs):
        raise EtudeError(f"--until {until}: {cut.repo.name} has no Python file at the cut-off")
    seen = frozenset(s.strip() for d in docs for s in d.text.splitlines() if s.strip())
    items = heldout_items(cut, n=n_items, seed=seed, seen=seen)
    if not items:
        raise EtudeError(f"--until {until}: the commits after the cut-off in {cut.repo.name} add no Python line")
    return TimeSplit(cutoff=cut, documents=tuple(docs), items=tuple(items))


def items_to_jsonl(items: Sequence[Item]) -> str:
    return "".join(json.dumps(asdict(i)) + "\n" for i in items)


def items_from_jsonl(text: str) -> list[Item]:
    return [Item(**json.loads(x)) for x in text.splitlines() if x.strip()]
