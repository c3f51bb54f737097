"""Policy backends by name. `make_policy(spec, **kw)` imports the backend only when asked for, so
`import etude.policy` stays cheap and the core never imports torch unless a local model is used.

    make_policy("scripted", outputs=[...])                       # etude.policy.scripted.ScriptedPolicy
    make_policy("openai", base_url=URL, model=NAME)              # etude.policy.openai_http.OpenAIPolicy
    make_policy("smollm2") / make_policy("tiny") / make_policy("local", model=PATH)
                                                                 # etude.policy.local.LocalPolicy
    make_policy("vllm", model="smollm2" | "tiny" | PATH)         # etude.policy.vllm_backend.VLLMPolicy
                                                                 # (needs .venv-vllm: make setup-vllm)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from etude.errors import EtudeError
from etude.policy.openai_http import OpenAIPolicy
from etude.policy.scripted import ScriptedPolicy
from etude.protocols import Policy


def _scripted(spec: str, **kw: Any) -> Policy:
    if "outputs" not in kw and "path" in kw:
        return ScriptedPolicy.from_file(kw.pop("path"), **kw)
    return ScriptedPolicy(kw.pop("outputs", []), **kw)


def _openai(spec: str, **kw: Any) -> Policy:
    return OpenAIPolicy(**kw)


def _local(spec: str, **kw: Any) -> Policy:
    try:
        local = importlib.import_module("etude.policy.local")
    except ModuleNotFoundError as e:
        raise EtudeError(f"the local model backend is not available ({e}); use --base-url/--model or --policy scripted") from e
    name = kw.pop("model", None) or ("smollm2" if spec == "local" else spec)
    return local.LocalPolicy.from_pretrained(name, **kw)


def _vllm(spec: str, **kw: Any) -> Policy:
    # NOTE: lazy: etude.policy.vllm_backend imports etude.policy.local (and so torch's model code);
    # `import etude.policy` must stay cheap (tests/harness/test_policies.py checks it).
    from etude.policy.vllm_backend import VLLMPolicy, require_vllm

    require_vllm()  # one line naming the fix, before anything is loaded
    return VLLMPolicy(kw.pop("model", None) or "smollm2", **kw)


BACKENDS = ("hf", "vllm")
"""Engines a local model can run on: "hf" (transformers, LocalPolicy) or "vllm" (VLLMPolicy)."""


def check_backend(backend: str) -> None:
    """EtudeError (exit 2) for an unknown backend, or "vllm" where vLLM is not installed."""
    if backend not in BACKENDS:
        raise EtudeError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend == "vllm":
        from etude.policy.vllm_backend import require_vllm  # NOTE: lazy, see _vllm

        require_vllm()


def resolve_backend(backend: str) -> str:
    """"auto" -> "vllm" when vLLM is importable here, else "hf"; "hf" and "vllm" as given (a
    missing vLLM is then one line from `check_backend`)."""
    if backend not in ("auto", "hf", "vllm"):
        raise EtudeError(f"--backend must be auto, hf or vllm, not {backend!r}")
    if backend == "auto":
        return "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    if backend == "vllm":
        check_backend("vllm")
    return backend


POLICIES: dict[str, Callable[..., Policy]] = {
    "scripted": _scripted,
    "openai": _openai,
    "local": _local,
    "smollm2": _local,
    "tiny": _local,
    "vllm": _vllm,
}


def make_policy(spec: str, **kw: Any) -> Policy:
    """The policy registered as `spec` (see POLICIES), built with `kw`."""
    factory = POLICIES.get(spec)
    if factory is None:
        raise EtudeError(f"unknown policy {spec!r}; known: {', '.join(POLICIES)}")
    return factory(spec, **kw)


__all__ = ["BACKENDS", "POLICIES", "check_backend", "make_policy", "resolve_backend"]
