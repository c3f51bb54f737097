"""Model specs for `etude eval --model M`, turned into one policy per episode.

    oracle              applies each task's gold patch through the real harness (write_file calls)
    noop                answers at once and changes nothing
    scripted:FILE       etude.policy.scripted replay of a script file (tests, demos)
    http(s)://URL[#NAME] an OpenAI-compatible server (NAME = served model, or EvalConfig.model_name)
    anything else       a local model: "smollm2", "tiny" or a model directory, on transformers
                        (backend "hf") or on a vLLM engine (backend "vllm", `--backend vllm`)

The baselines are honest episodes, not shortcuts: the oracle's edits go through the tools into
a sandboxed workspace and its diff is graded like any other, so a broken grader or workspace shows
up as an oracle below 100%. What the oracle cannot do: binary patches (their files are skipped,
so such a task will not resolve).
"""

from __future__ import annotations

import shlex
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from etude.errors import EtudeError
from etude.policy import make_policy
from etude.policy.batcher import BatchedPolicy, batchable
from etude.policy.scripted import ScriptedPolicy, load_script
from etude.protocols import Policy
from etude.rewards.diff import parse_diff
from etude.tasks.diffs import apply_patch, changed_paths
from etude.tasks.repo import prepare_repo
from etude.types import Task

PolicyFactory = Callable[[Task, int], Policy]  # (task, sample index) -> a policy for that episode


def patched_files(template: Path, patch: str) -> dict[str, str | None]:
    """Each file a patch touches -> its content after the patch (None: deleted), computed on a
    scratch copy of just those files. Raises EtudeError if the patch does not apply."""
    paths = _all_paths(patch) or changed_paths(patch)
    with tempfile.TemporaryDirectory(prefix="etude-eval-") as tmp:
        root = Path(tmp)
        for rel in paths:
            src = template / rel
            if src.is_file():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, root / rel)
        ok, msg = apply_patch(root, patch, check=False)
        if not ok:
            raise EtudeError(f"patch does not apply to the template: {msg.splitlines()[0] if msg else 'git apply'}")
        return {rel: _read(root / rel) for rel in paths}


def _all_paths(patch: str) -> list[str]:
    return sorted({p for fd in parse_diff(patch) for p in fd.paths})


def _read(p: Path) -> str | None:
    return p.read_text(encoding="utf-8", errors="surrogateescape") if p.is_file() else None


def oracle_outputs(task: Task) -> list[dict[str, Any]]:
    """Scripted native tool calls that make the workspace equal to base + gold patch."""
    calls: list[dict[str, Any]] = []
    for rel, content in patched_files(prepare_repo(task), task.patch).items():
        if content is None:
            calls.append({"name": "run_terminal", "arguments": {"command": f"rm -f -- {shlex.quote(rel)}"}})
        else:
            calls.append({"name": "write_file", "arguments": {"path": rel, "content": content}})
    return [{"text": "Applying the reference fix.", "tool_calls": calls}] if calls else []


def _scripted(outputs: list[Any], pid: str, final: str) -> Policy:
    return ScriptedPolicy(outputs, id=pid, final=final, native_tools=True)


def _shared(policy: Policy) -> PolicyFactory:
    # One model instance for every episode: loading weights per task would dominate the run, and
    # loading it here, before any episode, makes a bad model spec fail at once with one clear line.
    # A local model answers concurrent episodes in batches (one forward for every waiting turn).
    shared = BatchedPolicy(policy) if batchable(policy) else policy
    return lambda task, sample: shared


def policy_factory(spec: str, model_name: str | None = None, backend: str = "hf") -> PolicyFactory:
    """The factory for a model spec (see the module docstring); `backend` ("hf" or "vllm") is the
    engine of a local model."""
    spec = spec.strip()
    if not spec:
        raise EtudeError("--model is empty; give oracle, noop, a model name or path, or a server URL")
    if spec == "oracle":
        return lambda task, k: _scripted(oracle_outputs(task), "oracle", "Applied the reference fix.")
    if spec == "noop":
        return lambda task, k: _scripted([], "noop", "I made no changes.")
    if spec.startswith("scripted:"):
        return _scripted_file(spec.removeprefix("scripted:"))
    if spec.startswith(("http://", "https://")):
        url, _, name = spec.partition("#")
        served = name or model_name
        if not served:
            raise EtudeError("a server URL needs the served model name: URL#NAME or --model-name NAME")
        return _shared(_openai(url, served))
    return _shared(local_policy(spec, backend))


def _scripted_file(path: str) -> PolicyFactory:
    data = load_script(path)  # read once, so a bad file fails before any episode runs
    return lambda task, k: ScriptedPolicy(data["outputs"], id=f"scripted:{Path(path).name}")


def _openai(url: str, name: str) -> Policy:
    return make_policy("openai", base_url=url, model=name)


def local_policy(spec: str, backend: str = "hf") -> Policy:
    """The engine `etude eval` samples a local model with: "smollm2", "tiny" or a model directory
    on transformers in bf16 (backend "hf", on the GPU when there is one) or on vLLM (backend
    "vllm"). A missing directory is an EtudeError."""
    if backend == "vllm":  # one engine for every episode; a missing vLLM is one line (exit 2)
        if ("/" in spec or Path(spec).exists()) and not Path(spec).is_dir():
            raise EtudeError(f"model directory not found: {spec}")
        return make_policy("vllm", model=spec)
    # NOTE: evaluation samples in bf16 (weights cast once): on an AVX-512-bf16 CPU that is about
    # twice fp32's speed, and greedy decisions of a 135M model barely move.
    import torch

    kw: dict[str, Any] = {"dtype": torch.bfloat16, "device": "cuda" if torch.cuda.is_available() else None}
    if spec in ("smollm2", "tiny"):
        return make_policy(spec, **kw)
    if "/" in spec or Path(spec).exists():
        if not Path(spec).is_dir():
            raise EtudeError(f"model directory not found: {spec}")
        return make_policy("local", model=spec, **kw)
    return make_policy("local", model=spec, **kw)
