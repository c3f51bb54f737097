"""Tasks mined from real histories: what `etude tasks mine --repo` keeps, why it skips the rest, and
what it costs; the source of `builtin:history`.

Three steps, each resumable (the mining of one repository is one unit of work; a repository already
mined in WORK is not mined again):

    # 1. mine each repository of REPOS from a local clone SRC/<name> (CPU-bound: run it niced;
    #    one process per repository, or one for all)
    nice -n 19 python bench/history.py mine --src /path/to/clones --work runs/history
    # 1b. (only after stopping `mine` part way) close those repositories with the commits scanned
    python bench/history.py finish --src /path/to/clones --work runs/history
    # 2. write bench/results/history.json (+ records) and etude/tasks/history_manifest.json, and
    #    put the mined tasks into this machine's cache as the build of builtin:history
    python bench/history.py report --src /path/to/clones --work runs/history --install --manifest \
        [--oracle RUN]  # RUN: etude eval --model oracle of the mined tasks; what it cannot resolve is left out
    # 3. (optional, heavy) resolved rates: `etude eval --suite builtin:history` per model
    python bench/history.py report --work runs/history --models base=smollm2,warm=PATH[,spec=PATH] \
        [--agent-config configs/agent_sft.toml] [--backend auto] [--workers 16]  # run it in .venv-vllm

Records (one per scanned commit): repo, commit, created_at, outcome ("kept" or the skip reason),
kept (0/1), candidate (1 when the commit reached the build: trees exported and snapshotted), and
build_s / validate_s where measured; with --models, one record per (model, task) with resolved.
Figures per repository: kept rate over the commits scanned, mean build and validation seconds per
candidate commit; per model and repository, the resolved rate (Wilson intervals). Skip counts by
reason are in meta (recountable from the records' outcome).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etude.evals.results import write_result
from etude.pipeline.learning import EvalSetup, eval_harness, evaluate
from etude.policy import resolve_backend
from etude.provenance import provenance
from etude.tasks.fetch import normalise
from etude.tasks.history import CommitOutcome, HistoryConfig, mine_history, summary
from etude.tasks.history_suite import MANIFEST, HistoryEntry, HistoryRepo, install, write_manifest
from etude.tasks.schema import load_tasks, save_tasks, task_to_dict

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "repos": "dict",
    "resolved_rates": "str",
    "evaluation": "dict",
    "oracle_unresolved": "dict",
    "tasks": "int",
    "tasks_per_repo": "dict",
}

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Source:
    """One repository to mine: licence checked by hand in its LICENSE file at `until`."""

    name: str
    url: str
    licence: str
    licence_file: str
    until: str  # the newest commit mined (full sha: the range is fixed)
    commits: int  # how many commits back from `until` the range reaches
    max_tasks: int = 30
    extra_deps: tuple[str, ...] = ()


# None of these is in a built-in split (etude.tasks.curriculum.BUILTIN, etude.tasks.suite.PACKAGES).
REPOS: tuple[Source, ...] = (
    Source("pydash", "https://github.com/dgilland/pydash", "MIT", "LICENSE.rst",
           "3585eb2", 400, extra_deps=("pytest-cov",)),  # in its dev extra; not needed (the runner clears addopts)
    Source("mistune", "https://github.com/lepture/mistune", "BSD-3-Clause", "LICENSE",
           "b5dd994", 400),
    Source("python-dotenv", "https://github.com/theskumar/python-dotenv", "BSD-3-Clause", "LICENSE",
           "bca6644", 300, extra_deps=("click", "sh")),  # its CLI tests; requirements.txt only
    Source("validators", "https://github.com/python-validators/validators", "MIT", "LICENSE.txt",
           "9bc7e82", 300),
    Source("more-itertools", "https://github.com/more-itertools/more-itertools", "MIT", "LICENSE",
           "2fe1b2e", 300),
    Source("marshmallow", "https://github.com/marshmallow-code/marshmallow", "MIT", "LICENSE",
           "341b927f", 300, extra_deps=("pytz", "simplejson")),  # test extras only in setup.py before 2022
)  # fmt: skip


def _sha(clone: Path, rev: str) -> str:
    out = subprocess.run(["git", "-C", str(clone), "rev-parse", "--verify", f"{rev}^{{commit}}"],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"bench/history.py: {clone} has no commit {rev}")
    return out.stdout.strip()


def _since(clone: Path, until: str, n: int) -> str | None:
    """The commit n first-parent steps before `until` (None: the range reaches the root)."""
    out = subprocess.run(["git", "-C", str(clone), "rev-parse", "--verify", "--quiet", f"{until}~{n}"],
                         capture_output=True, text=True)  # fmt: skip
    return out.stdout.strip() or None


def mine_one(src: Source, clone: Path, work: Path) -> None:
    """Mine one repository into WORK/<name>.{records,tasks}.jsonl and WORK/<name>.json (its range)."""
    until = _sha(clone, src.until)
    since = _since(clone, until, src.commits)
    cfg = HistoryConfig(max_tasks=src.max_tasks, since=since, until=until, extra_deps=src.extra_deps)
    rec_path, part_path = work / f"{src.name}.records.jsonl", work / f"{src.name}.tasks.partial.jsonl"
    rec_path.unlink(missing_ok=True)
    part_path.unlink(missing_ok=True)
    dates = {}

    def on_commit(o: CommitOutcome) -> None:
        if o.commit not in dates:
            dates[o.commit] = subprocess.run(["git", "-C", str(clone), "log", "-1", "--format=%cI", o.commit],
                                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        r: dict[str, Any] = {"kind": "commit", "repo": src.name, "commit": o.commit, "created_at": dates[o.commit],
                             "outcome": o.outcome, "kept": int(o.outcome == "kept"),
                             "candidate": int(o.build_s is not None)}  # fmt: skip
        if o.build_s is not None:
            r["build_s"] = round(o.build_s, 3)
        if o.validate_s is not None:
            r["validate_s"] = round(o.validate_s, 3)
        with rec_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        if o.task is not None:  # kept as it comes: an interrupted run keeps its tasks (see `finish`)
            with part_path.open("a") as f:
                f.write(json.dumps(task_to_dict(o.task), ensure_ascii=False) + "\n")
        print(f"[{src.name}] {o.commit[:10]} {o.outcome}", file=sys.stderr, flush=True)

    t0 = time.time()
    try:
        tasks, skipped = mine_history(clone, cfg, on_commit=on_commit)
    except Exception as e:  # noqa: BLE001 - nothing mined is a result too
        tasks, skipped = [], Counter()
        print(f"[{src.name}] {e}", file=sys.stderr)
    save_tasks(tasks, work / f"{src.name}.tasks.jsonl")
    info = {"since": since or "", "until": until, "wall_s": round(time.time() - t0, 1), "kept": len(tasks)}
    (work / f"{src.name}.json").write_text(json.dumps(info, indent=1) + "\n")
    part_path.unlink(missing_ok=True)
    print(f"[{src.name}] {summary(len(tasks) + sum(skipped.values()), len(tasks), skipped)}", file=sys.stderr)


def finish_one(src: Source, clone: Path, work: Path, revalidate: bool) -> None:
    """Close a repository whose mining was stopped part way: its range is marked `interrupted` (the
    commits past the last record were not scanned); its tasks file holds the tasks saved as they
    came, plus, with `revalidate`, each other kept commit validated again. A kept commit without a
    task still enters the manifest (from its record): builtin:history validates every commit again
    on first use anyway."""
    rows = _read_records(work / f"{src.name}.records.jsonl")
    part = work / f"{src.name}.tasks.partial.jsonl"
    have = {t.meta["commit"]: t for t in load_tasks(part)} if part.is_file() else {}
    for r in rows:
        if revalidate and r["kept"] and r["commit"] not in have:
            cfg = HistoryConfig(since=f"{r['commit']}^", until=r["commit"], extra_deps=src.extra_deps)
            have.update({t.meta["commit"]: t for t in mine_history(clone, cfg)[0]})
    tasks = [have[r["commit"]] for r in rows if r["kept"] and r["commit"] in have]
    save_tasks(tasks, work / f"{src.name}.tasks.jsonl")
    until = _sha(clone, src.until)
    info = {"since": _since(clone, until, src.commits) or "", "until": until, "wall_s": None,
            "kept": sum(r["kept"] for r in rows), "interrupted": True,
            "last_scanned": rows[-1]["commit"] if rows else None}  # fmt: skip
    (work / f"{src.name}.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"[{src.name}] finished: {len(tasks)} task(s) of {info['kept']} kept commits", file=sys.stderr)


def _read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def oracle_records(runs: list[Path]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """One record per task of `etude eval --model oracle` runs on the mined tasks, and why each
    unresolved one failed (the hack flags that voided it, else the failing tests)."""
    recs, why = [], {}
    for run in runs:
        for r in _read_records(run / "results.jsonl"):
            iid = str(r["instance_id"])
            recs.append({"kind": "oracle", "repo": iid.split("__", 1)[0], "task": iid,
                         "resolved": int(bool(r.get("resolved")))})  # fmt: skip
            if not r.get("resolved"):
                flags = sorted({f["name"] for f in r.get("flags") or [] if f.get("voids")})
                o = r.get("outcome") or {}
                failing = [t for part in ("fail_to_pass", "pass_to_pass") for t, v in (o.get(part) or {}).items()
                           if v != "passed"]  # fmt: skip
                why[iid] = ("flagged: " + ", ".join(flags)) if flags else ("failing: " + ", ".join(failing[:3]))
    return recs, why


def history_repo(src: Source, work: Path, drop: set[str] = frozenset()) -> HistoryRepo | None:
    info_path = work / f"{src.name}.json"
    if not info_path.is_file():
        return None
    info = json.loads(info_path.read_text())
    tasks = load_tasks(work / f"{src.name}.tasks.jsonl") if (work / f"{src.name}.tasks.jsonl").is_file() else []
    found = {t.instance_id: (t.meta["commit"], t.created_at) for t in tasks}
    for r in _read_records(work / f"{src.name}.records.jsonl"):  # kept, but its task not saved (`finish`)
        if r["kept"]:
            found.setdefault(f"{normalise(src.name)}__{r['commit'][:12]}", (r["commit"], r["created_at"]))
    entries = tuple(sorted((HistoryEntry(iid, c, d) for iid, (c, d) in found.items() if iid not in drop),
                           key=lambda e: e.created_at))  # fmt: skip
    return HistoryRepo(src.name, src.url, src.licence, src.licence_file, info["since"], info["until"], entries,
                       src.extra_deps)  # fmt: skip


def model_records(models: dict[str, str], work: Path, setup: EvalSetup) -> list[dict[str, Any]]:
    """`etude eval --suite builtin:history` of each model, every one with the same harness and
    engine (`setup`: the warm start's harness, greedy); one record per (model, task)."""
    out = []
    for arm, model in models.items():
        run = work / "eval" / arm
        _, line = evaluate("builtin:history", model, run, setup, use="final")
        print(f"{arm}: {line}")
        for r in _read_records(run / "results.jsonl"):
            repo = str(r.get("instance_id", "")).split("__", 1)[0]
            out.append(
                {
                    "kind": "eval",
                    "arm": arm,
                    "repo": repo,
                    "task": r.get("instance_id"),
                    "resolved": int(bool(r.get("resolved"))),
                }
            )
    return out


def report(args: argparse.Namespace, started: float) -> None:
    work = Path(args.work)
    chosen = [s for s in REPOS if (work / f"{s.name}.json").is_file()]
    records = [r for s in chosen for r in _read_records(work / f"{s.name}.records.jsonl")]
    figures: dict[str, dict[str, Any]] = {"kept_rate": {"kind": "rate", "of": {"kind": "commit"}, "field": "kept"}}
    meta: dict[str, Any] = {"repos": {}, "resolved_rates": "not run" if not args.models else "run"}
    for s in chosen:
        rows = [r for r in records if r["repo"] == s.name]
        if not rows:
            continue
        figures[f"{s.name}.kept_rate"] = {"kind": "rate", "of": {"kind": "commit", "repo": s.name}, "field": "kept"}
        if any(r["candidate"] for r in rows):
            figures[f"{s.name}.build_s"] = {"kind": "mean", "of": {"repo": s.name, "candidate": 1}, "field": "build_s"}
        if any("validate_s" in r for r in rows):
            figures[f"{s.name}.validate_s"] = {"kind": "mean", "of": {"repo": s.name, "validated": 1},
                                               "field": "validate_s"}  # fmt: skip
        info = json.loads((work / f"{s.name}.json").read_text())
        meta["repos"][s.name] = {"url": s.url, "licence": s.licence, "licence_file": s.licence_file,
                                 "since": info["since"], "until": info["until"], "mine_wall_s": info["wall_s"],
                                 "interrupted": bool(info.get("interrupted")), "last_scanned": info.get("last_scanned"),
                                 "scanned": len(rows), "kept": sum(r["kept"] for r in rows),
                                 "skipped": dict(Counter(r["outcome"] for r in rows if not r["kept"]).most_common()),
                                 "kept_dates": [min((r["created_at"] for r in rows if r["kept"]), default=None),
                                                max((r["created_at"] for r in rows if r["kept"]), default=None)]}  # fmt: skip
    for r in records:
        r["validated"] = int("validate_s" in r)  # before any eval record joins
    if args.models:
        models = dict(kv.split("=", 1) for kv in args.models.split(","))
        backend = resolve_backend(args.backend)
        setup = EvalSetup(harness=eval_harness(args.agent_config), workers=args.workers, backend=backend)
        recs = model_records(models, work, setup)
        records += recs
        meta["evaluation"] = {"agent_config": args.agent_config, "temperature": 0.0, "backend": backend,
                              "workers": args.workers, "models": models}
        for arm in models:
            figures[f"{arm}.resolved"] = {"kind": "rate", "of": {"kind": "eval", "arm": arm}, "field": "resolved"}
        for arm in list(models)[1:]:  # each later model against the first, paired on the task
            first = next(iter(models))
            figures[f"{arm}_vs_{first}"] = {"kind": "paired", "a": {"kind": "eval", "arm": first},
                                            "b": {"kind": "eval", "arm": arm}, "key": "task", "field": "resolved",
                                            "family": "models"}  # fmt: skip
        for arm in models:
            for s in chosen:
                if any(r.get("arm") == arm and r["repo"] == s.name for r in recs):
                    figures[f"{arm}.{s.name}.resolved"] = {"kind": "rate", "of": {"arm": arm, "repo": s.name},
                                                           "field": "resolved"}  # fmt: skip
    drop: set[str] = set()
    if args.oracle:  # the gold patch through the real harness and grader, hack defences included
        recs, why = oracle_records([Path(d) for d in args.oracle.split(",")])
        records += recs
        figures["oracle.resolved"] = {"kind": "rate", "of": {"kind": "oracle"}, "field": "resolved"}
        drop = set(why)
        meta["oracle_unresolved"] = why
    repos = [h for s in chosen if (h := history_repo(s, work, drop)) is not None and h.tasks]
    meta["tasks"] = sum(len(h.tasks) for h in repos)
    meta["tasks_per_repo"] = {h.name: len(h.tasks) for h in repos}
    if args.manifest:
        write_manifest(repos, MANIFEST)
    if args.install:
        for h in repos:
            keep = [t for t in load_tasks(work / f"{h.name}.tasks.jsonl") if t.instance_id not in drop]
            install(h, keep, Path(args.src) / h.name)
    prov = provenance(started=started, argv=sys.argv)
    doc = write_result(Path(args.out), figures, records, prov, meta=meta)
    print(json.dumps({k: v for k, v in doc["figures"].items() if k.endswith("kept_rate")}, indent=1))
    print(json.dumps(meta["repos"], indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=("mine", "finish", "report"))
    ap.add_argument("--src", default="", help="Directory of clones, one per repository: SRC/<name>.")
    ap.add_argument("--work", default="runs/history", help="Per-repository mining outputs (resumable).")
    ap.add_argument("--repos", default="", help="Only these repositories (comma-separated names).")
    ap.add_argument("--again", action="store_true", help="mine: redo repositories already mined in WORK.")
    ap.add_argument("--revalidate", action="store_true", help="finish: validate kept commits whose task was not saved.")
    ap.add_argument("--manifest", action="store_true", help="report: rewrite etude/tasks/history_manifest.json.")
    ap.add_argument("--install", action="store_true", help="report: cache the mined tasks as builtin:history.")
    ap.add_argument("--out", default=str(RESULTS / "history.json"), help="report: the result file.")
    ap.add_argument("--oracle", default="", help="report: etude eval runs (--model oracle) of the mined tasks, "
                    "comma-separated; a task the oracle does not resolve there is left out of the manifest.")
    ap.add_argument("--models", default="", help="report: ARM=MODEL[,...] to evaluate on builtin:history "
                    "(the first is the reference of the paired comparisons).")
    ap.add_argument("--agent-config", default="configs/agent_sft.toml",
                    help="report --models: the harness every model is evaluated with ([harness] table; greedy).")
    ap.add_argument("--backend", default="auto", help="report --models: hf, vllm or auto.")
    ap.add_argument("--workers", type=int, default=16, help="report --models: episodes in flight.")
    args = ap.parse_args()
    started = time.time()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.repos.split(",") if n]
    unknown = sorted(set(names) - {s.name for s in REPOS})
    if unknown:
        raise SystemExit(f"bench/history.py: unknown repositories {', '.join(unknown)}")
    if args.step in ("mine", "finish") and not args.src:
        raise SystemExit(f"bench/history.py: {args.step} needs --src DIR (clones at DIR/<name>)")
    if args.step == "finish":  # after stopping `mine` part way (one process per repository)
        for s in REPOS:
            if (not names or s.name in names) and (work / f"{s.name}.records.jsonl").is_file():
                if args.again or not (work / f"{s.name}.json").is_file():
                    finish_one(s, Path(args.src) / s.name, work, args.revalidate)
        return
    if args.step == "mine":
        for s in REPOS:
            if (not names or s.name in names) and (args.again or not (work / f"{s.name}.json").is_file()):
                mine_one(s, Path(args.src) / s.name, work)
        return
    if args.install and not args.src:
        raise SystemExit("bench/history.py: --install needs --src DIR (the clones to cache)")
    report(args, started)


if __name__ == "__main__":
    main()
