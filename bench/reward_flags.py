"""False positives of the reward-hack detectors on honest patches, and recall on the hack corpus.

Honest patches, three sources:
1. the gold patches of the built-in suite (`etude.tasks.builtin_suite`, train + eval): the target
   is 0 flags;
2. upstream release diffs of small packages (PyPI sdists fetched by name+version, sha256 checked
   by etude.tasks.fetch): every changed file the grader would let an agent change (tests, test
   config and interpreter hooks excluded, as `etude.tasks.layout.is_protected_path` says) — a
   stress test, much larger and more varied than any single fix;
3. the hand-written honest corpus in tests/rewards/corpus/honest.

Baseline in the same run: a keyword grep over added lines (the obvious first attempt), on the
same patches, so the figure beside ours shows what the structural checks buy.

    .venv/bin/python bench/reward_flags.py [--build-suite | --no-suite] [--no-releases] [--synth-per-package N]
                                           [--quick] [--out FILE]

Writes bench/results/reward_flags.json through `etude.evals.results.write_result`, with
reward_flags.records.jsonl beside it: one record per patch (its source, whether ours and the
baseline flag it, the detectors that fired, the added lines, each check's milliseconds), from which
`bench/verify.py` recomputes the flagged shares (Wilson intervals), the hack corpus's recall and
the median-time ratio. `--quick` checks only the two hand-written corpora (no suite, no sdists).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from etude.evals.results import write_result
from etude.provenance import provenance
from etude.rewards import detect_hacks
from etude.rewards.diff import parse_diff

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "rewards" / "corpus"
OUT = ROOT / "bench" / "results" / "reward_flags.json"
# (package, old, new): small pure-Python packages with fast test suites (docs/tasks.md).
RELEASES = [
    ("tinydb", "4.8.0", "4.8.2"),
    ("isodate", "0.6.1", "0.7.2"),
    ("xmltodict", "0.13.0", "0.14.2"),
    ("toolz", "0.12.1", "1.0.0"),
    ("python-slugify", "8.0.1", "8.0.4"),
    ("sqlparse", "0.5.0", "0.5.3"),
    ("boltons", "23.1.1", "24.1.0"),
    ("schema", "0.7.5", "0.7.7"),
    ("mistune", "3.0.1", "3.0.2"),
    ("more-itertools", "10.3.0", "10.5.0"),
    # larger, more varied code bases (CLI code with sys.exit, time use, plugins of their own)
    ("click", "8.1.3", "8.1.7"),
    ("attrs", "23.1.0", "23.2.0"),
    ("requests", "2.31.0", "2.32.3"),
    ("jinja2", "3.1.2", "3.1.4"),
    ("flask", "2.3.3", "3.0.0"),
    ("packaging", "23.2", "24.0"),
    ("rich", "13.7.0", "13.7.1"),
    ("httpx", "0.26.0", "0.27.0"),
    ("tomli", "2.0.1", "2.0.2"),
    ("pyparsing", "3.1.1", "3.1.2"),
    ("docutils", "0.20.1", "0.21.2"),
    ("markdown", "3.5.2", "3.6"),
    ("pygments", "2.17.2", "2.18.0"),
    ("urllib3", "2.2.1", "2.2.2"),
]
KEYWORDS = ("pytest", "sys.exit", "os._exit", "__eq__", "skip", "xfail", "random.seed", "time.time", "conftest",
            "sitecustomize", "SystemExit", "assert")  # fmt: skip
console = Console(stderr=True)


def baseline_flags(patch: str) -> list[str]:
    """The keyword grep: any test-looking file touched, or any keyword on an added line."""
    out = []
    for fd in parse_diff(patch):
        if "test" in fd.path.lower():
            out.append(f"{fd.path}: test-like path")
        out += [f"{fd.path}:{n}: {k}" for n, t in fd.added_lines for k in KEYWORDS if k in t]
    return out


def measure(source: str, patches: list[tuple[str, str, object]]) -> list[dict]:
    """One record per (label, patch, task): ours and the baseline, flagged or not, and their times."""
    out = []
    for label, patch, task in patches:
        t0 = time.perf_counter()
        flags = detect_hacks(patch, task)
        ours_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        base = baseline_flags(patch)
        base_ms = (time.perf_counter() - t0) * 1000
        out.append({"source": source, "patch": label, "ours": int(bool(flags)), "baseline": int(bool(base)),
                    "detectors": ",".join(sorted({f.name for f in flags})), "with_task": int(task is not None),
                    "added_lines": sum(len(fd.added_lines) for fd in parse_diff(patch)),
                    "ours_ms": ours_ms, "baseline_ms": base_ms})
    return out


def figures(sources: list[str]) -> dict[str, dict]:
    figs: dict[str, dict] = {}
    for src in sources:
        figs[f"{src}.ours_flagged"] = {"kind": "rate", "of": {"source": src}, "field": "ours"}
        figs[f"{src}.baseline_flagged"] = {"kind": "rate", "of": {"source": src}, "field": "baseline"}
        figs[f"{src}.ours_ms_over_baseline_ms"] = {"kind": "ratio", "num": {"source": src}, "den": {"source": src},
                                                   "field": "ours_ms", "den_field": "baseline_ms", "stat": "median"}
    return figs


def suite_patches(build: bool) -> tuple[list, str | None]:
    """Gold patches of the built-in suite: the packages already built and cached, or with
    `build` the whole suite (slow: it validates every task in the sandbox)."""
    try:
        from etude.tasks import builtin_suite, load_tasks
        from etude.tasks.suite import packages, suite_dir
    except ImportError as e:
        return [], f"etude.tasks.builtin_suite unavailable: {e}"
    tasks, note = {}, None
    if build:
        for split in ("train", "eval"):
            tasks.update({t.instance_id: t for t in builtin_suite(split=split, use="build")})
    else:
        for f in sorted(suite_dir().glob("*.jsonl")):
            tasks.update({t.instance_id: t for t in load_tasks(f)})
        built = {t.source.get("package") for t in tasks.values()}
        missing = [p.name for p in packages("all") if p.name not in built]
        note = f"not built yet (run with --build-suite): {', '.join(missing)}" if missing else None
    return [(f"{t.meta.get('split', '?')}/{i}", t.patch, t) for i, t in sorted(tasks.items())], note


def release_patches(progress: Progress) -> tuple[list, list[str]]:
    from etude.tasks.diffs import tree_diff
    from etude.tasks.fetch import fetch_sdist
    from etude.tasks.layout import is_protected_path, iter_files

    out, errors = [], []
    job = progress.add_task("release diffs", total=len(RELEASES))
    for pkg, old, new in RELEASES:
        try:
            a, b = fetch_sdist(pkg, old).root, fetch_sdist(pkg, new).root
            files = [f for f in set(iter_files(a)) | set(iter_files(b)) if not is_protected_path(f)]
            patch = tree_diff(a, b, files)
            # One patch per file: a gold patch is usually one or a few files, and per-file counts
            # say more than "the release was flagged".
            out += [(f"{pkg} {old}->{new}: {fd}", fd_text, None) for fd, fd_text in _split(patch)]
        except Exception as e:  # noqa: BLE001 - a package PyPI no longer serves must not sink the bench
            errors.append(f"{pkg} {old}->{new}: {type(e).__name__}: {e}")
        progress.advance(job)
    return out, errors


# Candidate enumeration runs libcst over every file and mutator (about a minute per package
# here), so this list stays small.
SYNTH_PACKAGES = ["tinydb==4.8.2", "isodate==0.7.2", "xmltodict==0.14.2", "schema==0.7.7"]


def synth_patches(progress: Progress, per_package: int) -> tuple[list, list[str]]:
    """Gold patches of synthesised bugs (reverse CST mutations), before test validation: the
    same patches `etude tasks synth` would keep, and more."""
    from etude.tasks.fetch import fetch_sdist, parse_spec
    from etude.tasks.synth import SynthConfig, candidates

    out, errors = [], []
    job = progress.add_task("synth gold patches", total=len(SYNTH_PACKAGES) * per_package)
    for spec in SYNTH_PACKAGES:
        try:
            root = fetch_sdist(*parse_spec(spec)).root
            for k, cand in enumerate(candidates(root, SynthConfig(seed=0))):
                if k >= per_package:
                    break
                out.append((f"{spec}: {cand.rel} {'+'.join(cand.mutators)} line {cand.lines[0]}", cand.patch, None))
                progress.advance(job)
        except Exception as e:  # noqa: BLE001 - report and keep going
            errors.append(f"{spec}: {type(e).__name__}: {e}")
    return out, errors


def _split(patch: str) -> list[tuple[str, str]]:
    from etude.tasks.diffs import split_files

    return [(fp.path, fp.text) for fp in split_files(patch)]


def corpus(kind: str) -> list:
    """(name, patch, task) of the hand-written corpus; a task where the manifest gives one."""
    from etude.types import Task

    manifest = json.loads((CORPUS / "expected.json").read_text())
    out = []
    for p in sorted((CORPUS / kind).glob("*.diff")):
        spec = manifest.get(f"{kind}/{p.name}", {}).get("task")
        task = None
        if spec:
            task = Task(
                "corpus", "corpus", "", "", spec.get("test_patch", ""), "", FAIL_TO_PASS=tuple(spec["FAIL_TO_PASS"])
            )
        out.append((p.name, p.read_text(), task))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-suite", action="store_true", help="build the missing suite packages first (slow)")
    ap.add_argument("--no-suite", action="store_true")
    ap.add_argument("--no-releases", action="store_true")
    ap.add_argument(
        "--synth-per-package",
        type=int,
        default=0,
        help="N per package (e.g. 40; about a minute per package); 0 skips synthesised gold patches",
    )
    ap.add_argument("--quick", action="store_true", help="only the hand-written corpora (no suite, no sdists)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if args.quick:
        args.no_suite, args.no_releases, args.synth_per_package = True, True, 0
    started = time.time()
    records: list[dict] = []
    meta: dict = {"keywords": list(KEYWORDS), "sources": {}}
    with Progress(console=console) as progress:
        if not args.no_suite:
            job = progress.add_task("built-in suite", total=None)
            patches, err = suite_patches(args.build_suite)
            records += measure("builtin_suite_gold", patches)
            meta["sources"]["builtin_suite_gold"] = {"error": err}
            progress.update(job, total=1, completed=1)
        if not args.no_releases:
            patches, errors = release_patches(progress)
            records += measure("release_diffs", patches)
            meta["sources"]["release_diffs"] = {"releases": [list(r) for r in RELEASES], "errors": errors}
        if args.synth_per_package:
            patches, errors = synth_patches(progress, args.synth_per_package)
            records += measure("synth_gold", patches)
            meta["sources"]["synth_gold"] = {"packages": SYNTH_PACKAGES, "per_package": args.synth_per_package,
                                             "errors": errors}
    records += measure("honest_corpus", corpus("honest"))
    records += measure("hack_corpus", corpus("hacks"))
    sources = list(dict.fromkeys(r["source"] for r in records))
    for src in sources:
        rows = [r for r in records if r["source"] == src]
        meta["sources"].setdefault(src, {})["ours_by_detector"] = dict(
            Counter(d for r in rows for d in r["detectors"].split(",") if d).most_common())
    prov = provenance(started=started, argv=["bench/reward_flags.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(args.out, figures(sources), records, prov, meta=meta)
    f = doc["figures"]
    for src in sources:
        n = f[f"{src}.ours_flagged"]["n"]
        verb = "caught" if src == "hack_corpus" else "flagged"
        console.print(f"{src}: {n} patches, ours {verb} {f[f'{src}.ours_flagged']['k']}, "
                      f"keyword baseline {verb} {f[f'{src}.baseline_flagged']['k']}"
                      + (f" ({meta['sources'][src]['error']})" if meta["sources"][src].get("error") else ""))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
