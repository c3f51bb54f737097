"""Source distributions from PyPI, by name and version, checked by sha256 and cached.

We read PyPI's simple index in its JSON form (PEP 691), which lists every file with its sha256
and upload time, download the sdist, verify the hash (against the index and, when the caller
pins one, against that too) and unpack it under `etude.paths.cache()/sdists`. Nothing we fetch
is ever committed. What this does not do: build or install anything, or trust an archive's
member paths (members that escape the target or are links are refused).
"""

from __future__ import annotations

import fcntl
import hashlib
import re
import shutil
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError, NotFound
from etude.paths import cache

INDEX_URL = "https://pypi.org/simple"
_SDIST_EXT = (".tar.gz", ".zip", ".tar.bz2", ".tgz")


@dataclass(frozen=True)
class Sdist:
    package: str  # the name as asked for
    version: str
    filename: str
    sha256: str
    upload_time: str  # ISO 8601, from the index
    archive: Path  # the downloaded file (verified)
    root: Path  # the unpacked top directory


def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_spec(spec: str) -> tuple[str, str]:
    """'NAME==VER' -> (NAME, VER); a clear error otherwise."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.!+_-]+)\s*", spec)
    if not m:
        raise EtudeError(f"expected NAME==VERSION, got {spec!r}")
    return m.group(1), m.group(2)


def _index(name: str) -> dict:
    import httpx

    url = f"{INDEX_URL}/{normalise(name)}/"
    try:
        r = httpx.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60, follow_redirects=True)
    except httpx.HTTPError as e:
        raise EtudeError(f"cannot reach PyPI for {name!r}: {e}") from None
    if r.status_code == 404:
        raise NotFound(f"unknown package on PyPI: {name!r}")
    if r.status_code != 200:
        raise EtudeError(f"PyPI answered {r.status_code} for {name!r}")
    return r.json()


def _sdist_entry(name: str, version: str, index: dict) -> dict:
    # sdist names are NAME-VERSION.tar.gz with the name in any normalisation; compare normalised.
    for f in index.get("files", []):
        fn = f["filename"]
        ext = next((e for e in _SDIST_EXT if fn.endswith(e)), None)
        if ext is None:
            continue
        stem_name, _, stem_version = fn[: -len(ext)].rpartition("-")
        if normalise(stem_name) == normalise(name) and stem_version == version:
            return f
    versions = sorted(set(index.get("versions", [])))
    hint = f" (known: {', '.join(versions[-8:])})" if versions else ""
    if version in versions:
        raise NotFound(f"{name}=={version} has no source distribution on PyPI")
    raise NotFound(f"unknown version {name}=={version}{hint}")


def _download(url: str, dest: Path, sha256: str) -> None:
    import httpx

    h = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    try:
        with httpx.stream("GET", url, timeout=120, follow_redirects=True) as r:
            r.raise_for_status()
            with tmp.open("wb") as out:
                for chunk in r.iter_bytes():
                    h.update(chunk)
                    out.write(chunk)
    except httpx.HTTPError as e:
        tmp.unlink(missing_ok=True)
        raise EtudeError(f"download failed for {dest.name}: {e}") from None
    if h.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise EtudeError(f"sha256 mismatch for {dest.name}: got {h.hexdigest()}, expected {sha256}")
    tmp.replace(dest)


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _safe_members(tf: tarfile.TarFile, dest: Path) -> list[tarfile.TarInfo]:
    out = []
    for m in tf.getmembers():
        target = (dest / m.name).resolve()
        if not str(target).startswith(str(dest.resolve())) or m.issym() or m.islnk() or m.isdev():
            continue  # never follow or create anything outside the cache
        out.append(m)
    return out


def _unpack(archive: Path, dest: Path) -> Path:
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for n in zf.namelist():
                if not str((tmp / n).resolve()).startswith(str(tmp.resolve())):
                    raise EtudeError(f"{archive.name}: unsafe member path {n!r}")
            zf.extractall(tmp)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(tmp, members=_safe_members(tf, tmp), filter="data")
    tops = [p for p in tmp.iterdir()]
    if len(tops) != 1 or not tops[0].is_dir():
        raise EtudeError(f"{archive.name}: expected one top-level directory")
    shutil.rmtree(dest, ignore_errors=True)
    tops[0].rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a lock file), across processes and threads alike."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fetch_sdist(package: str, version: str, sha256: str | None = None) -> Sdist:
    """Download (or reuse from cache) and unpack NAME==VERSION's sdist. With `sha256` the archive
    must match it; either way it must match the hash PyPI's index publishes. A first fetch that
    fails (an unknown package or version, a hash mismatch) leaves no folder behind."""
    d = cache() / "sdists" / f"{normalise(package)}-{version}"
    with locked(d.with_name(d.name + ".lock")):
        new = not (d / "meta.txt").is_file()
        try:
            return _fetch(package, version, sha256, d)
        except EtudeError:
            if new:
                shutil.rmtree(d, ignore_errors=True)
            raise


def _fetch(package: str, version: str, sha256: str | None, d: Path) -> Sdist:
    d.mkdir(parents=True, exist_ok=True)
    meta = d / "meta.txt"
    if meta.is_file():
        filename, digest, upload = meta.read_text().split("\n")[:3]
        archive = d / filename
        if archive.is_file() and (sha256 is None or sha256 == digest) and _file_sha256(archive) == digest:
            root = d / "src"
            if not root.is_dir():
                _unpack(archive, root)
            return Sdist(package, version, filename, digest, upload, archive, root)
    entry = _sdist_entry(package, version, _index(package))
    digest = entry["hashes"]["sha256"]
    if sha256 is not None and sha256 != digest:
        raise EtudeError(f"{package}=={version}: pinned sha256 {sha256} differs from PyPI's {digest}")
    archive = d / entry["filename"]
    _download(entry["url"], archive, digest)
    root = _unpack(archive, d / "src")
    upload = entry.get("upload-time") or ""
    meta.write_text(f"{entry['filename']}\n{digest}\n{upload}\n")
    return Sdist(package, version, entry["filename"], digest, upload, archive, root)
