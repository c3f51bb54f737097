"""Serving benchmark: throughput and latency of `etude serve` at 1/4/16 concurrent sessions,
beside a single-request baseline from the same run.

Baseline: the same model called in-process with `LocalPolicy.generate`, one request at a time
(no HTTP, no batching, no store) — what a naive server would do. Ours: the real `etude serve`
subprocess (batching worker, SQLite WAL store with synchronous=FULL, every record committed
before the response) driven by the official `openai` client from N threads, each thread one
session sending its requests back to back.

    .venv/bin/python bench/serve.py [--model tiny] [--max-tokens 16] [--requests 32] [--threads 1]

Writes bench/results/serve.json. Figures are medians over requests; throughput is
completed requests (and completion tokens) per wall-clock second of each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Write a function that reverses a string.", "What does `git rebase` do?", "Fix the off-by-one in range(n+1).",
           "Explain list comprehensions.", "Rename variable x to count.", "Add a docstring to main()."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def baseline(model: str, n: int, max_tokens: int, progress: Progress) -> dict[str, Any]:
    from etude.policy.local import LocalPolicy
    from etude.types import Message

    pol = LocalPolicy.from_pretrained(model)
    pol.generate([Message("user", "warm up")], max_tokens=2)
    lat, toks = [], 0
    task = progress.add_task("baseline (in-process, sequential)", total=n)
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        g = pol.generate([Message(**m) for m in _messages(i)], max_tokens=max_tokens, temperature=1.0)
        lat.append(time.perf_counter() - s)
        toks += len(g.token_ids)
        progress.advance(task)
    wall = time.perf_counter() - t0
    return _summary(lat, toks, wall, n)


def _summary(lat: list[float], toks: int, wall: float, n: int) -> dict[str, Any]:
    lat = sorted(lat)
    return {"requests": n, "wall_s": round(wall, 3), "req_per_s": round(n / wall, 3), "tok_per_s": round(toks / wall, 2),
            "completion_tokens": toks, "latency_p50_s": round(statistics.median(lat), 4),
            "latency_p95_s": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 4)}


def start_server(model: str, db: str, port: int, log: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "ETUDE_DB": db}
    cmd = [sys.executable, "-c", "from etude.cli import main; main()", "serve", "--model", model, "--port", str(port),
           "--threads", str(threads)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit("server did not come up")


def load(base: str, key: str, sessions: int, per_session: int, max_tokens: int, progress: Progress) -> dict[str, Any]:
    lat: list[float] = []
    toks = [0]
    lock = threading.Lock()
    task = progress.add_task(f"server, {sessions} concurrent session(s)", total=sessions * per_session)

    def run(s: int) -> None:
        c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=300)
        for i in range(per_session):
            t = time.perf_counter()
            r = c.chat.completions.create(model="auto", messages=_messages(s * per_session + i), max_tokens=max_tokens,
                                          temperature=1.0, user=f"bench-user-{s}",
                                          extra_headers={"x-etude-session": f"bench-{sessions}-{s}"})
            with lock:
                lat.append(time.perf_counter() - t)
                toks[0] += r.usage.completion_tokens
            progress.advance(task)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(sessions)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return _summary(lat, toks[0], time.perf_counter() - t0, sessions * per_session)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch threads, the same for baseline and server")
    ap.add_argument("--requests", type=int, default=32, help="requests per phase, split over the sessions (at least 4 each)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    import torch

    from etude.store import open_store

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="etude-bench-serve-"))
    db = f"sqlite:///{tmp / 'etude.db'}"
    key = open_store(db).create_key("bench")
    port = _free_port()
    out: dict[str, Any] = {"bench": "serve", "model": args.model, "max_tokens": args.max_tokens,
                           "torch_threads": args.threads, "load_average_at_start": os.getloadavg()[0],
                           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                       "python": platform.python_version()},
                           "versions": _versions(), "phases": {}}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        out["baseline_sequential_inprocess"] = baseline(args.model, args.requests, args.max_tokens, progress)
        proc = start_server(args.model, db, port, tmp / "serve.log", args.threads)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            load(base, key, 1, 2, args.max_tokens, progress)  # warm-up, not reported
            for c in levels:
                before = _batching(port)
                out["phases"][str(c)] = load(base, key, c, max(4, args.requests // c), args.max_tokens, progress)
                after = _batching(port)
                jobs, batches = after["jobs"] - before["jobs"], after["batches"] - before["batches"]
                out["phases"][str(c)]["mean_batch_size"] = round(jobs / batches, 2) if batches else None
                out["phases"][str(c)]["load_average_after"] = os.getloadavg()[0]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        out["logged_interactions"] = open_store(db).count_interactions("bench")
        # The machine is shared: I measure the baseline again after the server phases and
        # compare against the mean of both, so load drift hits both sides alike.
        out["baseline_after"] = baseline(args.model, args.requests, args.max_tokens, progress)
    b0, b1 = out["baseline_sequential_inprocess"], out["baseline_after"]
    b = {k: (b0[k] + b1[k]) / 2 for k in ("req_per_s", "latency_p50_s")}
    out["baseline_mean"] = b
    out["ratios_vs_baseline"] = {c: {"throughput_x": round(p["req_per_s"] / b["req_per_s"], 3),
                                     "latency_p50_x": round(p["latency_p50_s"] / b["latency_p50_s"], 3)}
                                 for c, p in out["phases"].items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({"baseline_before": b0, "baseline_after": b1, "phases": out["phases"],
                      "ratios": out["ratios_vs_baseline"]}, indent=2))


def _batching(port: int) -> dict[str, int]:
    stats = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["batching"]
    return {"jobs": sum(s["jobs"] for s in stats.values()), "batches": sum(s["batches"] for s in stats.values())}


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "transformers", "fastapi", "uvicorn", "sqlalchemy", "openai")}


if __name__ == "__main__":
    main()
