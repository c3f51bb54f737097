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
and end, and figures drift with it; run it alone on the machine.

    python bench/sandbox.py [--files 2000] [--repeats 40] [--quick]

Written through `etude.evals.results.write_result`: sandbox.json (figures, provenance, meta) and
sandbox.records.jsonl, one record per timed call (measure, the arm — ours or the baseline —,
milliseconds) and per throughput phase (commands, seconds, commands per second); `bench/verify.py`
recomputes every median, 10th percentile, ratio (baseline over ours) and overhead (ours minus
the bare baseline, medians) from them.
"""

from __future__ import annotations

import argparse
import os
import platform
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

from etude.evals.results import compute_figures, write_result
from etude.provenance import provenance
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


def _ms(measure: str, arm: str, trial: int, seconds: float, **kw: object) -> dict:
    return {"measure": measure, "arm": arm, "trial": trial, "ms": seconds * 1000, **kw}


def bench_workspaces(repo: Path, root: Path, repeats: int, prog: Progress) -> list[dict]:
    plan = [("overlay", repeats), ("worktree", max(3, repeats // 8)), ("copy", max(3, repeats // 8))]
    task = prog.add_task("workspace creation", total=sum(n for _, n in plan))
    out = []
    for kind, n in plan:
        for i in range(n):
            t = time.perf_counter()
            ws = Workspace.create(repo, kind=kind, root=root)  # type: ignore[arg-type]
            out.append(_ms("workspace_create", kind, i, time.perf_counter() - t))
            out.append(_ms("workspace_close", kind, i, timed(ws.close)))
            prog.advance(task)
    return out


def bench_diff(repo: Path, root: Path, prog: Progress) -> tuple[list[dict], dict[str, int]]:
    task = prog.add_task("diff()", total=2)
    out, patch_bytes = [], {}
    for kind in ("overlay", "copy"):
        with Workspace.create(repo, kind=kind, root=root) as ws:  # type: ignore[arg-type]
            for p in sorted(ws.path.rglob("mod1?.py"))[:10]:
                p.write_text(p.read_text().replace("return x", "return -x", 1))
            out += [_ms("diff", kind, i, timed(ws.diff)) for i in range(5)]
            patch_bytes[kind] = len(ws.diff())
        prog.advance(task)
    return out, patch_bytes


def bench_startup(ws: Path, repeats: int, prog: Progress) -> list[dict]:
    venv = Path(sys.prefix)
    full = SandboxConfig(ro_binds=(str(venv),), path_prepend=(str(venv / "bin"),))
    nocg = replace(full, memory_mb=None, max_procs=None)
    cmds = {"true": ["true"], "python": [sys.executable, "-c", "pass"]}
    inside = {"true": ["true"], "python": ["python", "-c", "pass"]}
    out = []
    task = prog.add_task("command start-up", total=repeats * len(cmds))
    with make_sandbox(ws, replace(full, session=True)) as sess:  # type: ignore[union-attr]
        for i in range(repeats):
            for c in cmds:  # interleaved, so load drift hits all of them alike
                out.append(_ms("startup", "bare", i, timed(lambda c=c: subprocess.run(cmds[c], capture_output=True,
                                                                                    check=True)), cmd=c))
                out.append(_ms("startup", "sandbox", i, timed(lambda c=c: _ok(run(inside[c], workspace=ws,
                                                                                 config=full))), cmd=c))
                out.append(_ms("startup", "sandbox_no_cgroup", i,
                               timed(lambda c=c: _ok(run(inside[c], workspace=ws, config=nocg))), cmd=c))
                out.append(_ms("startup", "session", i, timed(lambda c=c: _ok(sess.exec(inside[c]))), cmd=c))
                prog.advance(task)
    return out


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


def bench_throughput(ws: Path, per_level: int, prog: Progress) -> list[dict]:
    """Commands per second through n threads: bare, `run` (fresh sandbox each), and one session
    sandbox per thread (a session runs its commands one at a time); one record per phase."""
    out = []
    task = prog.add_task("throughput 1/2/4/8", total=4 * 3)
    for n in (1, 2, 4, 8):
        pool_of = _SessionPerThread(ws, n)
        for name, fn in (
            ("bare", lambda: subprocess.run(["true"], capture_output=True, check=True)),
            ("sandbox", lambda: _ok(run(["true"], workspace=ws))),
            ("session", pool_of.exec_true),
        ):
            with ThreadPoolExecutor(n) as pool:
                t = time.perf_counter()
                list(pool.map(lambda _, fn=fn: fn(), range(per_level)))
                wall = time.perf_counter() - t
            out.append({"measure": "throughput", "arm": name, "threads": n, "commands": per_level, "seconds": wall,
                        "per_s": per_level / wall})
            prog.advance(task)
        pool_of.close()
    return out


def figures() -> dict[str, dict]:
    """Every figure, ours beside the baseline of the same run (medians in ms unless named)."""
    def q(sel: dict, field: str = "ms", at: float = 0.5) -> dict:
        return {"kind": "quantile", "of": sel, "field": field, "q": at}

    def over(num: dict, den: dict, field: str = "ms") -> dict:
        return {"kind": "ratio", "num": num, "den": den, "field": field, "stat": "median"}

    def minus(a: dict, b: dict) -> dict:  # median of b minus median of a
        return {"kind": "difference", "a": a, "b": b, "field": "ms", "stat": "median"}

    figs: dict[str, dict] = {}
    for kind in ("overlay", "copy", "worktree"):
        figs[f"workspace.{kind}.create_median_ms"] = q({"measure": "workspace_create", "arm": kind})
        figs[f"workspace.{kind}.close_median_ms"] = q({"measure": "workspace_close", "arm": kind})
    for kind in ("copy", "worktree"):
        figs[f"workspace.{kind}_over_overlay"] = over({"measure": "workspace_create", "arm": kind},
                                                     {"measure": "workspace_create", "arm": "overlay"})
    for kind in ("overlay", "copy"):
        figs[f"diff.{kind}.median_ms"] = q({"measure": "diff", "arm": kind})
    figs["diff.full_walk_over_overlay"] = over({"measure": "diff", "arm": "copy"}, {"measure": "diff", "arm": "overlay"})
    for c in ("true", "python"):
        at = {"measure": "startup", "cmd": c}
        for arm in ("bare", "sandbox", "sandbox_no_cgroup", "session"):
            figs[f"startup.{c}.{arm}_median_ms"] = q({**at, "arm": arm})
            figs[f"startup.{c}.{arm}_p10_ms"] = q({**at, "arm": arm}, at=0.1)
        for arm in ("sandbox", "sandbox_no_cgroup", "session"):
            figs[f"startup.{c}.{arm}_overhead_ms"] = minus({**at, "arm": "bare"}, {**at, "arm": arm})
        for arm in ("sandbox", "session"):
            figs[f"startup.{c}.{arm}_over_bare"] = over({**at, "arm": arm}, {**at, "arm": "bare"})
    for n in (1, 2, 4, 8):
        at = {"measure": "throughput", "threads": n}
        for arm in ("bare", "sandbox", "session"):
            figs[f"throughput.{n}.{arm}_per_s"] = q({**at, "arm": arm}, "per_s")
        for arm in ("sandbox", "session"):
            figs[f"throughput.{n}.{arm}_over_bare"] = over({**at, "arm": arm}, {**at, "arm": "bare"}, "per_s")
    return figs


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--throughput-commands", type=int, default=48)
    ap.add_argument("--quick", action="store_true", help="small run for a smoke test")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sandbox.json")
    a = ap.parse_args(argv)
    if a.quick:
        a.files, a.repeats, a.throughput_commands = 200, 5, 8
    started = time.time()
    meta: dict = {"machine": machine(), "params": {"files": a.files, "repeats": a.repeats,
                                                  "throughput_commands": a.throughput_commands}}
    with tempfile.TemporaryDirectory(prefix="etude-bench-") as tmp, Progress(console=console) as prog:
        tmpd = Path(tmp)
        repo, size = make_repo(tmpd, a.files)
        meta["params"]["repo_bytes"] = size
        ws = tmpd / "ws"
        ws.mkdir()
        records = bench_workspaces(repo, tmpd / "wsroot", a.repeats, prog)
        diff_records, meta["diff_patch_bytes"] = bench_diff(repo, tmpd / "wsroot", prog)
        records += diff_records + bench_startup(ws, a.repeats, prog) + bench_throughput(ws, a.throughput_commands, prog)
    meta["machine"]["loadavg_end"] = os.getloadavg()
    prov = provenance(started=started, argv=["bench/sandbox.py", *(sys.argv[1:] if argv is None else argv)])
    figs = figures()
    f = compute_figures(figs, records)
    meta["targets"] = {
        "overlay_vs_copy_at_least_50x": f["workspace.copy_over_overlay"]["value"] >= 50,
        "startup_overhead_at_most_10ms": f["startup.true.sandbox_overhead_ms"]["value"] <= 10,
        "session_startup_overhead_at_most_10ms": f["startup.true.session_overhead_ms"]["value"] <= 10,
    }
    write_result(a.out, figs, records, prov, meta=meta)
    show(f, meta)
    console.print(f"wrote {a.out}")


def show(f: dict, meta: dict) -> None:
    def v(name: str, digits: int = 2, sign: str = "") -> str:
        x = f[name]["value"]
        return f"{x:{sign},.{digits}f}"

    t = Table(title="etude sandbox benchmark (medians)")
    for col in ("measure", "ours", "baseline", "ratio"):
        t.add_column(col)
    t.add_row("workspace create", f"overlay {v('workspace.overlay.create_median_ms')} ms",
              f"copy {v('workspace.copy.create_median_ms')} ms", f"{v('workspace.copy_over_overlay', 1)}x")
    t.add_row("", "", f"worktree {v('workspace.worktree.create_median_ms')} ms",
              f"{v('workspace.worktree_over_overlay', 1)}x")
    for c in ("true", "python"):
        s = f"startup.{c}."
        t.add_row(f"start-up `{c}`", f"sandbox {v(s + 'sandbox_median_ms')} ms", f"bare {v(s + 'bare_median_ms')} ms",
                  f"{v(s + 'sandbox_overhead_ms', sign='+')} ms")
        t.add_row("  10th percentile", f"{v(s + 'sandbox_p10_ms')} ms", f"{v(s + 'bare_p10_ms')} ms", "")
        t.add_row("  session sandbox", f"{v(s + 'session_median_ms')} ms", f"{v(s + 'bare_median_ms')} ms",
                  f"{v(s + 'session_overhead_ms', sign='+')} ms")
        t.add_row("  without cgroups", f"{v(s + 'sandbox_no_cgroup_median_ms')} ms", "",
                  f"{v(s + 'sandbox_no_cgroup_overhead_ms', sign='+')} ms")
    for n in (1, 2, 4, 8):
        s = f"throughput.{n}."
        t.add_row(f"throughput x{n}", f"{v(s + 'sandbox_per_s', 1)}/s", f"{v(s + 'bare_per_s', 1)}/s",
                  v(s + "sandbox_over_bare", 3))
        t.add_row("  session", f"{v(s + 'session_per_s', 1)}/s", "", v(s + "session_over_bare", 3))
    t.add_row("diff() 10 edits", f"overlay {v('diff.overlay.median_ms')} ms", f"full walk {v('diff.copy.median_ms')} ms",
              f"{v('diff.full_walk_over_overlay', 1)}x")
    console.print(t)
    console.print(f"load average start {meta['machine']['loadavg_start']}, end {meta['machine']['loadavg_end']}")


if __name__ == "__main__":
    main()
