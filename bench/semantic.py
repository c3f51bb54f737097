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

Writes bench/results/semantic.json and semantic.records.jsonl through
`etude.evals.results.write_result`: per labelled query and system (ours, the baseline, each
ablation variant) the rank of the labelled function and its hits at 1/5/10; per timed call
(index, re-index, refresh, query, tool call, vector search) its seconds or milliseconds.
`bench/verify.py` recomputes the recalls, MRR, percentiles and ratios from them. Nothing here
asserts: it measures and reports. The timings need the machine to itself.

`--repo DIR --queries FILE --edit-file REL` index another tree (no fetch); `--quick` is a smoke run
on etude's own source with the hash embedder and tests/bench/data/semantic_quick.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from etude.evals.results import write_result
from etude.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
QUICK_QUERIES = ROOT / "tests" / "bench" / "data" / "semantic_quick.json"

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


def hits(ranked: list[list[tuple[str, str]]], queries: list[dict], system: str) -> list[dict]:
    """One record per query: the rank of the labelled (path, symbol) in the ranked top 10 (None:
    not there), hits at 1/5/10 (0/1) and the reciprocal rank within 10 (0 when missed)."""
    out = []
    for i, (ranks, q) in enumerate(zip(ranked, queries, strict=True)):
        want = (q["path"], q["symbol"])
        r = ranks.index(want) + 1 if want in ranks[:10] else None
        out.append({"measure": "rank", "system": system, "query": i, "rank": r,
                    **{f"hit{k}": int(r is not None and r <= k) for k in (1, 5, 10)}, "rr10": 1 / r if r else 0.0})
    return out


def bench_ours(work: Path, queries: list[dict], cfg, timer: TimedEmbedder, edit_file: str) -> tuple[list[dict], dict, object]:
    from etude.protocols import ToolContext, ToolsConfig
    from etude.search import open_index
    from etude.tools.semantic_search import TOOL

    t = time.perf_counter()
    idx = open_index(work, config=cfg)
    stats = idx.refresh()
    idx.search("warm up", k=1)  # stacks the matrices, as the first query after indexing does
    recs = [{"measure": "full_index", "system": "ours", "seconds": time.perf_counter() - t, "model_s": timer.chunk_s}]
    info: dict = {"index": stats.to_dict()}
    inc, info["incremental"] = incremental(idx, work, edit_file)
    recs += inc
    recs += [{"measure": "unchanged_refresh", "trial": i, "ms": timed(idx.refresh) * 1000} for i in range(10)]
    ranked = []
    for i, q in enumerate(queries):
        for rep in range(3):
            dt, found = timed_value(lambda q=q: idx.search(q["query"], k=10))
            recs.append({"measure": "query_latency", "system": "ours", "query": i, "rep": rep, "ms": dt * 1000})
        ranked.append([(h.path, h.symbol) for h in found])
    recs += hits(ranked, queries, "ours")
    ctx = ToolContext(workspace=work, config=ToolsConfig(search=cfg))
    recs += [{"measure": "tool_call_latency", "query": i, "ms": timed(lambda q=q: TOOL.run({"query": q["query"], "k": 10},
                                                                                        ctx)) * 1000}
             for i, q in enumerate(queries)]
    info["index_bytes"] = sum(p.stat().st_size for p in Path(os.environ["ETUDE_CACHE"]).rglob("*") if p.is_file())
    return recs, info, idx


def incremental(idx, work: Path, edit_file: str) -> tuple[list[dict], dict]:
    """Five edits to one file, each followed by refresh + the re-stack the next query needs."""
    path = work / edit_file
    original = path.read_text()
    recs, stats = [], []
    for i in range(5):
        path.write_text(original + f"\n\ndef bench_edit_{i}(value):\n    \"\"\"Edit number {i}.\"\"\"\n    return value + {i}\n")
        t = time.perf_counter()
        s = idx.refresh()
        idx.search("bench edit", k=1)
        recs.append({"measure": "incremental", "system": "ours", "edit": i, "seconds": time.perf_counter() - t})
        stats.append(s)
    path.write_text(original)
    idx.refresh()
    return recs, {"file": edit_file, "files_changed": [s.files_changed for s in stats],
                  "chunks_embedded": [s.chunks_embedded for s in stats]}


def bench_baseline(work: Path, queries: list[dict], idx, cfg, model_s: float) -> list[dict]:
    """Brute force over the same vectors: embed query, dot product, top k (see the docstring)."""
    from etude.search.chunking import chunk_file
    from etude.search.index import embed_text, scan
    from etude.search.view import Block

    t = time.perf_counter()
    texts = [embed_text(c, cfg.embed_chars) for rel in scan(work, cfg.max_file_bytes, cfg.suffixes)
             for c in chunk_file(rel, (work / rel).read_bytes())]
    chunk_s = time.perf_counter() - t
    st = Block.build(idx.files, idx.embedder.dim)  # every chunk, freshly stacked
    assert len(texts) == st.vecs.shape[0], "baseline chunks differ from the index's"
    vecs = st.vecs
    # its full index = its own chunking + the model time our run spent on the same texts; with no
    # per-file state an edit re-embeds everything, so its re-index after an edit is the same figure
    recs = [{"measure": m, "system": "baseline", "seconds": chunk_s + model_s, "chunking_s": chunk_s,
             "model_s": model_s} for m in ("full_index", "incremental")]
    ranked = []
    for i, q in enumerate(queries):
        for rep in range(3):
            t = time.perf_counter()
            qv = idx.embedder.embed([q["query"]], query=True)[0]
            scores = np.einsum("ij,j->i", vecs, qv)  # the same product the index uses (see view.py)
            k = min(10, len(scores) - 1)
            top = np.argpartition(-scores, k)[:10]
            top = top[np.argsort(-scores[top])]
            recs.append({"measure": "query_latency", "system": "baseline", "query": i, "rep": rep,
                         "ms": (time.perf_counter() - t) * 1000})
        ranked.append([(st.paths[j], st.symbols[j]) for j in top.tolist()])
    return recs + hits(ranked, queries, "baseline")


def ablation(idx, queries: list[dict]) -> tuple[list[dict], list[str]]:
    """Ranks of the same index under other ranking weights (query vectors computed once)."""
    from dataclasses import replace

    from etude.search.rank import rank

    view = idx.view()
    qvecs = [idx.embedder.embed([q["query"]], query=True)[0] for q in queries]
    base = idx.config.rank
    variants = {"default": base, "no_pin": replace(base, pin=0.0), "embedding_only": replace(base, lexical_weight=0.0, pin=0.0)}
    for w in (0.1, 0.2, 0.5, 1.0):
        variants[f"lexical_weight={w}"] = replace(base, lexical_weight=w)
    variants["bm25_only"] = replace(base, semantic_weight=0.0, lexical_weight=1.0)
    recs = []
    for name, cfg in variants.items():
        ranked = [[(h.path, h.symbol) for h in rank(q["query"], qv, view, 10, cfg)] for q, qv in zip(queries, qvecs, strict=True)]
        recs += hits(ranked, queries, f"ablation:{name}")
    return recs, list(variants)


def vector_search_cost(vecs: np.ndarray) -> list[dict]:
    """Exact top-10 by numpy alone (the part a vector library would replace): einsum, which the
    index uses, and the BLAS product `@` beside it."""
    q = vecs[0].copy()
    k = min(10, vecs.shape[0] - 1)
    recs = [{"measure": "vector_search", "method": "einsum", "trial": i,
             "ms": timed(lambda: np.argpartition(-np.einsum("ij,j->i", vecs, q), k)[:10]) * 1000} for i in range(50)]
    recs += [{"measure": "vector_search", "method": "blas_matmul", "trial": i,
              "ms": timed(lambda: np.argpartition(-(vecs @ q), k)[:10]) * 1000} for i in range(50)]
    return recs


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


def figures(variants: list[str]) -> dict[str, dict]:
    figs: dict[str, dict] = {}

    def q(sel: dict, field: str, at: float) -> dict:
        return {"kind": "quantile", "of": sel, "field": field, "q": at}

    for system in ("ours", "baseline"):
        at = {"measure": "rank", "system": system}
        for k in (1, 5, 10):
            figs[f"{system}.recall@{k}"] = {"kind": "rate", "of": at, "field": f"hit{k}"}
        figs[f"{system}.mrr@10"] = {"kind": "mean", "of": at, "field": "rr10"}
        figs[f"{system}.full_index_s"] = q({"measure": "full_index", "system": system}, "seconds", 0.5)
        figs[f"{system}.incremental_median_s"] = q({"measure": "incremental", "system": system}, "seconds", 0.5)
        for name, p in (("p50", 0.5), ("p95", 0.95)):
            figs[f"{system}.query_{name}_ms"] = q({"measure": "query_latency", "system": system}, "ms", p)
    figs["ours.incremental_max_s"] = q({"measure": "incremental", "system": "ours"}, "seconds", 1.0)
    for name, p in (("p50", 0.5), ("p95", 0.95)):
        figs[f"ours.unchanged_refresh_{name}_ms"] = q({"measure": "unchanged_refresh"}, "ms", p)
        figs[f"ours.tool_call_{name}_ms"] = q({"measure": "tool_call_latency"}, "ms", p)
        for method in ("einsum", "blas_matmul"):
            figs[f"vector_search.{method}_{name}_ms"] = q({"measure": "vector_search", "method": method}, "ms", p)
    figs["recall@5_ours_over_baseline"] = {"kind": "ratio", "num": {"measure": "rank", "system": "ours"},
                                           "den": {"measure": "rank", "system": "baseline"}, "field": "hit5"}
    figs["incremental_baseline_over_ours"] = {"kind": "ratio", "num": {"measure": "incremental", "system": "baseline"},
                                              "den": {"measure": "incremental", "system": "ours"}, "field": "seconds",
                                              "stat": "median"}
    figs["query_p95_ours_over_baseline"] = {"kind": "ratio", "num": {"measure": "query_latency", "system": "ours"},
                                            "den": {"measure": "query_latency", "system": "baseline"}, "field": "ms",
                                            "stat": "p95"}
    for v in variants:
        at = {"measure": "rank", "system": f"ablation:{v}"}
        for k in (1, 5, 10):
            figs[f"ablation.{v}.recall@{k}"] = {"kind": "rate", "of": at, "field": f"hit{k}"}
        figs[f"ablation.{v}.mrr@10"] = {"kind": "mean", "of": at, "field": "rr10"}
    return figs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--embedder", default="minilm", help="embedder spec (minilm, hash, st:DIR, module:factory)")
    ap.add_argument("--queries", default=str(ROOT / "bench/data/semantic_queries.json"))
    ap.add_argument("--repo", default=None, help="index this tree instead of the ansible-core sdist (no fetch)")
    ap.add_argument("--edit-file", default=EDIT_FILE, help="the file (relative to the tree) the re-index edits")
    ap.add_argument("--quick", action="store_true", help="smoke run: etude's own source, the hash embedder, "
                    "tests/bench/data/semantic_quick.json")
    ap.add_argument("--out", default=str(ROOT / "bench/results/semantic.json"))
    ap.add_argument("--cache", default=None, help="keep the index cache here (default: a fresh temporary one); "
                    "when it is not empty the full-index figures measure a warm cache and say so")
    args = ap.parse_args(argv)
    if args.quick:
        args.embedder, args.queries = "hash", str(QUICK_QUERIES)
        args.repo, args.edit_file = args.repo or str(ROOT / "etude"), "sandbox/process.py"
    started = time.time()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    src = Path(args.repo) if args.repo else fetch_sources()
    labelled = json.loads(Path(args.queries).read_text())
    queries = labelled["queries"]
    load_start = os.getloadavg()
    old_cache = os.environ.get("ETUDE_CACHE")
    try:
        with tempfile.TemporaryDirectory(prefix="etude-bench-semantic-") as tmp:
            work = Path(tmp) / "repo"
            shutil.copytree(src, work, ignore=shutil.ignore_patterns("__pycache__"))
            cache = Path(args.cache) if args.cache else Path(tmp) / "cache"
            warm = cache.is_dir() and any(cache.iterdir())
            os.environ["ETUDE_CACHE"] = str(cache)  # cold unless --cache names a used one
            records, meta = run(work, queries, args.embedder, args.edit_file)
    finally:
        if old_cache is None:
            os.environ.pop("ETUDE_CACHE", None)
        else:
            os.environ["ETUDE_CACHE"] = old_cache
    meta.update(cache_warm=warm, repo=str(src) if args.repo else f"{PACKAGE}=={VERSION}",
                sha256=None if args.repo else SHA256, queries=len(queries), queries_file=str(args.queries))
    meta["machine"].update(loadavg_start=load_start, loadavg_end=os.getloadavg())
    prov = provenance(started=started, argv=["bench/semantic.py", *(sys.argv[1:] if argv is None else argv)])
    doc = write_result(Path(args.out), figures(meta["ablation_variants"]), records, prov, meta=meta)
    print(json.dumps(summary(doc["figures"], meta), indent=2))


def run(work: Path, queries: list[dict], embedder: str, edit_file: str) -> tuple[list[dict], dict]:
    from etude.search import SearchConfig, get_embedder

    cfg = SearchConfig(embedder=embedder, suffixes=(".py",), progress=True)
    emb = get_embedder(embedder)
    timer = TimedEmbedder(emb)
    emb.embed = timer  # instance attribute: the index calls through it
    n_py = sum(1 for _ in work.rglob("*.py"))
    records, info, idx = bench_ours(work, queries, cfg, timer, edit_file)
    records += bench_baseline(work, queries, idx, cfg, timer.chunk_s)
    abl, variants = ablation(idx, queries)
    records += abl
    vecs = idx.view().main.vecs
    records += vector_search_cost(vecs)
    meta = {"python_files": n_py, "embedder": emb.id, "ours": info, "ablation_variants": variants,
            "vector_search": {"chunks": int(vecs.shape[0]), "dim": int(vecs.shape[1])}, "machine": machine(),
            "misses@5": {s: [q["query"] for r, q in zip([r for r in records if r["measure"] == "rank" and
                                                          r["system"] == s], queries, strict=True) if not r["hit5"]]
                         for s in ("ours", "baseline")}}
    return records, meta


def summary(f: dict, meta: dict) -> dict:
    def v(name: str):
        x = f[name]
        return x.get("rate", x.get("mean", x.get("value")))

    keys = ("full_index_s", "recall@5", "recall@1", "mrr@10", "incremental_median_s", "query_p50_ms", "query_p95_ms")
    return {"files": meta["python_files"], "chunks": meta["ours"]["index"]["chunks"], "embedder": meta["embedder"],
            **{s: {k: v(f"{s}.{k}") for k in keys} for s in ("ours", "baseline")},
            "ratios": {k: f[k]["value"] for k in ("recall@5_ours_over_baseline", "incremental_baseline_over_ours",
                                                  "query_p95_ours_over_baseline")}}


if __name__ == "__main__":
    main()
