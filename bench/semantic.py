"""Benchmark: semantic_search's index and ranking on a real 1,500-file Python repository.

    .venv/bin/python bench/semantic.py                  # ansible-core 2.17.7 sdist, MiniLM (long: embeds ~14k chunks)
    .venv/bin/python bench/semantic.py --embedder hash  # the pipeline without the model (quick smoke run)

Fetches the sdist by name and version with `pip download --no-binary :all: --no-deps`, checks
its sha256 against the one recorded here, unpacks it under the etude cache and indexes a
scratch copy (its .py files: 1,525 of them) into a fresh, empty cache. Measured, in one run
(about 20 minutes of model time on 2 shared cores):

- ours: full index time (cold cache), incremental re-index after one edit (median of 5 edits,
  each to one file, including the re-stacking the next query needs), an unchanged refresh (the
  stat walk every tool call does), query latency p50/p95 (search only, and the whole tool call),
  recall@1/5/10 and MRR on bench/data/semantic_queries.json (hand-labelled).
- baseline, "brute force": the same chunks embedded with the same model, ranked by a numpy dot
  product only (no BM25, no symbol pin, no cache, so any edit means embedding everything again).
  Its vectors are identical to ours (same texts, same model), so I take them from our index
  instead of spending the model time twice; its full index time is its own chunking, re-measured
  here, plus the model time our run spent on exactly those texts (also measured here).
  Its incremental figure is therefore its full index time (marked as such in the JSON).

Writes bench/results/semantic.json. Nothing here asserts: it measures and reports.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PACKAGE, VERSION = "ansible-core", "2.17.7"
SDIST = "ansible_core-2.17.7.tar.gz"
SHA256 = "3aaab735d6c4e2d6239bc326800dc0ecda2a1490caa8455b41084ec0bc54dacf"  # recorded when first fetched
EDIT_FILE = "lib/ansible/module_utils/common/text/formatters.py"


def fetch_sources() -> Path:
    """The unpacked sdist (downloaded and verified once, then reused from the cache)."""
    from etude.paths import cache

    base = cache() / "bench" / "semantic"
    tree = base / SDIST.removesuffix(".tar.gz")
    if tree.is_dir():
        return tree
    archive = cache() / "sdists" / SDIST
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                        "--no-build-isolation", "-d", str(archive.parent), f"{PACKAGE}=={VERSION}"],
                       check=True, stdout=subprocess.DEVNULL)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SHA256:
        sys.exit(f"bench: {archive} has sha256 {digest}, expected {SHA256}")
    base.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tf:
        tf.extractall(base, filter="data")
    return tree


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def ms(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(pct(values, 50) * 1000, 2), "p95_ms": round(pct(values, 95) * 1000, 2), "n": len(values)}


class TimedEmbedder:
    """Wraps the embedder's `embed` to add up the model time spent on chunks (not queries)."""

    def __init__(self, emb) -> None:
        self.emb, self.inner, self.chunk_s = emb, emb.embed, 0.0

    def __call__(self, texts, *, query=False):
        t = time.perf_counter()
        out = self.inner(texts, query=query)
        if not query:
            self.chunk_s += time.perf_counter() - t
        return out


def recall(ranked: list[list[tuple[str, str]]], queries: list[dict]) -> dict[str, float]:
    """recall@1/5/10 and MRR@10 of the labelled (path, symbol) in each ranked list."""
    ranks = []
    for hits, q in zip(ranked, queries, strict=True):
        want = (q["path"], q["symbol"])
        ranks.append(hits.index(want) + 1 if want in hits else None)
    n = len(queries)
    out = {f"recall@{k}": round(sum(1 for r in ranks if r and r <= k) / n, 4) for k in (1, 5, 10)}
    out["mrr@10"] = round(sum(1 / r for r in ranks if r and r <= 10) / n, 4)
    out["misses@5"] = [q["query"] for q, r in zip(queries, ranks, strict=True) if not r or r > 5]
    return out


def bench_ours(work: Path, queries: list[dict], cfg, timer: TimedEmbedder) -> tuple[dict, object]:
    from etude.protocols import ToolContext, ToolsConfig
    from etude.search import open_index
    from etude.tools.semantic_search import TOOL

    t = time.perf_counter()
    idx = open_index(work, config=cfg)
    stats = idx.refresh()
    idx.search("warm up", k=1)  # stacks the matrices, as the first query after indexing does
    full_s = time.perf_counter() - t
    out: dict = {"full_index_s": round(full_s, 2), "model_s": round(timer.chunk_s, 2), "index": stats.to_dict()}
    out["incremental"] = incremental(idx, work)
    noop = [timed(idx.refresh) for _ in range(10)]
    out["unchanged_refresh"] = ms(noop)
    lat, ranked = [], []
    for q in queries:
        for _ in range(3):
            dt, hits = timed_value(lambda q=q: idx.search(q["query"], k=10))
            lat.append(dt)
        ranked.append([(h.path, h.symbol) for h in hits])
    out["query_latency"] = ms(lat)
    ctx = ToolContext(workspace=work, config=ToolsConfig(search=cfg))
    tool_lat = [timed(lambda q=q: TOOL.run({"query": q["query"], "k": 10}, ctx)) for q in queries]
    out["tool_call_latency"] = ms(tool_lat)
    out.update(recall(ranked, queries))
    out["index_bytes"] = sum(p.stat().st_size for p in Path(os.environ["ETUDE_CACHE"]).rglob("*") if p.is_file())
    return out, idx


def incremental(idx, work: Path) -> dict:
    """Five edits to one file, each followed by refresh + the re-stack the next query needs."""
    path = work / EDIT_FILE
    original = path.read_text()
    times, stats = [], []
    for i in range(5):
        path.write_text(original + f"\n\ndef bench_edit_{i}(value):\n    \"\"\"Edit number {i}.\"\"\"\n    return value + {i}\n")
        t = time.perf_counter()
        s = idx.refresh()
        idx.search("bench edit", k=1)
        times.append(time.perf_counter() - t)
        stats.append(s)
    path.write_text(original)
    idx.refresh()
    return {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
            "files_changed": [s.files_changed for s in stats], "chunks_embedded": [s.chunks_embedded for s in stats]}


def bench_baseline(work: Path, queries: list[dict], idx, cfg, model_s: float) -> dict:
    """Brute force over the same vectors: embed query, dot product, top k (see the docstring)."""
    from etude.search.chunking import chunk_file
    from etude.search.index import embed_text, scan

    t = time.perf_counter()
    texts = [embed_text(c, cfg.embed_chars) for rel in scan(work, cfg.max_file_bytes, cfg.suffixes)
             for c in chunk_file(rel, (work / rel).read_bytes())]
    chunk_s = time.perf_counter() - t
    from etude.search.view import Block

    st = Block.build(idx.files, idx.embedder.dim)  # every chunk, freshly stacked
    assert len(texts) == st.vecs.shape[0], "baseline chunks differ from the index's"
    vecs = st.vecs
    lat, ranked = [], []
    for q in queries:
        for _ in range(3):
            t = time.perf_counter()
            qv = idx.embedder.embed([q["query"]], query=True)[0]
            scores = np.einsum("ij,j->i", vecs, qv)  # the same product the index uses (see view.py)
            top = np.argpartition(-scores, 10)[:10]
            top = top[np.argsort(-scores[top])]
            lat.append(time.perf_counter() - t)
        ranked.append([(st.paths[i], st.symbols[i]) for i in top.tolist()])
    full = chunk_s + model_s
    out = {"full_index_s": round(full, 2), "chunking_s": round(chunk_s, 2), "model_s": round(model_s, 2),
           "incremental": {"median_s": round(full, 2), "note": "no per-file state: an edit re-embeds every chunk"},
           "query_latency": ms(lat)}
    out.update(recall(ranked, queries))
    return out


def ablation(idx, queries: list[dict]) -> dict:
    """recall@5 of the same index under other ranking weights (query vectors computed once)."""
    from dataclasses import replace

    from etude.search.rank import rank

    view = idx.view()
    qvecs = [idx.embedder.embed([q["query"]], query=True)[0] for q in queries]
    base = idx.config.rank
    variants = {"default": base, "no_pin": replace(base, pin=0.0), "embedding_only": replace(base, lexical_weight=0.0, pin=0.0)}
    for w in (0.1, 0.2, 0.5, 1.0):
        variants[f"lexical_weight={w}"] = replace(base, lexical_weight=w)
    variants["bm25_only"] = replace(base, semantic_weight=0.0, lexical_weight=1.0)
    out = {}
    for name, cfg in variants.items():
        ranked = [[(h.path, h.symbol) for h in rank(q["query"], qv, view, 10, cfg)] for q, qv in zip(queries, qvecs, strict=True)]
        r = recall(ranked, queries)
        out[name] = {k: r[k] for k in ("recall@1", "recall@5", "recall@10", "mrr@10")}
    return out


def vector_search_cost(vecs: np.ndarray) -> dict:
    """Exact top-10 by numpy alone (the part a vector library would replace): einsum, which the
    index uses, and the BLAS product `@` beside it."""
    q = vecs[0].copy()
    einsum = [timed(lambda: np.argpartition(-np.einsum("ij,j->i", vecs, q), 10)[:10]) for _ in range(50)]
    blas = [timed(lambda: np.argpartition(-(vecs @ q), 10)[:10]) for _ in range(50)]
    return {"chunks": int(vecs.shape[0]), "dim": int(vecs.shape[1]), "einsum": ms(einsum), "blas_matmul": ms(blas)}


def timed(fn) -> float:
    return timed_value(fn)[0]


def timed_value(fn):
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


def machine() -> dict:
    import sentence_transformers
    import torch

    return {"python": platform.python_version(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
            "ETUDE_SEARCH_THREADS": os.environ.get("ETUDE_SEARCH_THREADS"),
            "sentence_transformers": sentence_transformers.__version__, "platform": platform.platform()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="minilm", help="embedder spec (minilm, hash, st:DIR, module:factory)")
    ap.add_argument("--queries", default=str(ROOT / "bench/data/semantic_queries.json"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/semantic.json"))
    ap.add_argument("--cache", default=None, help="keep the index cache here (default: a fresh temporary one); "
                    "when it is not empty the full-index figures measure a warm cache and say so")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = fetch_sources()
    labelled = json.loads(Path(args.queries).read_text())
    queries = labelled["queries"]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="etude-bench-semantic-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(src, work)
        cache = Path(args.cache) if args.cache else Path(tmp) / "cache"
        warm = cache.is_dir() and any(cache.iterdir())
        os.environ["ETUDE_CACHE"] = str(cache)  # cold unless --cache names a used one
        result = run(work, queries, args.embedder)
        result["cache_warm"] = warm
    result.update({"package": f"{PACKAGE}=={VERSION}", "sha256": SHA256, "queries": len(queries)})
    result["machine"].update(loadavg_start=load_start, loadavg_end=os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary(result), indent=2))


def run(work: Path, queries: list[dict], embedder: str) -> dict:
    from etude.search import SearchConfig, get_embedder

    cfg = SearchConfig(embedder=embedder, suffixes=(".py",), progress=True)
    emb = get_embedder(embedder)
    timer = TimedEmbedder(emb)
    emb.embed = timer  # instance attribute: the index calls through it
    n_py = sum(1 for _ in work.rglob("*.py"))
    ours, idx = bench_ours(work, queries, cfg, timer)
    base = bench_baseline(work, queries, idx, cfg, timer.chunk_s)
    return {"python_files": n_py, "embedder": emb.id, "ours": ours, "baseline": base,
            "ablation_recall": ablation(idx, queries),
            "vector_search": vector_search_cost(idx.view().main.vecs), "machine": machine(),
            "ratios": {"recall@5_ours_over_baseline": _ratio(ours["recall@5"], base["recall@5"]),
                       "incremental_baseline_over_ours": _ratio(base["incremental"]["median_s"], ours["incremental"]["median_s"]),
                       "query_p95_ours_over_baseline": _ratio(ours["query_latency"]["p95_ms"], base["query_latency"]["p95_ms"])}}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def summary(r: dict) -> dict:
    o, b = r["ours"], r["baseline"]
    keys = ("full_index_s", "recall@5", "recall@1", "mrr@10")
    return {"files": r["python_files"], "chunks": o["index"]["chunks"], "embedder": r["embedder"],
            "ours": {**{k: o[k] for k in keys}, "incremental_s": o["incremental"]["median_s"],
                     "query_p50_ms": o["query_latency"]["p50_ms"], "query_p95_ms": o["query_latency"]["p95_ms"],
                     "tool_call_p95_ms": o["tool_call_latency"]["p95_ms"]},
            "baseline": {**{k: b[k] for k in keys}, "incremental_s": b["incremental"]["median_s"],
                         "query_p50_ms": b["query_latency"]["p50_ms"], "query_p95_ms": b["query_latency"]["p95_ms"]},
            "ratios": r["ratios"]}


if __name__ == "__main__":
    main()
