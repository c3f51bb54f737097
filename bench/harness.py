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

Medians over `--runs` (ours and the baseline alternate, so load drift hits both alike); tests
never assert on these. Written through `etude.evals.results.write_result`: harness.json and
harness.records.jsonl, one record per timed run (measure, arm, seconds or milliseconds per turn);
`bench/verify.py` recomputes the medians, their ratios and the overhead per turn (median harness
minus median bare) from them. `--quick` is a smoke run: 2 runs on etude's own source tree.

    python bench/harness.py [--repo DIR] [--runs 9] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.progress import track

from etude.evals.results import write_result
from etude.harness import HarnessConfig, parse_output, run_agent
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import ToolContext
from etude.provenance import provenance
from etude.tools import run_tool

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "harness" / "data" / "parse_corpus.jsonl"


def alternate(measure: str, arms: dict[str, Callable[[], Any]], runs: int, scale: float = 1.0,
              field: str = "seconds") -> list[dict]:
    """`runs` timed calls of each arm, alternating their order, after one untimed call of each
    (page cache, imports); one record per call, its seconds times `scale` in `field`."""
    for fn in arms.values():
        fn()
    names = list(arms)
    out = []
    for i in track(range(runs), description=measure, transient=True):
        for name in names if i % 2 == 0 else names[::-1]:
            t = time.perf_counter()
            arms[name]()
            out.append({"measure": measure, "arm": name, "trial": i, field: (time.perf_counter() - t) * scale})
    return out


def call(name: str, **args: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


READ = "modeling_utils.py"  # the file the episodes read, in the transformers tree
READ_QUICK = "loop/cycle.py"  # in etude's own tree (--quick): 500+ lines too


def parallel_turn(repo: Path, read: str) -> str:
    sub = "models/bert" if (repo / "models/bert").is_dir() else "."
    return (call("grep", pattern=r"class \w+PreTrainedModel\(", path=".") + call("grep", pattern="def forward", path=sub)
            + call("glob", pattern="**/configuration_*.py") + call("read_file", path=read, start_line=1, end_line=400))


def episode(outputs: list[str], ctx: ToolContext, cfg: HarnessConfig, traj: Path | None = None) -> None:
    t = run_agent(ScriptedPolicy(outputs), "bench", ctx, cfg, trajectory_path=traj)
    if t.broken_calls:
        raise SystemExit(f"bench: broken calls: {[x.result.error for x in t.tool_calls if not x.result.ok]}")


def bench_parallel(ctx: ToolContext, runs: int, read: str) -> list[dict]:
    turn = [parallel_turn(ctx.workspace, read)]
    return alternate("turn_of_4_calls", {"parallel": lambda: episode(turn, ctx, HarnessConfig(parallel_tools=True)),
                                         "sequential": lambda: episode(turn, ctx, HarnessConfig(parallel_tools=False))},
                     runs)


TURNS = 10


def bench_overhead(ctx: ToolContext, runs: int, tmp: Path, read: str) -> tuple[list[dict], int]:
    outputs = [call("read_file", path=read, start_line=1 + 50 * k, end_line=50 + 50 * k) for k in range(TURNS)]
    traj = tmp / "t.jsonl"

    def harness() -> None:
        traj.unlink(missing_ok=True)
        episode(outputs, ctx, HarnessConfig(max_steps=TURNS + 1), traj)

    def bare() -> None:
        for k in range(TURNS):
            run_tool("read_file", {"path": read, "start_line": 1 + 50 * k, "end_line": 50 + 50 * k}, ctx)

    recs = alternate("episode_of_10_turns", {"harness": harness, "bare_run_tool": bare}, runs, 1000 / TURNS,
                     "ms_per_turn")
    return recs, traj.stat().st_size


def bench_parser(runs: int) -> tuple[list[dict], int]:
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines()]

    def parse_all() -> None:
        for c in cases:
            parse_output(c["input"], c["format"])

    return alternate("parse_corpus", {"parse_output": parse_all}, runs, 1e6 / len(cases), "us_per_output"), len(cases)


FIGURES = {
    "parallel.sequential_over_parallel": {"kind": "ratio", "num": {"arm": "sequential"}, "den": {"arm": "parallel"},
                                          "field": "seconds", "stat": "median"},
    "overhead.harness_minus_bare_ms_per_turn": {"kind": "difference", "a": {"arm": "bare_run_tool"},
                                                "b": {"arm": "harness"}, "field": "ms_per_turn", "stat": "median"},
    "overhead.harness_over_bare": {"kind": "ratio", "num": {"arm": "harness"}, "den": {"arm": "bare_run_tool"},
                                   "field": "ms_per_turn", "stat": "median"},
    "parser.us_per_output": {"kind": "quantile", "of": {"arm": "parse_output"}, "field": "us_per_output", "q": 0.5},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=None, help="a source tree to work on (default: transformers)")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 runs each on etude's own source tree")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "harness.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.repo = 2, args.repo or Path(__file__).resolve().parents[1] / "etude"
    if args.repo is None:
        import transformers

        args.repo = Path(transformers.__file__).parent
    repo = args.repo.resolve()
    read = READ_QUICK if args.quick else READ
    if not (repo / read).is_file():
        raise SystemExit(f"bench/harness.py: {repo} has no {read} (the file the episodes read)")
    started = time.time()
    load0 = os.getloadavg()[0]
    ctx = ToolContext(workspace=repo)
    with tempfile.TemporaryDirectory() as tmp:
        records = bench_parallel(ctx, args.runs, read)
        overhead, traj_bytes = bench_overhead(ctx, args.runs, Path(tmp), read)
        parser, outputs = bench_parser(args.runs)
        records += overhead + parser
    meta = {"repo": str(repo), "read_file": read, "runs": args.runs, "calls_per_turn": 4, "turns": TURNS,
            "trajectory_bytes": traj_bytes, "parser_outputs": outputs,
            "load_avg_1m": {"start": load0, "end": os.getloadavg()[0]}}
    prov = provenance(started=started, argv=["bench/harness.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(args.out, FIGURES, records, prov, meta=meta)
    json.dump({k: {x: v[x] for x in ("num_value", "den_value", "a_value", "b_value", "value") if x in v}
               for k, v in doc["figures"].items()}, sys.stdout, indent=2)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
