"""Latency of the agent tools on a real code base, beside the plain baseline each one replaces.

The workspace is an installed package's source tree (default: transformers from this virtual
environment, ~2,900 Python files; read-only tools run on it directly, edit_file on a copy of
one file). For each tool: the median wall time of `run_tool` (argument validation, path
checks, bounded output included) and of the baseline an agent would otherwise use, from the
same run, and their ratio. The baselines:

- grep: GNU `grep -rnE` (what `run_terminal` would run); also ripgrep without `--sort path`,
  to show what deterministic ordering costs;
- glob: `sorted(pathlib.Path.rglob(...))`;
- read_file: `open().read()` plus numbering in Python;
- list_dir: `os.walk` two levels deep;
- edit_file: read, `str.replace`, write in Python;
- run_terminal: `bash -c true` as a bare subprocess (the sandbox's cost: bwrap, cgroup, rlimits).

    python bench/tools.py [--repo DIR] [--runs 15] [--quick]

Written through `etude.evals.results.write_result`: tools.json and tools.records.jsonl, one record
per timed call (case, arm etude or baseline, milliseconds); per case one figure, the ratio of the
medians (etude over the baseline, with both medians), which `bench/verify.py` recomputes. Calls
of ours and of the baseline alternate, so load drift hits both alike; run it alone on the machine.
`--quick` is a smoke run: 2 calls each on etude's own source tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import track

from etude.evals.results import write_result
from etude.protocols import ToolContext
from etude.provenance import provenance
from etude.tools import run_tool

GREP_PATTERN = r"class \w+PreTrainedModel\("


def timed_pair(case: str, ours: Callable[[], Any], base: Callable[[], Any], runs: int) -> list[dict]:
    """`runs` timed calls of each, alternating (ours first on even rounds), after one untimed call
    of each (page cache, imports); one record per call."""
    ours()
    base()
    out = []
    for i in range(runs):
        for arm, fn in (("etude", ours), ("baseline", base)) if i % 2 == 0 else (("baseline", base), ("etude", ours)):
            t = time.perf_counter()
            fn()
            out.append({"case": case, "arm": arm, "trial": i, "ms": (time.perf_counter() - t) * 1000})
    return out


def checked(name: str, args: dict[str, Any], ctx: ToolContext) -> Callable[[], Any]:
    def call() -> Any:
        res = run_tool(name, args, ctx)
        if not res.ok:
            raise SystemExit(f"bench: {name} failed: {res.error}")
        return res

    return call


def numbered_read(path: Path) -> str:
    lines = path.read_text().split("\n")[:2000]
    return "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(lines, 1))


def walk_two_levels(root: Path) -> list[str]:
    out = []
    for d, dirs, files in os.walk(root):
        if os.path.relpath(d, root).count(os.sep) >= 1:
            dirs[:] = []
        out += sorted(dirs) + sorted(files)
    return out


def toggle_edit(path: Path) -> Callable[[], None]:
    state = {"n": 0}

    def edit() -> None:
        text = path.read_text()
        a, b = ("import", "imp0rt") if state["n"] % 2 == 0 else ("imp0rt", "import")
        path.write_text(text.replace(a, b, 1))
        state["n"] += 1

    return edit


def toggle_tool_edit(ctx: ToolContext, rel: str) -> Callable[[], None]:
    state = {"n": 0}

    def edit() -> None:
        a, b = ("import", "imp0rt") if state["n"] % 2 == 0 else ("imp0rt", "import")
        text = Path(ctx.workspace, rel).read_text()
        line = next(x for x in text.split("\n") if a in x and text.count(x) == 1)  # a unique line, as a model quotes it
        res = run_tool("edit_file", {"path": rel, "old_str": line, "new_str": line.replace(a, b, 1)}, ctx)
        if not res.ok:
            raise SystemExit(f"bench: edit_file failed: {res.error}")
        state["n"] += 1

    return edit


def cases(repo: Path, scratch: Path) -> list[tuple[str, str, Callable[[], Any], str, Callable[[], Any]]]:
    """(case, tool, ours, baseline's name, baseline)."""
    ctx = ToolContext(workspace=repo)
    big = max(repo.glob("*.py"), key=lambda p: p.stat().st_size)
    shutil.copy(big, scratch / big.name)
    shutil.copy(big, scratch / "copy.py")
    sctx = ToolContext(workspace=scratch)
    rg = shutil.which("rg") or "/usr/bin/rg"
    return [
        ("grep_vs_gnu_grep", "grep", checked("grep", {"pattern": GREP_PATTERN, "max_results": 1000}, ctx), "GNU grep -rnE",
         lambda: subprocess.run(["grep", "-rnE", GREP_PATTERN, "."], cwd=repo, capture_output=True)),
        ("grep_vs_rg", "grep", checked("grep", {"pattern": GREP_PATTERN, "max_results": 1000}, ctx),
         "rg --json unsorted (parallel)",
         lambda: subprocess.run([rg, "--json", "--no-config", "-e", GREP_PATTERN], cwd=repo, capture_output=True)),
        ("glob", "glob", checked("glob", {"pattern": "*.py"}, ctx), "sorted(Path.rglob('*.py'))",
         lambda: sorted(repo.rglob("*.py"))),
        ("read_file", "read_file", checked("read_file", {"path": big.name}, ctx), "read + number in Python",
         lambda: numbered_read(big)),
        ("list_dir", "list_dir", checked("list_dir", {"depth": 2}, ctx), "os.walk, 2 levels", lambda: walk_two_levels(repo)),
        ("edit_file", "edit_file", toggle_tool_edit(sctx, big.name), "read/replace/write in Python", toggle_edit(scratch / "copy.py")),
        ("run_terminal", "run_terminal", checked("run_terminal", {"command": "true"}, sctx), "bare subprocess bash -c true",
         lambda: subprocess.run(["bash", "-c", "true"])),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", type=Path, default=None, help="a source tree (default: transformers' of this venv)")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 calls each, on etude's own source tree")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tools.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.repo = 2, a.repo or Path(__file__).resolve().parents[1] / "etude"
    if a.repo is None:
        import transformers

        a.repo = Path(transformers.__file__).parent
    started = time.time()
    load0 = os.getloadavg()
    records: list[dict] = []
    figures: dict[str, dict] = {}
    baselines: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, tool, ours, base_name, base in track(cases(a.repo.resolve(), Path(tmp)), description="tools vs baselines"):
            records += timed_pair(case, ours, base, a.runs)
            baselines[case] = {"tool": tool, "baseline": base_name}
            figures[f"{case}.etude_over_baseline"] = {"kind": "ratio", "num": {"case": case, "arm": "etude"},
                                                      "den": {"case": case, "arm": "baseline"}, "field": "ms",
                                                      "stat": "median"}
    meta = {"repo": str(a.repo), "repo_py_files": sum(1 for _ in a.repo.rglob("*.py")), "runs": a.runs,
            "statistic": "median wall time per call (ms)", "cases": baselines,
            "load_avg_1m": {"start": load0[0], "end": os.getloadavg()[0]}}
    prov = provenance(started=started, argv=["bench/tools.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(a.out, figures, records, prov, meta=meta)
    for case, b in baselines.items():
        f = doc["figures"][f"{case}.etude_over_baseline"]
        print(f"{b['tool']:<13} {f['num_value']:>9.2f} ms   {b['baseline']:<32} {f['den_value']:>9.2f} ms   "
              f"x{f['value']:.2f}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
