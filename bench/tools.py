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

    python bench/tools.py [--repo DIR] [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import track

from etude.protocols import ToolContext
from etude.tools import run_tool

GREP_PATTERN = r"class \w+PreTrainedModel\("


def median_s(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm the page cache and imports
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


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


def cases(repo: Path, scratch: Path) -> list[tuple[str, Callable[[], Any], str, Callable[[], Any]]]:
    ctx = ToolContext(workspace=repo)
    big = max(repo.glob("*.py"), key=lambda p: p.stat().st_size)
    shutil.copy(big, scratch / big.name)
    shutil.copy(big, scratch / "copy.py")
    sctx = ToolContext(workspace=scratch)
    rg = shutil.which("rg") or "/usr/bin/rg"
    return [
        ("grep", checked("grep", {"pattern": GREP_PATTERN, "max_results": 1000}, ctx), "GNU grep -rnE",
         lambda: subprocess.run(["grep", "-rnE", GREP_PATTERN, "."], cwd=repo, capture_output=True)),
        ("grep", checked("grep", {"pattern": GREP_PATTERN, "max_results": 1000}, ctx), "rg --json unsorted (parallel)",
         lambda: subprocess.run([rg, "--json", "--no-config", "-e", GREP_PATTERN], cwd=repo, capture_output=True)),
        ("glob", checked("glob", {"pattern": "*.py"}, ctx), "sorted(Path.rglob('*.py'))",
         lambda: sorted(repo.rglob("*.py"))),
        ("read_file", checked("read_file", {"path": big.name}, ctx), "read + number in Python",
         lambda: numbered_read(big)),
        ("list_dir", checked("list_dir", {"depth": 2}, ctx), "os.walk, 2 levels", lambda: walk_two_levels(repo)),
        ("edit_file", toggle_tool_edit(sctx, big.name), "read/replace/write in Python", toggle_edit(scratch / "copy.py")),
        ("run_terminal", checked("run_terminal", {"command": "true"}, sctx), "bare subprocess bash -c true",
         lambda: subprocess.run(["bash", "-c", "true"])),
    ]  # fmt: skip


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", type=Path, default=Path(transformers.__file__).parent)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tools.json")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        items = cases(a.repo.resolve(), scratch)
        for tool, ours, base_name, base in track(items, description="tools vs baselines"):
            o, b = median_s(ours, a.runs), median_s(base, a.runs)
            rows.append({"tool": tool, "etude_ms": round(o * 1e3, 2), "baseline": base_name,
                         "baseline_ms": round(b * 1e3, 2), "ratio": round(o / b, 2)})  # fmt: skip
    result = {
        "bench": "tools",
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        },  # fmt: skip
        "repo": str(a.repo),
        "repo_py_files": sum(1 for _ in a.repo.rglob("*.py")),
        "runs": a.runs,
        "statistic": "median wall time per call",
        "results": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(
            f"{r['tool']:<13} {r['etude_ms']:>9.2f} ms   {r['baseline']:<32} {r['baseline_ms']:>9.2f} ms   x{r['ratio']}"
        )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
