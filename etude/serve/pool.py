"""Loaded checkpoints: one policy + batcher per checkpoint name, least-recently-used evicted.

A policy that batches by itself (`protocols.SubmitPolicy`: the vLLM backend's engines, which
batch continuously) gets an `EngineQueue` instead of a Batcher: every request goes to the
engine as it arrives, with no `max_batch` cap (see EngineQueue for why).

The loader is injectable so unit tests serve a scripted fake; the default loads
`LocalPolicy.from_pretrained(checkpoint.path)` and stamps it with the registry's name and
version, so every logged interaction names the checkpoint that really answered.
Loading happens once per name (concurrent first requests wait for the same load). Before a
load, an adapter's files are checked against the digest registered with it
(`registry.check_files`): a name never serves weights other than those it was registered with.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.policy.batcher import Batcher, EngineQueue
from etude.policy.local import LocalPolicy
from etude.policy.models import load_model, resolve
from etude.policy.vllm_backend import VLLMPolicy
from etude.protocols import SubmitPolicy
from etude.scale.lowp import apply_serving_precision
from etude.serve.registry import Checkpoint, check_files

Loader = Callable[[Checkpoint], Any]


def load_local(cp: Checkpoint, precision: str = "fp32") -> Any:
    """A model directory / "tiny" / "smollm2" through LocalPolicy; a LoRA adapter directory
    (peft's adapter_config.json) on top of its base, merged for serving speed. The base is
    `cp.meta["base"]`, else the adapter config's `base_model_name_or_path`. A `precision` other
    than fp32 (ServeConfig.precision) is applied after loading (etude.scale.lowp)."""
    if (Path(cp.path) / "adapter_config.json").is_file():
        pol = LocalPolicy(*_load_adapter(cp), id=cp.name)
    else:
        pol = LocalPolicy.from_pretrained(cp.path, id=cp.name)
    if precision != "fp32":
        pol.model = apply_serving_precision(pol.model, precision)
    pol.version = cp.version
    return pol


class VLLMLoader:
    """The loader for `etude serve --backend vllm`: one VLLMPolicy engine per base model, shared
    by every checkpoint on that base. A model directory is served by its own engine; a LoRA
    adapter checkpoint (an org's, say) is registered on its base's engine under the checkpoint's
    name and hot-loaded by vLLM on first use, so many adapters cost one engine. Each checkpoint
    gets a view with its own name and version, so the store records which one answered.
    New checkpoints (a candidate's adapter or weights) are loaded while the server serves: no
    restart. `release(name)` (the pool calls it when it unloads a checkpoint) closes an engine
    that no loaded checkpoint uses any more, so replaced full-weight checkpoints do not pile up."""

    def __init__(self, **engine_kw: Any):
        self.engine_kw = engine_kw
        self.engines: dict[str, Any] = {}
        self._users: dict[str, set[str]] = {}  # engine key -> names of the loaded checkpoints on it
        self._lock = threading.Lock()

    def _engine(self, base: str, user: str) -> Any:
        key = str(resolve(base))
        with self._lock:
            if key not in self.engines:
                self.engines[key] = VLLMPolicy(key, id=Path(key).name, enable_lora=True, **self.engine_kw)
            self._users.setdefault(key, set()).add(user)
            return self.engines[key]

    def __call__(self, cp: Checkpoint) -> Any:
        if (Path(cp.path) / "adapter_config.json").is_file():
            engine = self._engine(str(_adapter_base(cp)), cp.name)
            engine.add_adapter(cp.name, cp.path)
            return engine.view(cp.name, version=cp.version, adapter=cp.name)
        return self._engine(cp.path, cp.name).view(cp.name, version=cp.version)

    def release(self, name: str) -> None:
        with self._lock:
            idle = []
            for key, users in self._users.items():
                users.discard(name)
                if not users and key in self.engines:
                    idle.append(self.engines.pop(key))
            self._users = {k: u for k, u in self._users.items() if u}
        for e in idle:
            e.close()

    def close(self) -> None:
        with self._lock:
            engines, self.engines, self._users = list(self.engines.values()), {}, {}
        for e in engines:
            e.close()


def _adapter_base(cp: Checkpoint) -> str:
    path = Path(cp.path)
    try:
        return cp.meta.get("base") or json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as e:
        raise EtudeError(f"adapter {cp.name}: cannot tell its base model ({e}); register it with meta.base") from e


def _load_adapter(cp: Checkpoint) -> tuple[Any, Any]:
    from peft import PeftModel

    path = Path(cp.path)
    model, tok = load_model(str(_adapter_base(cp)))
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    merged.eval()
    return merged, tok


class PolicyPool:
    def __init__(self, loader: Loader = load_local, *, max_loaded: int = 3, max_batch: int = 16, wait_ms: float = 5.0,
                 max_wait_ms: float = 50.0):
        self.loader = loader
        self.max_loaded = max_loaded
        self.max_batch = max_batch  # the Batcher's cap; an EngineQueue has none
        self.wait_ms = wait_ms
        self.max_wait_ms = max_wait_ms
        self._loaded: OrderedDict[str, Batcher | EngineQueue] = OrderedDict()
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}

    def get(self, cp: Checkpoint) -> Batcher | EngineQueue:
        with self._lock:
            if cp.name in self._loaded:
                self._loaded.move_to_end(cp.name)
                return self._loaded[cp.name]
            name_lock = self._loading.setdefault(cp.name, threading.Lock())
        with name_lock:  # one load per name; later arrivals find it loaded
            with self._lock:
                if cp.name in self._loaded:
                    return self._loaded[cp.name]
            check_files(cp)
            policy = self.loader(cp)
            queue = (EngineQueue(policy) if isinstance(policy, SubmitPolicy)
                     else Batcher(policy, max_batch=self.max_batch, wait_ms=self.wait_ms, max_wait_ms=self.max_wait_ms))
            with self._lock:
                self._loaded[cp.name] = queue
                evicted = [self._loaded.popitem(last=False) for _ in range(len(self._loaded) - self.max_loaded)]
        for name, b in evicted:
            self._unload(name, b)
        return queue

    def _unload(self, name: str, b: Batcher | EngineQueue) -> None:
        b.close()
        release = getattr(self.loader, "release", None)
        if callable(release):
            release(name)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per loaded checkpoint: batches, jobs, the largest batch and the mean one. For a
        checkpoint on an engine that batches by itself (kind "engine"), batches are the engine's
        steps, max_batch the most of its requests in flight at once and mean_batch the mean
        number of requests per engine step (engine-wide)."""
        with self._lock:
            items = list(self._loaded.items())
        out = {}
        for n, b in items:
            st = b.stats
            out[n] = {"kind": "engine" if isinstance(b, EngineQueue) else "batcher", "batches": st.batches,
                      "jobs": st.jobs, "seqs": st.seqs, "max_batch": st.max_batch_seen,
                      "mean_batch": round(st.seqs / st.batches, 2) if st.batches else 0.0}
        return out

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._loaded)

    def close(self) -> None:
        """Close every queue (the loader's engines stay: whoever built the loader closes it)."""
        with self._lock:
            batchers, self._loaded = list(self._loaded.values()), OrderedDict()
        for b in batchers:
            b.close()
