"""Starting the server: open the store, make sure the served model is registered, run uvicorn.

One process, one event loop, one batcher thread per loaded checkpoint. Not guaranteed: graceful
draining on SIGTERM beyond what uvicorn does (in-flight requests finish, queued ones may not);
durability never depends on it (a record is committed before its response is sent).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from etude.errors import EtudeError
from etude.policy import check_backend
from etude.scale.lowp import check_precision
from etude.serve import registry
from etude.serve.config import ServeConfig
from etude.serve.pool import Loader, PolicyPool, VLLMLoader, load_local
from etude.store.sql import SQLStore, open_store


def ensure_model(store: SQLStore, cfg: ServeConfig) -> registry.Checkpoint:
    """Register `cfg.model` (shared) if its name is new; make it production if there is none."""
    name = cfg.checkpoint_name()
    try:
        cp = registry.get_checkpoint(store, name)
    except EtudeError:
        cp = registry.register_checkpoint(store, name, cfg.model, version=cfg.version)
    if cp.path != cfg.model and cp.path != str(cfg.model):
        raise EtudeError(f"checkpoint {name!r} is registered with path {cp.path!r}, not {cfg.model!r}: pass --name")
    if registry.production(store, None) is None and cp.org_id is None and cp.state != "retired":
        cp = registry.promote(store, name, "served by `etude serve`")
    return cp


def _check_model(model: str) -> None:
    from pathlib import Path

    if model.lower() in ("tiny", "smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return
    p = Path(model).expanduser()
    if not p.is_dir():
        raise EtudeError(f"no model directory at {model!r} (use 'tiny', 'smollm2' or a checkpoint directory)")
    if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        raise EtudeError(f"{model!r} holds neither a model (config.json) nor a LoRA adapter (adapter_config.json)")


def build_app(cfg: ServeConfig, store: SQLStore | None = None, loader: Loader | None = None) -> Any:
    """The app; `loader` defaults to the one for `cfg.backend` (LocalPolicy, or shared vLLM engines)."""
    # NOTE: lazy on purpose: etude.serve.app imports fastapi, and `import etude.serve` (every
    # `etude --help`, `etude keys`/`registry`, the loop) must not pay for it (+183 modules).
    from etude.serve.app import create_app

    if loader is None:
        loader = (VLLMLoader(dtype=cfg.vllm_dtype, max_lora_rank=cfg.vllm_max_lora_rank)
                  if cfg.backend == "vllm" else functools.partial(load_local, precision=cfg.precision))
    store = store or open_store(cfg.db)
    ensure_model(store, cfg)
    pool = PolicyPool(loader, max_loaded=cfg.max_loaded, max_batch=cfg.max_batch, wait_ms=cfg.batch_wait_ms,
                      max_wait_ms=cfg.batch_max_wait_ms)
    return create_app(cfg, store, pool)


def serve(cfg: ServeConfig) -> None:
    """Run until interrupted (blocking)."""
    import uvicorn

    check_backend(cfg.backend)  # --backend vllm without vLLM: one line naming `make setup-vllm`
    check_precision(cfg.precision, what="serve precision")  # fp8 without FP8 tensor cores: one line
    if cfg.backend == "vllm" and cfg.precision != "fp32":
        raise EtudeError("--precision applies to the hf backend; the vllm backend takes vllm_dtype")
    _check_model(cfg.model)
    if cfg.torch_threads:
        import torch

        torch.set_num_threads(cfg.torch_threads)
    app = build_app(cfg)
    prod = registry.production(app.state.store, None)
    if cfg.preload and prod is not None:  # load before listening: a bad checkpoint is one clear error
        app.state.pool.get(prod)
    print(f"etude: serving {cfg.checkpoint_name()} on http://{cfg.host}:{cfg.port}/v1 (store {app.state.store.url})",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning", access_log=False, timeout_graceful_shutdown=5)
