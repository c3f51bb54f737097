"""What the harness costs and what its parallel tool calls buy, beside the plain baselines.

On a real code base (default: the transformers source tree of this virtual environment, read
only), with the scripted policy and the real tools, from the same run:

- parallel: one turn of 4 read-only calls (2 greps, a glob, a read) through `run_agent` with
  `parallel_tools=True`, against the same turn run sequentially (`parallel_tools=False`, what an
  agent that runs one call at a time does);
- overhead: an episode of 10 turns of one read_file each (prompt building, parsing, tool
  dispatch, trajectory file rewritten after every turn) against the same 10 `run_tool` calls made
  directly; the difference per turn is the harness's own cost;
- parser: `parse_output` on every model output of the test corpus, microseconds per output.

Medians over `--runs`; tests never assert on these.

    python bench/harness.py [--repo DIR] [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import track

from etude.harness import HarnessConfig, parse_output, run_agent
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import ToolContext
from etude.tools import run_tool

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "harness" / "data" / "parse_corpus.jsonl"


def median_s(fn: Callable[[], Any], runs: int, label: str) -> float:
    fn()  # warm the page cache and imports
    times = []
    for _ in track(range(runs), description=label, transient=True):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def call(name: str, **args: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def parallel_turn(repo: Path) -> str:
    return (call("grep", pattern=r"class \w+PreTrainedModel\(", path=".") + call("grep", pattern="def forward", path="models/bert")
            + call("glob", pattern="**/configuration_*.py") + call("read_file", path="modeling_utils.py", start_line=1, end_line=400))


def episode(outputs: list[str], ctx: ToolContext, cfg: HarnessConfig, traj: Path | None = None) -> None:
    t = run_agent(ScriptedPolicy(outputs), "bench", ctx, cfg, trajectory_path=traj)
    if t.broken_calls:
        raise SystemExit(f"bench: broken calls: {[x.result.error for x in t.tool_calls if not x.result.ok]}")


def bench_parallel(ctx: ToolContext, runs: int) -> dict[str, Any]:
    turn = [parallel_turn(ctx.workspace)]
    par = median_s(lambda: episode(turn, ctx, HarnessConfig(parallel_tools=True)), runs, "parallel turn")
    seq = median_s(lambda: episode(turn, ctx, HarnessConfig(parallel_tools=False)), runs, "sequential turn")
    return {"calls_per_turn": 4, "parallel_median_s": par, "sequential_median_s": seq, "speedup": seq / par}


def bench_overhead(ctx: ToolContext, runs: int, tmp: Path) -> dict[str, Any]:
    n = 10
    outputs = [call("read_file", path="modeling_utils.py", start_line=1 + 50 * k, end_line=50 + 50 * k) for k in range(n)]
    traj = tmp / "t.jsonl"

    def harness() -> None:
        traj.unlink(missing_ok=True)
        episode(outputs, ctx, HarnessConfig(max_steps=n + 1), traj)

    def bare() -> None:
        for k in range(n):
            run_tool("read_file", {"path": "modeling_utils.py", "start_line": 1 + 50 * k, "end_line": 50 + 50 * k}, ctx)

    h, b = median_s(harness, runs, "harness episode"), median_s(bare, runs, "bare run_tool")
    return {"turns": n, "harness_median_s": h, "bare_run_tool_median_s": b, "overhead_ms_per_turn": (h - b) / n * 1000,
            "ratio": h / b, "trajectory_bytes": traj.stat().st_size}


def bench_parser(runs: int) -> dict[str, Any]:
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines()]

    def parse_all() -> None:
        for c in cases:
            parse_output(c["input"], c["format"])

    t = median_s(parse_all, runs, "parser")
    return {"outputs": len(cases), "median_us_per_output": t / len(cases) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=None, help="a source tree to work on (default: transformers)")
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    import transformers

    repo = (args.repo or Path(transformers.__file__).parent).resolve()
    ctx = ToolContext(workspace=repo)
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                        "load_avg_1m": os.getloadavg()[0]},
            "repo": str(repo), "runs": args.runs,
            "parallel_vs_sequential": bench_parallel(ctx, args.runs),
            "harness_vs_bare_tools": bench_overhead(ctx, args.runs, Path(tmp)),
            "parser": bench_parser(args.runs),
        }
    out = Path(__file__).resolve().parent / "results" / "harness.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
