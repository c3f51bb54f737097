"""Sandbox benchmark: workspace creation, command start-up, concurrent throughput, diff.

Beside every figure of ours stands the baseline it replaces, measured in the same run:
- workspace creation: overlay mount vs a full copy (shutil.copytree) vs git worktree, of a
  synthetic 2,000-file, ~20 MB repository (target: overlay >= 50x faster than the copy);
- command start-up: `etude.sandbox.run` (a fresh bwrap + rlimits + cgroups per command) vs a
  bare `subprocess.run` of the same command, interleaved (target: <= 10 ms overhead), the same
  without cgroups, and a session sandbox (one bwrap, a command = fork + exec inside);
- throughput: commands per second at 1/2/4/8 threads, sandboxed vs bare;
- diff(): overlay (reads only the upper dir) vs a full tree walk (copy workspace).
Medians of interleaved repeats. This machine is shared: the load average is recorded at start
and end, and figures drift with it.

    python bench/sandbox.py [--files 2000] [--repeats 40] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from etude.sandbox import SandboxConfig, Workspace, make_sandbox, run
from etude.sandbox.limits import controller_base

console = Console()


def make_repo(root: Path, files: int) -> tuple[Path, int]:
    """A package-shaped tree: `files` Python files of ~10 KB in nested directories, committed."""
    repo = root / "repo"
    body = "".join(f"def f{i}(x):\n    return x * {i}  # padding padding padding padding\n" for i in range(150))
    total = 0
    for i in range(files):
        d = repo / f"pkg{i % 20}" / f"sub{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        text = f"# module {i}\n" + body
        (d / f"mod{i}.py").write_text(text)
        total += len(text)
    git = ["git", "-C", str(repo), "-c", "user.name=b", "-c", "user.email=b@b"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    return repo, total


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def med_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 3)


def p10_ms(xs: list[float]) -> float:
    """10th percentile: close to the cost when the shared CPUs happen to be free."""
    return round(sorted(xs)[len(xs) // 10] * 1000, 3)


def bench_workspaces(repo: Path, root: Path, repeats: int, prog: Progress) -> dict:
    times: dict[str, list[float]] = {"overlay": [], "copy": [], "worktree": []}
    close: dict[str, list[float]] = {k: [] for k in times}
    plan = [("overlay", repeats), ("worktree", max(3, repeats // 8)), ("copy", max(3, repeats // 8))]
    task = prog.add_task("workspace creation", total=sum(n for _, n in plan))
    for kind, n in plan:
        for _ in range(n):
            t = time.perf_counter()
            ws = Workspace.create(repo, kind=kind, root=root)  # type: ignore[arg-type]
            times[kind].append(time.perf_counter() - t)
            close[kind].append(timed(ws.close))
            prog.advance(task)
    out = {
        k: {"create_median_ms": med_ms(v), "close_median_ms": med_ms(close[k]), "n": len(v)} for k, v in times.items()
    }
    out["copy_over_overlay"] = round(statistics.median(times["copy"]) / statistics.median(times["overlay"]), 1)
    out["worktree_over_overlay"] = round(statistics.median(times["worktree"]) / statistics.median(times["overlay"]), 1)
    return out


def bench_diff(repo: Path, root: Path, prog: Progress) -> dict:
    task = prog.add_task("diff()", total=2)
    out = {}
    for kind in ("overlay", "copy"):
        with Workspace.create(repo, kind=kind, root=root) as ws:  # type: ignore[arg-type]
            for p in sorted(ws.path.rglob("mod1?.py"))[:10]:
                p.write_text(p.read_text().replace("return x", "return -x", 1))
            ts = [timed(ws.diff) for _ in range(5)]
            out[kind] = {"median_ms": med_ms(ts), "patch_bytes": len(ws.diff())}
        prog.advance(task)
    out["full_walk_over_overlay"] = round(out["copy"]["median_ms"] / out["overlay"]["median_ms"], 1)
    return out


def bench_startup(ws: Path, repeats: int, prog: Progress) -> dict:
    venv = Path(sys.prefix)
    full = SandboxConfig(ro_binds=(str(venv),), path_prepend=(str(venv / "bin"),))
    nocg = replace(full, memory_mb=None, max_procs=None)
    cmds = {"true": ["true"], "python": [sys.executable, "-c", "pass"]}
    inside = {"true": ["true"], "python": ["python", "-c", "pass"]}
    kinds = ("bare", "sandbox", "sandbox_no_cgroup", "session")
    res: dict[str, dict[str, list[float]]] = {c: {k: [] for k in kinds} for c in cmds}
    task = prog.add_task("command start-up", total=repeats * len(cmds))
    with make_sandbox(ws, replace(full, session=True)) as sess:  # type: ignore[union-attr]
        for _ in range(repeats):
            for c in cmds:  # interleaved, so load drift hits all of them alike
                res[c]["bare"].append(timed(lambda c=c: subprocess.run(cmds[c], capture_output=True, check=True)))
                res[c]["sandbox"].append(timed(lambda c=c: _ok(run(inside[c], workspace=ws, config=full))))
                res[c]["sandbox_no_cgroup"].append(timed(lambda c=c: _ok(run(inside[c], workspace=ws, config=nocg))))
                res[c]["session"].append(timed(lambda c=c: _ok(sess.exec(inside[c]))))
                prog.advance(task)
    return {c: _startup_row(r, repeats) for c, r in res.items()}


def _startup_row(r: dict[str, list[float]], n: int) -> dict:
    m = {k: med_ms(v) for k, v in r.items()}
    return {
        **{f"{k}_median_ms": v for k, v in m.items()},
        **{f"{k}_p10_ms": p10_ms(v) for k, v in r.items()},
        "overhead_ms": round(m["sandbox"] - m["bare"], 3),
        "overhead_p10_ms": round(p10_ms(r["sandbox"]) - p10_ms(r["bare"]), 3),
        "overhead_no_cgroup_ms": round(m["sandbox_no_cgroup"] - m["bare"], 3),
        "overhead_session_ms": round(m["session"] - m["bare"], 3),
        "sandbox_over_bare": round(m["sandbox"] / m["bare"], 2),
        "session_over_bare": round(m["session"] / m["bare"], 2),
        "n": n,
    }


def _ok(r: object) -> None:
    assert getattr(r, "returncode", 1) == 0, r


class _SessionPerThread:
    """One session sandbox per worker thread (a session runs one command at a time)."""

    def __init__(self, ws: Path, n: int) -> None:
        self.sessions = [make_sandbox(ws, SandboxConfig(session=True)) for _ in range(n)]
        self.free = list(self.sessions)
        self.mine = threading.local()
        self.lock = threading.Lock()

    def exec_true(self) -> None:
        if not hasattr(self.mine, "sb"):
            with self.lock:
                self.mine.sb = self.free.pop()
        _ok(self.mine.sb.exec(["true"]))

    def close(self) -> None:
        for sb in self.sessions:
            sb.close()  # type: ignore[union-attr]


def bench_throughput(ws: Path, per_level: int, prog: Progress) -> dict:
    """Commands per second through n threads: bare, `run` (fresh sandbox each), and one session
    sandbox per thread (a session runs its commands one at a time)."""
    out = {}
    task = prog.add_task("throughput 1/2/4/8", total=4 * 3)
    for n in (1, 2, 4, 8):
        pool_of = _SessionPerThread(ws, n)
        row = {}
        for name, fn in (
            ("bare", lambda: subprocess.run(["true"], capture_output=True, check=True)),
            ("sandbox", lambda: _ok(run(["true"], workspace=ws))),
            ("session", pool_of.exec_true),
        ):
            with ThreadPoolExecutor(n) as pool:
                t = time.perf_counter()
                list(pool.map(lambda _, fn=fn: fn(), range(per_level)))
                row[f"{name}_per_s"] = round(per_level / (time.perf_counter() - t), 1)
            prog.advance(task)
        pool_of.close()
        row["sandbox_over_bare"] = round(row["sandbox_per_s"] / row["bare_per_s"], 3)
        row["session_over_bare"] = round(row["session_per_s"] / row["bare_per_s"], 3)
        out[str(n)] = row
    return out


def machine() -> dict:
    bwrap = subprocess.run(["bwrap", "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "bwrap": bwrap,
        "cgroups": {c: controller_base(c) is not None for c in ("pids", "memory")},
        "loadavg_start": os.getloadavg(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--throughput-commands", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="small run for a smoke test")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sandbox.json")
    a = ap.parse_args()
    if a.quick:
        a.files, a.repeats, a.throughput_commands = 200, 5, 8
    result: dict = {"machine": machine(), "params": {"files": a.files, "repeats": a.repeats}}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="etude-bench-") as tmp, Progress(console=console) as prog:
        tmpd = Path(tmp)
        repo, size = make_repo(tmpd, a.files)
        result["params"]["repo_bytes"] = size
        ws = tmpd / "ws"
        ws.mkdir()
        result["workspace_creation"] = bench_workspaces(repo, tmpd / "wsroot", a.repeats, prog)
        result["diff"] = bench_diff(repo, tmpd / "wsroot", prog)
        result["startup"] = bench_startup(ws, a.repeats, prog)
        result["throughput"] = bench_throughput(ws, a.throughput_commands, prog)
    result["machine"]["loadavg_end"] = os.getloadavg()
    result["wall_s"] = round(time.time() - t0, 1)
    result["targets"] = {
        "overlay_vs_copy_at_least_50x": result["workspace_creation"]["copy_over_overlay"] >= 50,
        "startup_overhead_at_most_10ms": result["startup"]["true"]["overhead_ms"] <= 10,
        "session_startup_overhead_at_most_10ms": result["startup"]["true"]["overhead_session_ms"] <= 10,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    show(result)
    console.print(f"wrote {a.out}")


def show(r: dict) -> None:
    t = Table(title="etude sandbox benchmark (medians)")
    for col in ("measure", "ours", "baseline", "ratio"):
        t.add_column(col)
    w, s = r["workspace_creation"], r["startup"]
    t.add_row(
        "workspace create",
        f"overlay {w['overlay']['create_median_ms']} ms",
        f"copy {w['copy']['create_median_ms']} ms",
        f"{w['copy_over_overlay']}x",
    )
    t.add_row("", "", f"worktree {w['worktree']['create_median_ms']} ms", f"{w['worktree_over_overlay']}x")
    for c in ("true", "python"):
        t.add_row(
            f"start-up `{c}`",
            f"sandbox {s[c]['sandbox_median_ms']} ms",
            f"bare {s[c]['bare_median_ms']} ms",
            f"+{s[c]['overhead_ms']} ms",
        )
        t.add_row(
            "  10th percentile",
            f"{s[c]['sandbox_p10_ms']} ms",
            f"{s[c]['bare_p10_ms']} ms",
            f"+{s[c]['overhead_p10_ms']} ms",
        )
        t.add_row(
            "  session sandbox",
            f"{s[c]['session_median_ms']} ms",
            f"{s[c]['bare_median_ms']} ms",
            f"+{s[c]['overhead_session_ms']} ms",
        )
        t.add_row(
            "  without cgroups", f"{s[c]['sandbox_no_cgroup_median_ms']} ms", "", f"+{s[c]['overhead_no_cgroup_ms']} ms"
        )
    for n, row in r["throughput"].items():
        t.add_row(
            f"throughput x{n}", f"{row['sandbox_per_s']}/s", f"{row['bare_per_s']}/s", f"{row['sandbox_over_bare']}"
        )
        t.add_row("  session", f"{row['session_per_s']}/s", "", f"{row['session_over_bare']}")
    d = r["diff"]
    t.add_row(
        "diff() 10 edits",
        f"overlay {d['overlay']['median_ms']} ms",
        f"full walk {d['copy']['median_ms']} ms",
        f"{d['full_walk_over_overlay']}x",
    )
    console.print(t)
    console.print(f"load average start {r['machine']['loadavg_start']}, end {r['machine']['loadavg_end']}")


if __name__ == "__main__":
    main()
