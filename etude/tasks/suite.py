"""The built-in suite: pinned pure-Python packages with fast offline test suites, turned into
validated tasks (synthesised bugs in each, plus release-diff tasks where a pair is listed), split
into train and held-out eval *by package* (no package is in both).

Everything is built on first use and cached per package under cache()/suite/<SUITE_VERSION>/, so a
second call loads JSONL instead of running tests, and an interrupted build resumes where it stopped.
`builtin_suite(split, max_tasks)` builds only the packages it needs to reach `max_tasks`. What this
does not guarantee: the same task count on every machine (a mutant whose tests time out on a slow
machine is dropped there).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from etude.errors import EtudeError
from etude.paths import cache
from etude.tasks import seal
from etude.tasks.fetch import fetch_sdist
from etude.tasks.mine import mine
from etude.tasks.schema import load_tasks, save_tasks
from etude.tasks.synth import SynthConfig, synthesise
from etude.types import Task

SUITE_VERSION = "v1"  # bump when the list or the build changes: old caches are then ignored


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    sha256: str  # of the sdist, checked on every fetch
    split: str  # "train" | "eval"
    synth: int = 25  # synthetic tasks to build
    releases: tuple[tuple[str, str, str], ...] = ()  # (from version, its sha256, to version) to mine


# Test-suite times on this kind of machine, unloaded: isodate 0.2 s, addict 0.1 s, tinydb 0.7 s,
# xmltodict 0.7 s, schema 0.4 s, toolz 1.0 s, slugify 1.2 s, sqlparse 3.2 s, boltons 3.5 s.
PACKAGES: tuple[Package, ...] = (
    Package("tinydb", "4.8.2", "f7dfc39b8d7fda7a1ca62a8dbb449ffd340a117c1206b68c50b1a481fb95181d", "train",
            releases=(("4.8.2", "f7dfc39b8d7fda7a1ca62a8dbb449ffd340a117c1206b68c50b1a481fb95181d", "4.9.0"),)),
    Package("isodate", "0.7.2", "4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6", "train"),
    Package("addict", "2.4.0", "b3b2210e0e067a281f5646c8c5db92e99b7231ea8b0eb5f74dbdf9e259d4e494", "train"),
    Package("xmltodict", "1.0.4", "6d94c9f834dd9e44514162799d344d815a3a4faec913717a9ecbfa5be1bb8e61", "train"),
    Package("toolz", "1.2.0", "9667a038e9d6ecba37995e26cb2f59ec6420b6ad8dd9677de59db9b956b08490", "train"),
    Package("python-slugify", "9.2.0", "cee32948083476013804de1667724fb1362dacb71e47b1d5d92adf8db6ee3298", "train"),
    Package("cachetools", "8.0.2", "30ac523adfc118b51d2b2e7bad8a0ddb31370dfe2700c7f10ca224f36ccf81e0", "train"),
    Package("sqlparse", "0.6.1", "ca722573f848ff2d30e40ea30f53a104b7dea7635ea9285891263eb2c58fb6e7", "train"),
    Package("boltons", "26.2.0", "d39cfd15c1a1c3bd4d705c82252fa9edb8e4f5e8cc039f8e39afac7b1b47e92c", "train"),
    Package("six", "1.17.0", "ff70335d468e7eb6ec65b95b99d3a2836546063f63acc5171de367e834932a81", "train"),
    Package("schema", "0.7.8", "e86cc08edd6fe6e2522648f4e47e3a31920a76e82cce8937535422e310862ab5", "eval"),
    Package("parse", "1.22.4", "706d458feed5a81b02768d3156e8070baf6cee7d150a3a3c0cd43101a875c3b5", "eval",
            releases=(("1.22.3", "7e79bb39c72c3bf1613510fd5cdffe5baa9a7873892bef1d4566f1672c8a42f4", "1.22.4"),)),
    Package("inflection", "0.5.1", "1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417", "eval"),
)  # fmt: skip

Progress = Callable[[str], None]


def suite_dir() -> Path:
    d = cache() / "suite" / SUITE_VERSION
    d.mkdir(parents=True, exist_ok=True)
    return d


def package_file(pkg: Package) -> Path:
    """Where the package's full build of validated tasks is cached (JSONL; absent until built)."""
    return suite_dir() / f"{pkg.name}-{pkg.version}.jsonl"


def _build_package(
    pkg: Package, progress: Progress, synth_n: int | None = None, mine_releases: bool = True
) -> list[Task]:
    fetch_sdist(pkg.name, pkg.version, pkg.sha256)  # the pin is checked before anything runs
    tasks: list[Task] = []
    for v_from, sha, v_to in pkg.releases if mine_releases else ():
        fetch_sdist(pkg.name, v_from, sha)
        try:
            tag = f"{pkg.name} {v_from}->{v_to}"
            tasks += mine(pkg.name, v_from, v_to, progress=lambda m, tag=tag: progress(f"{tag}: {m}"))
        except EtudeError as e:  # a pair that yields nothing is reported, not fatal
            print(f"etude: warning: mining {pkg.name} {v_from}->{v_to}: {e}", file=sys.stderr)
    n = synth_n or pkg.synth
    cfg = SynthConfig(max_tasks=n, seed=0, max_candidates=3 * n)
    tasks += synthesise(f"{pkg.name}=={pkg.version}", cfg=cfg, progress=lambda m: progress(f"{pkg.name}: {m}"))
    return [dataclasses.replace(t, meta={**t.meta, "suite": SUITE_VERSION, "split": pkg.split}) for t in tasks]


def _partial_size(p: Path, full: Path) -> int:
    tail = p.name[len(full.stem + "-first") : -len(".jsonl")]
    return int(tail) if tail.isdigit() else -1


def package_tasks(pkg: Package, progress: Progress | None = None, limit: int | None = None) -> list[Task]:
    """The package's validated tasks, built once and then loaded from cache. With `limit` and no
    full build cached, only that many synthetic tasks are built (and cached apart), so a caller
    that wants a handful of tasks does not wait for the whole package."""
    say = progress or (lambda _m: None)
    full = package_file(pkg)
    if full.is_file():
        return load_tasks(full)
    if limit is not None and limit < pkg.synth:
        # Any earlier partial build at least this big will do (same seed: same first tasks).
        sizes = sorted(
            n for n in (_partial_size(p, full) for p in full.parent.glob(full.stem + "-first*.jsonl")) if n >= limit
        )
        if sizes:
            return load_tasks(full.with_name(full.stem + f"-first{sizes[0]}.jsonl"))[:limit]
        part = full.with_name(full.stem + f"-first{limit}.jsonl")
        tasks = _build_package(pkg, say, synth_n=limit, mine_releases=False)
        save_tasks(tasks, part)
        return tasks
    tasks = _build_package(pkg, say)
    save_tasks(tasks, full)
    return tasks


def packages(split: str) -> list[Package]:
    if split not in ("train", "eval", "all"):
        raise EtudeError(f"split must be train, eval or all, not {split!r}")
    return [p for p in PACKAGES if split == "all" or p.split == split]


def builtin_suite(split: str = "train", max_tasks: int | None = None, progress: Progress | None = None, *,
                  use: str) -> list[Task]:
    """Tasks of one split, building packages (in list order) only until `max_tasks` are had. `use`
    says why (etude.tasks.seal.USES): the eval split is sealed for every use but "final"."""
    seal.guard_split(f"builtin:{split}", use=use, where=f"builtin:{split}")
    out: list[Task] = []
    for pkg in packages(split):
        if max_tasks is not None and len(out) >= max_tasks:
            break
        out += package_tasks(pkg, progress, None if max_tasks is None else max_tasks - len(out))
    return seal.guard(out if max_tasks is None else out[:max_tasks], use=use, where=f"builtin:{split}")


def select_packages(names: list[str] | None) -> list[Package]:
    unknown = sorted(set(names or ()) - {p.name for p in PACKAGES})
    if unknown:
        raise EtudeError(
            f"not in the built-in suite: {', '.join(unknown)} (known: {', '.join(p.name for p in PACKAGES)})"
        )
    return [p for p in PACKAGES if not names or p.name in names]


def build_suite(out_dir: Path, names: list[str] | None = None, progress: Progress | None = None) -> dict:
    """Build every package (or `names`), write train.jsonl / eval.jsonl, return a summary."""
    chosen = select_packages(names)
    by_split: dict[str, list[Task]] = {"train": [], "eval": []}
    counts: dict[str, int] = {}
    for pkg in chosen:
        tasks = package_tasks(pkg, progress)
        by_split[pkg.split] += tasks
        counts[pkg.name] = len(tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, tasks in by_split.items():
        save_tasks(tasks, out_dir / f"{split}.jsonl")
    summary = {"suite": SUITE_VERSION, "per_package": counts, **{s: len(t) for s, t in by_split.items()}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
